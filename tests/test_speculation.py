"""Speculative decoding: MTP, EAGLE heads and draft models in estimate and serving (issue 11)."""

from __future__ import annotations

import pytest

import calculator as pc
from calculator.speculation import Speculation, draft_model_spec

W = {"isl": 2000, "osl": 500}


def test_tokens_per_step_by_hand():
    # 1 + a + a^2 + a^3 with a = 0.7
    assert Speculation(kind="eagle", tokens=3, acceptance=0.7).tokens_per_step == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    assert Speculation(kind="mtp", tokens=1, acceptance=0.85).tokens_per_step == pytest.approx(1.85)


def test_a_speculative_decode_step_is_a_verify_step_plus_the_drafts_over_the_tokens_it_emits():
    """Llama-3.1-70B on 4x H100, batch 8, EAGLE with 3 drafts at 0.7: TPOT = (verify of 4 tokens per
    sequence + 3 one-layer draft steps) / 2.533; the verify step is the plain step with S = 4."""
    spec = Speculation(kind="eagle", tokens=3, acceptance=0.7)
    e = pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, batch=8, spec=spec, **W)
    rows = [r for r in e.rows if r.phase == "decode"]
    step = sum(r.time_s for r in rows)  # the operator groups and the step's fixed overhead
    assert e.tpot_s == pytest.approx(step / spec.tokens_per_step, rel=1e-9)
    assert e.spec_tokens_per_step == pytest.approx(spec.tokens_per_step)
    draft = next(r for r in rows if r.group == "draft")
    plain = pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, batch=8, **W)
    assert draft.time_s < 0.1 * plain.tpot_s  # one layer of 80, three times
    # at a small batch the verify step costs about a plain step: TPOT falls about 2.5x
    assert 2.0 < plain.tpot_s / e.tpot_s < spec.tokens_per_step


def test_speculation_helps_at_small_batch_and_not_at_large():
    spec = {"kind": "eagle", "tokens": 4, "acceptance": 0.6}
    w = {"isl": 1000, "osl": 500}
    gain = {b: pc.estimate("llama-3.1-8b", "h100-sxm", batch=b, spec=spec, **w).output_tokens_per_s
            / pc.estimate("llama-3.1-8b", "h100-sxm", batch=b, **w).output_tokens_per_s for b in (1, 256)}
    assert gain[1] > 1.7 and gain[256] < 1.05  # at 256 the verify of 5 tokens a sequence is compute-bound


def test_the_draft_takes_memory():
    plain = pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, **W)
    draft = pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, spec={"kind": "draft", "draft_model": "llama-3.1-8b",
                                                                   "tokens": 4, "acceptance": 0.7}, **W)
    assert draft.memory.weights_bytes - plain.memory.weights_bytes == pytest.approx(
        pc.param_count(pc.load_model("llama-3.1-8b")) * 2 / 4, rel=1e-6)
    assert draft.max_batch < plain.max_batch
    # an MTP layer of DeepSeek-V3 is one MoE layer sharing the embedding and head
    mtp = draft_model_spec(pc.load_model("deepseek-v3"), Speculation(kind="mtp", tokens=1, acceptance=0.85))
    assert mtp.num_layers == 1 and mtp.moe is not None and mtp.moe.num_dense_layers == 0


def test_bad_speculation_names_its_field():
    with pytest.raises(pc.InputError, match=r"spec\.draft_model"):
        pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, spec={"kind": "draft", "draft_model": "nope", "tokens": 2,
                                                             "acceptance": 0.5})
    with pytest.raises(pc.InputError, match=r"spec.*draft_model"):
        pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, spec={"kind": "draft", "tokens": 2, "acceptance": 0.5})
    # a draft as large as its target (llama-3.1-70b drafting for itself was accepted): refused, with the sizes
    with pytest.raises(pc.InputError, match=r"spec\.draft_model.*70\.6B active parameters\) is not smaller"):
        pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, spec={"kind": "draft", "draft_model": "llama-3.1-70b",
                                                             "tokens": 2, "acceptance": 0.5})
    with pytest.raises(pc.InputError, match=r"spec.*acceptance"):
        pc.estimate("llama-3.1-70b", "h100-sxm", tp=4, spec={"kind": "mtp", "tokens": 2, "acceptance": 1.0})
    with pytest.raises(pc.InputError, match=r"deployment\.prefill"):
        pc.evaluate("llama-3.1-8b", {"mode": "disaggregated", "prefill": {"gpu": "h100-sxm", "spec": {"kind": "eagle"}},
                                     "decode": {"gpu": "h100-sxm"}}, {"rate": 1, **W})


