"""Serving model v2: one regression test per defect of issue 10, with its figures (direction and size)."""

import numpy as np
import pytest

import calculator as pc
from calculator.serving import analyse
from calculator.serving.base import PoolModel
from calculator.serving.disaggregated import prefill_batch
from calculator.serving.simulate import Requests, run_deployment, run_engine

OPT = pc.load_model("opt-13b")


def _p90(d, w, model=OPT):
    pools = tuple(PoolModel.build(model, p, w) for p in d.pools)
    a = analyse(model, d, w, np.array([w.rate]), 0.9, pools)
    return a, run_deployment(model, d, w, pools, 2000)


def test_prefill_first_tpot_tail_follows_the_stall_clusters():
    # OPT-13B on one A100 at 6 req/s: v1 said p90 TPOT 39.0 ms; the simulation sees ~47 ms
    d = pc.Deployment(mode="mixed", pool=pc.Pool(gpu="a100-sxm-80gb"), scheduler="prefill_first")
    a, trace = _p90(d, pc.Workload(rate=6, isl=512, osl=64))
    assert 0.044 <= a.tpot_p_s[0] <= 0.05
    assert a.tpot_p_s[0] == pytest.approx(trace.tpot_p(90), rel=0.1)
    assert a.ttft_p_s[0] == pytest.approx(trace.ttft_p(90), rel=0.1)


def test_hybrid_steps_stall_decodes_less_than_prefill_first():
    w = pc.Workload(rate=6, isl=512, osl=64)
    hybrid, trace_h = _p90(pc.Deployment(mode="mixed", pool=pc.Pool(gpu="a100-sxm-80gb")), w)
    first, trace_f = _p90(pc.Deployment(mode="mixed", pool=pc.Pool(gpu="a100-sxm-80gb"), scheduler="prefill_first"), w)
    assert hybrid.tpot_mean_s[0] < first.tpot_mean_s[0]
    assert np.nanmean(trace_h.tpot_s) < np.nanmean(trace_f.tpot_s)
    assert hybrid.tpot_p_s[0] == pytest.approx(trace_h.tpot_p(90), rel=0.1)


def test_sliding_window_models_get_their_kv_capacity():
    # v1 charged full-context KV: Gemma-3-27B on H100 at isl 32000 had a limit of 0.9 (estimate: 4)
    for model, gpu, isl in (("gemma-3-27b", "h100-sxm", 32000), ("mistral-7b", "l4", 8000)):
        w = pc.Workload(rate=1, isl=isl, osl=500)
        pm = PoolModel.build(pc.load_model(model), pc.Pool(gpu=gpu), w)
        e = pc.estimate(model, gpu, isl=isl, osl=500, rows=False)
        assert pm.batch_limit(w) == pytest.approx(e.max_batch, abs=1.0)


def test_the_binding_resource_is_named_with_a_finite_utilisation():
    slo = pc.SLO(ttft_s=2, tpot_s=0.05)
    w = {"rate": 4.87, "isl": 4000, "osl": 500}
    capped = pc.evaluate("llama-3.1-8b", {"mode": "mixed", "pool": {"gpu": "h200-sxm", "max_batch": 48}}, w, slo)
    assert not capped.stable and capped.binding == "batch cap" and capped.utilisation > 1
    assert "batch cap" in capped.reason
    for mode in ("mixed", "chunked"):
        r = pc.evaluate("llama-3.1-8b", {"mode": mode, "pool": {"gpu": "h200-sxm"}}, {**w, "rate": 30}, slo)
        assert not r.stable and r.utilisation is not None and 1 < r.utilisation < 100
        assert r.binding in ("prefill interference", "prefill chunks")


def test_capacity_is_never_below_the_planned_rate():
    # v1: best capacity_rps 3.33 < 3.58 (the 64-point rate grid quantised it down by up to 11%)
    p = pc.plan("llama-3.1-70b", pc.Workload(rate=3.58, isl=4000, osl=500), pc.SLO(ttft_s=2, tpot_s=0.05),
                gpus=["h100-sxm"])
    assert all(c.capacity_rps >= 3.58 for c in p.candidates)
    assert p.best.capacity_rps < 3.58 * 1.5


