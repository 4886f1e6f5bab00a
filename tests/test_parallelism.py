"""Parallel layouts in serving: pipelined pipeline parallelism (issue 11)."""

from __future__ import annotations

import pytest

import calculator as pc
from calculator.serving.base import Pool, PoolModel
from calculator.serving.disaggregated import prefill_capacity
from calculator.serving.workload import Workload
from hardware_db.loader import load_model

W = Workload(rate=1.0, isl=2000, osl=200)


def _prefill_pool(pp: int, pipelined: bool = True) -> PoolModel:
    return PoolModel.build(load_model("llama-3.1-405b"), Pool(gpu="h200-sxm", tp=8, pp=pp, pipelined=pipelined,
                                                              max_batch=4096), W)


def test_a_pipelined_pp2_prefill_instance_takes_twice_the_prompts():
    """405B on H200 tp8 pp2, isl 2000: with one prompt per stage in flight the instance sustains
    twice the prompt rate of one that lets a prompt cross both stages before the next starts."""
    seq, pipe = _prefill_pool(2, pipelined=False), _prefill_pool(2)
    one_at_a_time = prefill_capacity(seq, W, 8192) * seq.pool.streams
    pipelined = prefill_capacity(pipe, W, 8192) * pipe.pool.streams
    assert pipelined / one_at_a_time == pytest.approx(2.0, rel=1e-9)
    decode = Pool(gpu="h200-sxm", tp=8, pp=2, instances=20)
    rate = 1.8 * one_at_a_time
    for pipelined_flag, stable in ((False, False), (True, True)):
        d = pc.Deployment(mode="disaggregated", prefill=Pool(gpu="h200-sxm", tp=8, pp=2, pipelined=pipelined_flag),
                          decode=decode)
        e = pc.evaluate("llama-3.1-405b", d, W.model_copy(update={"rate": rate}))
        assert e.stable is stable, e.reason


def test_pp2_and_pp1_throughput_per_gpu_agree_at_their_memory_limited_batches():
    """Per GPU, pipelining neither gains nor loses much: prefill within 2%, decode within 15% (pp2
    has more memory per GPU for KV, so a larger batch)."""
    out = {}
    for pp in (1, 2):
        pm = _prefill_pool(pp)
        b = pm.batch_limit(W)
        decode = pm.pool.streams * b / float(pm.decode_s(b, W.isl.mean + W.osl.mean / 2)) / pm.pool.num_gpus
        prefill = prefill_capacity(pm, W, 8192) * pm.pool.streams / pm.pool.num_gpus
        out[pp] = (prefill, decode)
    assert out[2][0] / out[1][0] == pytest.approx(1.0, abs=0.02)
    assert out[2][1] / out[1][1] == pytest.approx(1.0, abs=0.15)


def test_one_request_cannot_fill_the_pipeline():
    """Bubbles: at a trickle of traffic each stream holds at most one request, so a lone request sees
    the whole model's step time (pipelining does not shorten it) and TTFT/TPOT match the unpipelined
    instance's."""
    slow = Workload(rate=0.01, isl=2000, osl=200)
    out = []
    for pipelined in (False, True):
        d = pc.Deployment(mode="mixed", pool=Pool(gpu="h200-sxm", tp=8, pp=2, pipelined=pipelined))
        out.append(pc.evaluate("llama-3.1-405b", d, slow))
    assert out[1].ttft_mean_s == pytest.approx(out[0].ttft_mean_s, rel=0.02)
    assert out[1].tpot_mean_s == pytest.approx(out[0].tpot_mean_s, rel=0.02)


def test_a_pipelined_instance_splits_its_kv_and_batch_cap_over_its_streams():
    seq, pipe = _prefill_pool(2, pipelined=False), _prefill_pool(2)
    assert pipe.kv_budget_bytes == pytest.approx(seq.kv_budget_bytes / 2)
    assert pipe.kv_limit(W) == pytest.approx(seq.kv_limit(W) / 2)
    capped = PoolModel.build(load_model("llama-3.1-405b"), Pool(gpu="h200-sxm", tp=8, pp=2, max_batch=64), W)
    assert capped.batch_cap == 32
    assert Pool(gpu="h200-sxm", tp=8, pp=4, instances=3).engines == 12


def test_the_simulation_runs_one_stream_of_a_pipelined_instance():
    """The oracle simulates one engine at rate / (instances x pp) and agrees with the closed form."""
    w = Workload(rate=3.0, isl=2000, osl=100)
    d = pc.Deployment(mode="mixed", pool=Pool(gpu="h200-sxm", tp=8, pp=2, instances=2))
    e = pc.evaluate("llama-3.1-405b", d, w)
    sim = pc.simulate("llama-3.1-405b", d, w, requests=1500, seed=3)
    assert sim.stable and e.stable
    assert e.tpot_s(50) == pytest.approx(sim.tpot_by_percentile_s[50], rel=0.2)
    assert e.ttft_s(90) == pytest.approx(sim.ttft_by_percentile_s[90], rel=0.3)
