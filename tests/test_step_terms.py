"""The step model's two engine terms (fitted by the serving validation, off in the defaults): a cost
per sequence in a step and the decode attention kernel's share of the efficiencies."""

from __future__ import annotations

import numpy as np
import pytest

import calculator as pc
from calculator.microbench.fit import design, fit_efficiency
from calculator.phases import Setup, step_groups, step_time_s
from hardware_db.schema import Efficiency


def _setup(**eff: float) -> Setup:
    gpu = pc.load_gpu("h100-sxm")
    gpu = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update=eff)})
    return Setup(pc.load_model("llama-3.1-8b"), gpu)


def test_defaults_are_off() -> None:
    e = Efficiency()
    assert e.sequence_overhead_us == 0.0 and e.decode_attention == 1.0
    names = [g.name for g in step_groups(_setup(), S=1, P=1000, b=32, phase="decode")]
    assert "sequence_overhead" not in names


def test_sequence_overhead_is_per_sequence_in_the_step() -> None:
    base, extra = _setup(), _setup(sequence_overhead_us=50.0)
    # 32 decodes: 32 x 50 us = 1.6 ms more
    d0 = float(step_time_s(step_groups(base, S=1, P=1000, b=32, phase="decode"), base))
    d1 = float(step_time_s(step_groups(extra, S=1, P=1000, b=32, phase="decode"), extra))
    assert d1 - d0 == pytest.approx(1.6e-3, rel=1e-9)
    # a hybrid step: 32 decodes and 3 prompt pieces = 35 sequences; a plain decode step's empty chunk adds none
    h0 = float(step_time_s(step_groups(base, S=1, P=1000, b=32, phase="decode", chunk=(256, 0, 3)), base))
    h1 = float(step_time_s(step_groups(extra, S=1, P=1000, b=32, phase="decode", chunk=(256, 0, 3)), extra))
    assert h1 - h0 == pytest.approx(35 * 50e-6, rel=1e-9)
    e0 = float(step_time_s(step_groups(extra, S=1, P=1000, b=32, phase="decode", chunk=(0, 0)), extra))
    assert e0 - float(step_time_s(step_groups(base, S=1, P=1000, b=32, phase="decode", chunk=(0, 0)), base)) \
        == pytest.approx(1.6e-3, rel=1e-9)
    # a prefill of 2 prompts: 2 sequences
    p0 = float(step_time_s(step_groups(base, S=512, P=0, b=2, phase="prefill"), base))
    p1 = float(step_time_s(step_groups(extra, S=512, P=0, b=2, phase="prefill"), extra))
    assert p1 - p0 == pytest.approx(100e-6, rel=1e-9)


def test_attention_share_slows_the_attention_group_only() -> None:
    full, half = _setup(), _setup(decode_attention=0.5)
    g_full = {g.name: g for g in step_groups(full, S=1, P=8000, b=64, phase="decode")}
    g_half = {g.name: g for g in step_groups(half, S=1, P=8000, b=64, phase="decode")}
    for name, g in g_full.items():
        if name == "attention":
            # both ceilings at half the efficiency: the roofline part doubles, the kernel latencies stay
            assert g_half[name].memory_s == pytest.approx(2 * g.memory_s)
            assert g_half[name].time_s - g_half[name].latency_s == pytest.approx(2 * (g.time_s - g.latency_s))
        else:
            assert g_half[name].time_s == pytest.approx(g.time_s)


def test_decode_attention_share_leaves_prompt_attention_alone() -> None:
    # a prompt's (or a chunk's) attention is a flash-attention kernel over many query tokens: the decode
    # kernel's share does not apply to it (vLLM's CPU engine: a 512-token prompt in eight 64-token chunks took
    # 54.6 ms against 6.8 ms for a lone 64-token prompt, while its decode attention ran at ~0.3 of the GEMMs)
    full, slow = _setup(), _setup(decode_attention=0.25)
    for kw in ({"S": 4096, "P": 0, "b": 1, "phase": "prefill"}, {"S": 512, "P": 4096, "b": 1, "phase": "prefill"}):
        assert float(step_time_s(step_groups(slow, **kw), slow)) == pytest.approx(
            float(step_time_s(step_groups(full, **kw), full)), rel=1e-12)
    # a hybrid step: only the decodes' part of the attention slows (by 1/0.25 on its roofline part)
    kw = {"S": 1, "P": 8000, "b": 64, "phase": "decode"}
    dec_full = {g.name: g for g in step_groups(full, **kw)}["attention"]
    dec_slow = {g.name: g for g in step_groups(slow, **kw)}["attention"]
    chunk_only = {g.name: g for g in step_groups(full, S=1, P=8000, b=0, phase="decode", chunk=(512, 4096))}["attention"]
    hyb_slow = {g.name: g for g in step_groups(slow, **kw, chunk=(512, 4096))}["attention"]
    assert dec_slow.time_s - dec_slow.latency_s == pytest.approx(4 * (dec_full.time_s - dec_full.latency_s))
    def roof(g):
        return float(g.time_s - g.latency_s)

    assert roof(hyb_slow) == pytest.approx(roof(dec_slow) + roof(chunk_only), rel=1e-9)
    assert float(hyb_slow.latency_s) == pytest.approx(float(chunk_only.latency_s))  # two kernels either way