def test_admission_waits_when_kv_memory_is_nearly_full():
    m = pc.load_model("llama-3.1-8b")
    w = pc.Workload(rate=1.0, isl=4000, osl=500)
    d = pc.Deployment(mode="disaggregated", prefill=pc.Pool(gpu="h100-sxm", instances=4),
                      decode=pc.Pool(gpu="h100-sxm", max_batch=24))
    pools = tuple(PoolModel.build(m, p, w) for p in d.pools)
    rates = np.array([1.0, 3.0, 3.5])
    a = analyse(m, d, w, rates, 0.9, pools)
    assert a.stable.all() and np.all(a.batch < 24) and a.batch[-1] > 19
    assert a.binding[-1] == "decode batch cap" and 0.8 < a.utilisation[-1] < 0.9
    base = analyse(m, d.model_copy(update={"decode": d.decode.model_copy(update={"max_batch": 512})}), w, rates, 0.9,
                   pools[:1] + (PoolModel.build(m, d.decode.model_copy(update={"max_batch": 512}), w),))
    wait = a.ttft_p_s - base.ttft_p_s
    assert wait[0] < 0.05 and wait[-1] > wait[0] + 0.1  # the slot wait grows sharply near the cap
    sim = run_deployment(m, d, w.model_copy(update={"rate": 3.5}), pools, 800)
    assert sim.batch_mean <= 24
    assert sim.ttft_p(90) > base.ttft_p_s[-1]  # the simulation queues for slots too


def test_the_simulation_enforces_the_kv_capacity_by_preemption():
    m = pc.load_model("llama-3.1-8b")
    w = pc.Workload(rate=0.8, isl=1000, osl=800)
    pm = PoolModel.build(m, pc.Pool(gpu="h100-sxm"), w)
    r = Requests.draw(w, 0.8, 300, 1)
    cap = float(pm.kv_seq_bytes(1800)) * 6  # room for six finished sequences
    first, done, trace = run_engine(pm, "hybrid", r.arrivals, r.isl, r.cached, r.osl, r.measured, 8192,
                                    kv_capacity_bytes=cap)
    assert trace.stable and trace.batch_mean <= 6 * 1800 / 1000
    assert trace.preemptions > 0  # sequences grew past the cache and were recomputed, none clipped
    assert np.all(np.isfinite(done[r.measured]))


def test_batched_prefill_raises_short_prompt_capacity():
    # Llama-70B tp4 at isl 128: ~52 prompts/s at batch 1, ~98 at batch 8 (issue 10)
    m = pc.load_model("llama-3.1-70b")
    w = pc.Workload(rate=1, isl=128, osl=100)
    pre = PoolModel.build(m, pc.Pool(gpu="h100-sxm", tp=4), w)
    one = float(pre.prefill_s(128))
    b, step = prefill_batch(pre, w, np.array([300.0]), 8192)
    assert b[0] > 3 and b[0] / step[0] > 1.5 / one


def test_itl_and_joint_attainment():
    w = pc.Workload(rate=1.5, isl=8000, osl=300)
    slo = pc.SLO(ttft_s=2, tpot_s=0.05)
    r = pc.evaluate("llama-3.1-8b", {"mode": "mixed", "pool": {"gpu": "h100-sxm"}}, w, slo)
    assert r.stable and r.itl_s(99) > 3 * r.itl_s(50)  # a long prompt's step is one long gap
    joint = pc.SLO(ttft_s=r.ttft_s(90), tpot_s=r.tpot_s(90), attainment="joint")
    att = pc.evaluate("llama-3.1-8b", {"mode": "mixed", "pool": {"gpu": "h100-sxm"}}, w, joint).attainment
    assert 0.75 <= att <= 0.9 + 1e-9  # both at their p90: at most 90% meet both
    s = pc.simulate("llama-3.1-8b", {"mode": "mixed", "pool": {"gpu": "h100-sxm"}}, w, joint, requests=800)
    assert s.attainment == pytest.approx(att, abs=0.1)
    assert s.itl_by_percentile_s[99] == pytest.approx(r.itl_s(99), rel=0.25)
    with pytest.raises(ValueError, match="itl_s"):
        pc.SLO(ttft_s=1, tpot_s=0.05, itl_s=-1)


def test_an_overloaded_simulation_is_reported_unstable():
    # a finite run drains any backlog; growing waits through the run are what mark the overload
    d = {"mode": "mixed", "pool": {"gpu": "h100-sxm"}}
    over = pc.simulate("llama-3.1-8b", d, {"rate": 200, "isl": 4000, "osl": 500}, requests=200)
    assert not over.stable and over.ttft_by_percentile_s == {}
    ok = pc.simulate("llama-3.1-8b", d, {"rate": 2, "isl": 4000, "osl": 500}, requests=300)
    assert ok.stable and 0.1 < ok.ttft_by_percentile_s[50] < ok.ttft_by_percentile_s[90] < 0.5
