"""estimate(): hand-computed times, operator rows, bounds, memory fit and properties."""

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import calculator as pc
from calculator.params import param_count


def test_contract_fields():
    e = pc.estimate("llama-3.1-70b", "h200-sxm", tp=4, pp=1, isl=4000, osl=500, batch=1,
                    weight_dtype="bf16", kv_dtype="bf16", prefix_hit=0.0)
    assert e.fits and e.max_batch > 1
    assert e.e2e_s == pytest.approx(e.ttft_s + 499 * e.tpot_s)
    assert e.prefill_bound == "compute" and e.decode_bound == "memory"
    assert e.kv_cache_bytes == 327_680 * 4500
    assert e.ridge_point_flops_per_byte == pytest.approx(989.4e12 / 4.8e12)
    assert e.prefill_intensity_flops_per_byte > e.ridge_point_flops_per_byte > e.decode_intensity_flops_per_byte


def test_rows_add_up_to_the_headline():
    e = pc.estimate("mixtral-8x7b", "h100-sxm", tp=2, isl=2000, osl=200, batch=8)
    g = pc.load_gpu("h100-sxm")
    overhead = g.efficiency.step_overhead_us * 1e-6
    pre = sum(r.time_s for r in e.rows if r.phase == "prefill")
    dec = sum(r.time_s for r in e.rows if r.phase == "decode")
    assert e.prefill_s == pytest.approx(pre) and e.tpot_s == pytest.approx(dec)
    # the step's fixed overhead is a row of its own, in each phase
    for phase in ("prefill", "decode"):
        row = next(r for r in e.rows if r.phase == phase and r.group == "step_overhead")
        assert row.time_s == pytest.approx(overhead) and row.formula == "step_overhead_time" and row.bound == "latency"
    # with speculative decoding the decode rows make one step, which emits tokens_per_step tokens
    spec = pc.Speculation(kind="mtp", tokens=1, acceptance=0.8)
    s = pc.estimate("deepseek-v3", "h200-sxm", tp=8, isl=2000, osl=200, batch=8, weight_dtype="fp8", spec=spec)
    step = sum(r.time_s for r in s.rows if r.phase == "decode")
    assert s.tpot_s * s.spec_tokens_per_step == pytest.approx(step)
    assert {r.group for r in e.rows} >= {"attention_proj", "moe", "lm_head", "attention", "tp_allreduce"}


def test_batch1_decode_of_a_dense_model_by_hand():
    """llama-3.1-8b bf16 on one H100, batch 1, short context: decode reads every weight once."""
    m, g = pc.load_model("llama-3.1-8b"), pc.load_gpu("h100-sxm")
    e = pc.estimate(m, g, isl=16, osl=2, batch=1)
    eff = g.efficiency
    linear = (param_count(m) - 2 * m.vocab_size * m.hidden_size) * 2  # bytes of non-embedding weights
    lm_head = m.vocab_size * m.hidden_size * 2
    weights_s = (linear + lm_head) / (3.35e12 * eff.memory)
    # kernels: (2 attention-proj + 3 mlp + 4 attention) per layer + 2 for the head
    kernels_s = (9 * 32 + 2) * eff.kernel_latency_us * 1e-6
    expected = weights_s + kernels_s + eff.step_overhead_us * 1e-6
    assert e.tpot_s == pytest.approx(expected, rel=0.01)  # the rest: KV, activations, logits


def test_prefill_of_a_dense_model_is_two_flops_per_weight_per_token():
    m, g = pc.load_model("llama-3.1-8b"), pc.load_gpu("h100-sxm")
    e = pc.estimate(m, g, isl=8000, osl=1, batch=1)
    proj = next(r for r in e.rows if r.phase == "prefill" and r.group == "mlp")
    assert proj.flops == 2 * (3 * 4096 * 14336 * 32) * 8000
    attn = next(r for r in e.rows if r.phase == "prefill" and r.group == "attention")
    assert attn.flops == 2 * 32 * (128 + 128) * 32 * (8000 * 8001 / 2)


def test_prefix_hit_removes_work():
    full = pc.estimate("llama-3.1-8b", "h100-sxm", isl=8000, osl=10)
    half = pc.estimate("llama-3.1-8b", "h100-sxm", isl=8000, osl=10, prefix_hit=0.5)
    assert half.prefill_s < 0.6 * full.prefill_s


def test_moe_decode_reads_only_touched_experts():
    ds = pc.load_model("deepseek-v3")
    one = pc.estimate(ds, "h200-sxm", tp=8, isl=100, osl=10, batch=1, weight_dtype="fp8")
    many = pc.estimate(ds, "h200-sxm", tp=8, isl=100, osl=10, batch=256, weight_dtype="fp8")
    moe1 = next(r for r in one.rows if r.phase == "decode" and r.group == "moe")
    moe256 = next(r for r in many.rows if r.phase == "decode" and r.group == "moe")
    expert = 3 * 7168 * 2048  # one expert's weights, fp8 = 1 byte each
    assert moe1.bytes == pytest.approx((8 * expert * 58 + (expert + 7168 * 256 + 256) * 58) / 8, rel=0.02)
    assert moe256.bytes > 20 * moe1.bytes  # most of the 256 experts are touched


def test_not_fitting_is_reported_with_the_shortfall():
    e = pc.estimate("llama-3.1-405b", "h100-sxm", tp=1)
    assert not e.fits and e.ttft_s is None
    assert "short by" in e.reason and e.memory.shortfall_bytes > 700e9
    kv = pc.estimate("llama-3.1-8b", "l4", isl=100_000, osl=1000, batch=64)
    assert not kv.fits and kv.reason.startswith("KV cache does not fit")