def test_one_varlen_attention_kernel_runs_a_hybrid_step_at_the_prompt_kernels_efficiency() -> None:
    """vLLM's CPU backend attends a whole step, decodes and prompt pieces together, in one kernel
    (``cpu_attention_with_kv_cache`` over the batch): with ``hybrid_attention_kernels`` = 1 a hybrid step's
    attention is one roofline over all of its work at the GEMM efficiencies with one kernel's launches, while
    a decode-only step keeps the decode kernel's share; and never less than the decodes alone take in that
    decode-only step (a step's work only grows with its prompt piece)."""
    two, one = _setup(decode_attention=0.25), _setup(decode_attention=0.25, hybrid_attention_kernels=1)
    full = _setup()
    kw = {"S": 1, "P": 8000, "b": 64, "phase": "decode"}
    for setup in (two, one):  # decode-only steps: the decode kernel's share either way
        assert float(step_time_s(step_groups(setup, **kw), setup)) == pytest.approx(
            float(step_time_s(step_groups(two, **kw), two)), rel=1e-12)
    # a long piece over a long prefix beside a few short decodes: its work sets the step
    big = {"S": 1, "P": 500, "b": 8, "phase": "decode", "chunk": (2048, 4096)}
    hyb_one = {g.name: g for g in step_groups(one, **big)}["attention"]
    hyb_two = {g.name: g for g in step_groups(two, **big)}["attention"]
    hyb_full = {g.name: g for g in step_groups(full, **big)}["attention"]
    # one roofline over the step's work, as the default share 1 gives it, but one kernel's launches, not two
    assert float(hyb_one.time_s - hyb_one.latency_s) == pytest.approx(float(hyb_full.time_s - hyb_full.latency_s))
    assert float(hyb_one.latency_s) == pytest.approx(float(hyb_full.latency_s) / 2)
    assert float(hyb_one.memory_s) < float(hyb_two.memory_s)  # the decodes' KV no longer read at 0.25
    # a two-token piece beside 64 decodes at 8,000 tokens: one roofline at the GEMM efficiencies would take a
    # quarter of what the decodes alone take at their share; the kernel takes at least the decodes' own time
    alone = {g.name: g for g in step_groups(one, **kw)}["attention"]
    tiny = {g.name: g for g in step_groups(one, **kw, chunk=(2, 0))}["attention"]
    at_gemm = {g.name: g for g in step_groups(full, **kw, chunk=(2, 0))}["attention"]
    assert float(at_gemm.time_s) < 0.5 * float(alone.time_s)
    assert float(tiny.time_s) == pytest.approx(float(alone.time_s), rel=1e-12)
    # so a step with a piece never takes less than the step without it, whatever the piece
    for piece in (1, 2, 16, 64, 256, 2048):
        hybrid = float(step_time_s(step_groups(one, **kw, chunk=(piece, 0)), one))
        assert hybrid >= float(step_time_s(step_groups(one, **kw), one)), piece


def test_the_fit_recovers_both_terms() -> None:
    # synthetic steps of the enginebench model on a made-up CPU: prefill 64-1024 tokens, decode at two contexts
    from calculator.enginebench.model import ENGINE_MODEL

    gpu = pc.load_gpu("h100-sxm").model_copy(update={"peak_tflops": pc.load_gpu("h100-sxm").peak_tflops.model_copy(
        update={"bf16": 0.4}), "hbm_bandwidth_tb_s": 0.03})
    true = Efficiency(compute=0.8, memory=0.9, kernel_latency_us=20.0, step_overhead_us=500.0,
                      sequence_overhead_us=80.0, decode_attention=0.25)
    parts = [design(ENGINE_MODEL, gpu, "prefill", np.array([64, 128, 256, 512, 1024]), np.ones(5), "bf16"),
             design(ENGINE_MODEL, gpu, "decode", np.array([80] * 5 + [576] * 3), np.array([1, 4, 16, 32, 64, 1, 8, 32]),
                    "bf16")]
    from calculator.microbench.fit import Design

    d = Design.concat(parts)
    y = d.predict_s(true)
    fit = fit_efficiency(d, y, per_sequence=True, attention=True)
    assert fit.rms_rel_error < 0.02
    assert fit.efficiency.sequence_overhead_us == pytest.approx(80.0, rel=0.15)
    assert fit.efficiency.decode_attention == pytest.approx(0.25, rel=0.25)
    # and without the two terms the same points are fitted much worse
    assert fit_efficiency(d, y).rms_rel_error > 3 * fit.rms_rel_error


def test_a_chunked_prompt_is_its_chunks_in_a_row() -> None:
    # the serving validation fits a chunked instance's lone long prompts as k steps of C tokens, each after
    # the ones before: k step overheads, k sequences, and the chunks' compute added up
    from calculator.enginebench.predict import chunked_prefill_design
    from calculator.microbench.fit import design

    gpu = pc.load_gpu("h100-sxm")
    eff = Efficiency(compute=0.5, memory=0.5, kernel_latency_us=10.0, step_overhead_us=1000.0,
                     sequence_overhead_us=50.0)
    row = chunked_prefill_design(gpu, 512, 64)
    assert row.kernels.shape == (1,) and row.step_counts[0] == 8 and row.sequences[0] == 8
    from calculator.enginebench.model import ENGINE_MODEL

    one = design(ENGINE_MODEL, gpu, "prefill", np.array([64]), np.array([1]), "bf16")
    # eight chunks cost at least eight first chunks (later ones re-read a longer prefix) and all overheads count 8x
    assert float(row.predict_s(eff)[0]) >= 8 * float(one.predict_s(eff)[0]) - 1e-12
    assert float(row.predict_s(eff)[0]) - float(row.predict_s(eff.model_copy(update={"step_overhead_us": 0.0}))[0]) \
        == pytest.approx(8 * 1000e-6)
    # a remainder: 100 tokens in chunks of 64 are two steps
    assert chunked_prefill_design(gpu, 100, 64).step_counts[0] == 2