def test_serving_tpot_falls_by_about_the_tokens_per_step_at_light_load():
    spec = Speculation(kind="eagle", tokens=3, acceptance=0.7)
    w = pc.Workload(rate=0.2, **W)
    plain = pc.evaluate("llama-3.1-70b", {"mode": "mixed", "pool": {"gpu": "h100-sxm", "tp": 4}}, w)
    fast = pc.evaluate("llama-3.1-70b", {"mode": "mixed", "pool": {"gpu": "h100-sxm", "tp": 4, "spec": spec}}, w)
    assert 2.0 < plain.tpot_s(50) / fast.tpot_s(50) < spec.tokens_per_step
    assert fast.ttft_s(50) == pytest.approx(plain.ttft_s(50), rel=0.05)  # prompts are not speculated


def test_serving_goodput_gains_at_a_tight_tpot_and_not_at_a_loose_one():
    spec = {"kind": "eagle", "tokens": 4, "acceptance": 0.6}
    w = pc.Workload(rate=1.0, isl=1000, osl=500)

    def goodput(tpot_s: float, s: dict | None) -> float:
        d = {"mode": "disaggregated", "prefill": {"gpu": "h100-sxm", "instances": 50},
             "decode": {"gpu": "h100-sxm", "spec": s}}
        return pc.evaluate("llama-3.1-8b", d, w, pc.SLO(ttft_s=5.0, tpot_s=tpot_s)).goodput_rps

    assert goodput(0.015, spec) > 1.15 * goodput(0.015, None)
    assert goodput(0.2, spec) == pytest.approx(goodput(0.2, None), rel=0.05)


def test_speculation_is_not_simulated_yet():
    d = {"mode": "mixed", "pool": {"gpu": "h100-sxm", "spec": {"kind": "eagle"}}}
    with pytest.raises(pc.InputError, match="not simulated"):
        pc.simulate("llama-3.1-8b", d, {"rate": 1, **W})


def test_the_planner_takes_mtp_where_it_halves_the_gpus():
    """DeepSeek-V3 fp8 on H200 at 40 req/s with a 25 ms TPOT: without MTP 48 GPUs; offered MTP (one
    draft token at 0.85) the planner takes it on the decode pool and needs 24."""
    w, slo = pc.Workload(rate=40, isl=2000, osl=500), pc.SLO(ttft_s=2.0, tpot_s=0.025)
    kw = {"gpus": ["h200-sxm"], "weight_dtype": "fp8", "kv_dtype": "fp8"}
    plain = pc.plan("deepseek-v3", w, slo, **kw)
    mtp = pc.plan("deepseek-v3", w, slo, spec=Speculation(kind="mtp", tokens=1, acceptance=0.85), **kw)
    assert all(p.spec is None for c in plain.candidates for p in c.deployment.pools)
    assert mtp.best.num_gpus < plain.best.num_gpus
    assert mtp.best.deployment.pools[-1].spec is not None
    assert all(p.spec is None for c in mtp.candidates if c.mode == "disaggregated" for p in c.deployment.pools[:1])
    # the candidate's figures are evaluate's (up to the far tail of the batch's distribution, which the
    # max_batch the planner then configures, 2 B + 3.1 sqrt(B) + 1, truncates: ~1e-5 of the p90 TPOT)
    r = pc.evaluate("deepseek-v3", mtp.best.deployment, w, slo)
    assert r.tpot_s(90) == pytest.approx(mtp.best.tpot_p_s, rel=1e-4)
    assert "+mtp" in mtp.explain()