def test_pipeline_parallel_decodes_micro_batches_and_never_shortens_a_step():
    a = pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, pp=1, isl=1000, osl=100, batch=4, weight_dtype="fp8")
    b = pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, pp=2, isl=1000, osl=100, batch=8, weight_dtype="fp8")
    send = next(r.time_s for r in b.rows if r.phase == "decode" and r.group == "pp_send")
    # 8 sequences in two micro-batches of 4: a token is one micro-batch crossing both stages, which
    # is pp1's step at batch 4 plus the stage-to-stage send; twice the tokens per step
    assert b.tpot_s == pytest.approx(a.tpot_s + send, rel=1e-9)
    assert b.output_tokens_per_s == pytest.approx(8 / b.tpot_s)
    assert b.weights_bytes_per_gpu == pytest.approx(a.weights_bytes_per_gpu / 2)
    one = pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, pp=2, isl=1000, osl=100, batch=1, weight_dtype="fp8")
    solo = pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, pp=1, isl=1000, osl=100, batch=1, weight_dtype="fp8")
    assert one.tpot_s > solo.tpot_s  # one sequence cannot fill two stages: the bubble


def test_tp_across_nodes_uses_the_nic():
    a = pc.estimate("llama-3.1-405b", "h100-sxm", tp=8, isl=2000, osl=10, weight_dtype="fp8")
    b = pc.estimate("llama-3.1-405b", "h100-sxm", tp=16, isl=2000, osl=10, weight_dtype="fp8")
    ar = lambda e: next(r.time_s for r in e.rows if r.phase == "prefill" and r.group == "tp_allreduce")  # noqa: E731
    assert ar(b) > 5 * ar(a)  # 50 GB/s NIC instead of 450 GB/s NVLink


@pytest.mark.parametrize("bad, field", [
    (dict(isl=0), "isl"), (dict(osl=-3), "osl"), (dict(batch=0), "batch"), (dict(prefix_hit=1.0), "prefix_hit"),
    (dict(prefix_hit=float("nan")), "prefix_hit"), (dict(tp=0), "tp"), (dict(weight_dtype="fp3"), "weight_dtype"),
    (dict(kv_dtype="fp2"), "kv_dtype"), (dict(isl=200_000), "isl"), (dict(ep=2), "ep"), (dict(pp=1000), "pp"),
])
def test_bad_input_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        pc.estimate("llama-3.1-8b", "h100-sxm", **bad)


def test_unknown_ids_name_the_closest():
    with pytest.raises(pc.UnknownIdError, match="llama-3.1-70b"):
        pc.load_model("llama-3.1-70")
    with pytest.raises(pc.UnknownIdError, match="h100-sxm"):
        pc.load_gpu("h100")


def test_every_model_on_every_gpu_fits_or_says_why():
    """The issue's acceptance sweep: smallest power-of-two tp in a node that fits, else a reason."""
    for model_id in pc.list_models():
        for gpu_id in pc.list_gpus():
            heads = pc.load_model(model_id).num_attention_heads
            results = [pc.estimate(model_id, gpu_id, tp=tp, isl=1024, osl=256, weight_dtype="fp8", rows=False)
                       for tp in (1, 2, 4, 8) if heads % tp == 0]
            for e in results:
                if e.fits:
                    assert math.isfinite(e.ttft_s) and e.ttft_s > 0 and e.tpot_s > 0 and e.max_batch >= 1
                else:
                    assert e.reason and e.memory.shortfall_bytes > 0


@settings(max_examples=40, deadline=None)
@given(isl=st.integers(1, 30_000), extra=st.integers(1, 10_000), batch=st.integers(1, 64))
def test_prefill_grows_with_prompt(isl, extra, batch):
    a = pc.estimate("qwen3-32b", "h200-sxm", tp=2, isl=isl, osl=1, batch=batch, rows=False)
    b = pc.estimate("qwen3-32b", "h200-sxm", tp=2, isl=isl + extra, osl=1, batch=batch, rows=False)
    assume(b.fits)
    assert a.fits and b.prefill_s >= a.prefill_s


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 128), more=st.integers(1, 128), ctx=st.integers(1, 20_000))
def test_decode_grows_with_batch_and_throughput_too(batch, more, ctx):
    a = pc.estimate("gpt-oss-120b", "h100-sxm", tp=2, isl=ctx, osl=1, batch=batch, rows=False)
    b = pc.estimate("gpt-oss-120b", "h100-sxm", tp=2, isl=ctx, osl=1, batch=batch + more, rows=False)
    if a.fits and b.fits:
        assert b.tpot_s >= a.tpot_s
        assert b.output_tokens_per_s >= a.output_tokens_per_s


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b", "deepseek-v3", "gemma-3-27b"]),
       isl=st.integers(100, 8000))
def test_fp8_kv_never_lowers_max_batch(model, isl):
    a = pc.estimate(model, "h200-sxm", tp=8, isl=isl, osl=100, weight_dtype="fp8", kv_dtype="bf16", rows=False)
    b = pc.estimate(model, "h200-sxm", tp=8, isl=isl, osl=100, weight_dtype="fp8", kv_dtype="fp8", rows=False)
    assert b.max_batch >= 2 * a.max_batch - 1 if a.max_batch else b.max_batch >= 0


def test_tp_must_split_the_attention_heads():
    # Qwen2.5-7B has 28 query heads: tp 4 splits them 7 per GPU, tp 8 cannot (vLLM refuses it too)
    assert pc.estimate("qwen2.5-7b", "h100-sxm", tp=4).fits
    with pytest.raises(ValueError, match="^tp: qwen2.5-7b's 28 attention heads do not split evenly over tp=8"):
        pc.estimate("qwen2.5-7b", "h100-sxm", tp=8)
