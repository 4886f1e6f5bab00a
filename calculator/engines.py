"""Engine profiles and the public step latencies they are fitted and checked on.

An engine profile (``hardware_db/data/engines.yaml``) holds the efficiencies one inference engine reaches:
its per-GPU compute and memory efficiencies, its per-kernel, per-collective, per-step and per-sequence
latencies, the roll-off of its GEMMs at few rows (``gemm_compute_efficiency``) and the CUDA-graph launch
share of its decode steps (``launch_latency``). ``engine=`` on ``estimate``, ``evaluate``, ``plan``, REST
and the CLI applies one to the GPU (``apply_engine``); ``generic`` keeps the GPU entry's own values.

The measurements (``hardware_db/data/step_latencies.csv``, sources in its header) are prefill and decode
step times measured separately, so a profile's error is reported per phase (``profile_errors``), on the
source it was fitted to and on a source it never saw.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from hardware_db import GPUSpec, load_engine, load_gpu, load_model
from hardware_db.loader import DATA_DIR
from hardware_db.schema import EngineProfile

from .errors import InputError
from .phases import setup_for, step_groups, step_time_s

STEP_LATENCY_FILE = DATA_DIR / "step_latencies.csv"
DEFAULT_ENGINE = "generic"
FIT_SOURCE = "trtllm-0.9-dli"
"""The source the ``trtllm-0.9`` profile is fitted to; every other source is held out."""


def apply_engine(gpu: GPUSpec, engine: str | EngineProfile) -> GPUSpec:
    """The GPU with an engine profile's efficiencies over its own (``generic``: unchanged)."""
    profile = engine if isinstance(engine, EngineProfile) else load_engine(engine)
    eff = profile.efficiency(gpu.id, gpu.efficiency)
    return gpu if eff is gpu.efficiency else gpu.model_copy(update={"efficiency": eff})


def engine_gpu(gpu: GPUSpec, engine: str | None, calibration: object | None) -> GPUSpec:
    """The GPU a request runs on: its calibration (a user's own fit) or its engine profile, never both."""
    if calibration is not None:
        if engine not in (None, DEFAULT_ENGINE):
            raise InputError("engine", f"a calibration replaces every efficiency, so it cannot be combined with "
                                       f"engine profile {engine!r}: give one of them")
        from .calibration import apply_calibration

        return apply_calibration(gpu, calibration)  # type: ignore[arg-type]
    return gpu if engine in (None, DEFAULT_ENGINE) else apply_engine(gpu, engine)


class StepLatency(BaseModel):
    """One published measurement: a prefill of ``batch`` prompts of ``isl`` tokens and the mean decode step of
    ``batch`` sequences over contexts ``isl + 1 ... isl + osl``, milliseconds."""

    model_config = ConfigDict(frozen=True)

    source: str
    gpu: str
    model: str
    weight_dtype: Literal["bf16", "fp16", "fp8"]
    kv_dtype: Literal["bf16", "fp16", "fp8"]
    tp: int
    batch: int
    isl: int
    osl: int
    prefill_ms: float
    decode_step_ms: float


def load_step_latencies(source: str | None = None) -> list[StepLatency]:
    """The bundled step-latency measurements (optionally one ``source``'s)."""
    text = STEP_LATENCY_FILE.read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    points = [StepLatency.model_validate(row) for row in csv.DictReader(io.StringIO(body))]
    return [p for p in points if source is None or p.source == source]


@dataclass(frozen=True)
class Predicted:
    """pdplan's prefill and mean decode step for each measurement, seconds (NaN where the layout is refused)."""

    points: tuple[StepLatency, ...]
    prefill_s: np.ndarray
    decode_step_s: np.ndarray


def predict_step_latencies(points: list[StepLatency], engine: str | EngineProfile = DEFAULT_ENGINE) -> Predicted:
    """pdplan's step times for each measured configuration under an engine profile: the prefill of
    ``batch x isl`` tokens in one step, and the decode step at the mean context ``isl + (osl + 1) / 2`` (a decode
    step's time is linear in its context, so this is the mean over the run). One vectorised call per layout."""
    by_layout: dict[tuple, list[int]] = defaultdict(list)
    for i, p in enumerate(points):
        by_layout[(p.gpu, p.model, p.tp, p.weight_dtype, p.kv_dtype)].append(i)
    prefill = np.full(len(points), np.nan)
    decode = np.full(len(points), np.nan)
    for (gpu_id, model_id, tp, wd, kd), idx in by_layout.items():
        gpu = apply_engine(load_gpu(gpu_id), engine)
        setup = setup_for(load_model(model_id), gpu, tp=tp, weight_dtype=wd, kv_dtype=kd)
        b = np.array([points[i].batch for i in idx], dtype=float)
        isl = np.array([points[i].isl for i in idx], dtype=float)
        osl = np.array([points[i].osl for i in idx], dtype=float)
        prefill[idx] = step_time_s(step_groups(setup, isl, 0.0, b, "prefill"), setup)
        decode[idx] = step_time_s(step_groups(setup, 1.0, isl + (osl + 1) / 2 - 1, b, "decode"), setup)
    return Predicted(tuple(points), prefill, decode)


class PhaseError(BaseModel):
    """|predicted / measured - 1| over a set of measurements of one phase."""

    model_config = ConfigDict(frozen=True)

    engine: str
    source: str
    phase: Literal["prefill", "decode"]
    subset: str
    points: int
    median_abs_error: float
    p90_abs_error: float
    median_signed_error: float


def _summary(engine: str, source: str, phase: str, subset: str, err: np.ndarray) -> PhaseError | None:
    err = err[~np.isnan(err)]  # NaN: nothing to compare (a refused layout, no measurement); inf: a miss
    if not len(err):
        return None
    a = np.sort(np.abs(err))
    return PhaseError(engine=engine, source=source, phase=phase, subset=subset, points=len(a),  # type: ignore[arg-type]
                      median_abs_error=float(np.median(a)), p90_abs_error=float(a[math.ceil(0.9 * len(a)) - 1]),
                      median_signed_error=float(np.median(err)))


def profile_errors(engine: str = DEFAULT_ENGINE, by: tuple[str, ...] = ()) -> list[PhaseError]:
    """The profile's error per source and phase (and per value of each attribute in ``by``, e.g. ``"gpu"``,
    ``"tp"``): the measured sources it was fitted to and the ones it was not."""
    points = load_step_latencies()
    pred = predict_step_latencies(points, engine)
    out: list[PhaseError] = []
    for source in sorted({p.source for p in points}):
        mask = np.array([p.source == source for p in points])
        for phase, predicted, measured in (
            ("prefill", pred.prefill_s, np.array([p.prefill_ms for p in points]) / 1e3),
            ("decode", pred.decode_step_s, np.array([p.decode_step_ms for p in points]) / 1e3),
        ):
            err = predicted / measured - 1
            rows = [("all", mask)]
            for attr in by:
                for value in sorted({getattr(p, attr) for p in points if p.source == source}):
                    rows.append((f"{attr}={value}", mask & np.array([getattr(p, attr) == value for p in points])))
            rows.append(("batch 1-8, tp 4-8", mask & np.array([p.batch <= 8 and p.tp >= 4 for p in points])))
            for subset, m in rows:
                s = _summary(engine, source, phase, subset, err[m])
                if s is not None:
                    out.append(s)
    return out


# --- served measurements: a benchmark client against an engine's HTTP server ---------------------------
SERVING_LATENCY_FILE = DATA_DIR / "serving_latencies.csv"


class ServedRun(BaseModel):
    """One published serving benchmark run: a client streaming requests to an engine's OpenAI-compatible server,
    closed loop (``concurrency`` requests in flight) or open loop (Poisson at ``request_rate``); TTFT as the client
    saw it (the request path included) and TPOT (a request's mean inter-token time), milliseconds, each the
    ``*_stat`` ("mean" or "median") over the run's requests."""

    model_config = ConfigDict(frozen=True)

    source: str
    engine: Literal["vllm", "sglang", "trtllm"]
    engine_version: str
    gpu: str
    model: str
    weight_dtype: Literal["bf16", "fp16", "fp8", "fp4"]
    kv_dtype: Literal["bf16", "fp16", "fp8"]
    tp: int
    concurrency: int | None
    request_rate: float | None
    throughput_rps: float | None
    isl: float
    osl: float
    ttft_ms: float
    ttft_stat: Literal["mean", "median"]
    tpot_ms: float | None
    tpot_stat: Literal["mean", "median"]
    notes: str | None = None


def _optional(row: dict[str, str]) -> dict[str, str | None]:
    return {k: (None if v == "" else v) for k, v in row.items()}


def load_served_runs(engine: str | None = None, source: str | None = None) -> list[ServedRun]:
    """The bundled serving benchmark runs (optionally one engine's, one source's)."""
    text = SERVING_LATENCY_FILE.read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    runs = [ServedRun.model_validate(_optional(row)) for row in csv.DictReader(io.StringIO(body))]
    return [r for r in runs if (engine is None or r.engine == engine) and (source is None or r.source == source)]


@dataclass(frozen=True)
class PredictedServing:
    """pdplan's TTFT and TPOT (the statistic each run reports) for each served run, seconds; NaN where the
    serving model calls the run's load unstable or the layout is refused."""

    runs: tuple[ServedRun, ...]
    ttft_s: np.ndarray
    tpot_s: np.ndarray


def served_rate_rps(r: ServedRun) -> float:
    """The arrival rate a run offered: its Poisson rate (open loop), else the throughput it reached, else (a
    closed loop that did not print it) Little's law over its own latencies, concurrency / (TTFT + (osl - 1) TPOT)."""
    if r.request_rate is not None:
        return r.request_rate
    if r.throughput_rps is not None:
        return r.throughput_rps
    assert r.concurrency is not None and r.tpot_ms is not None
    return r.concurrency / ((r.ttft_ms + (r.osl - 1) * r.tpot_ms) / 1e3)


def predict_served_runs(runs: list[ServedRun], engine: str | EngineProfile = DEFAULT_ENGINE,
                        max_batched_tokens: int = 8192) -> PredictedServing:
    """pdplan's serving model (``evaluate``'s computation) for each run: one instance of ``tp`` GPUs under the
    hybrid scheduler (running decodes and new prompts in one step, ``max_batched_tokens`` a step: vLLM V1's and
    SGLang's default on these GPUs) and the run's mean lengths: an open loop at its Poisson rate, a closed loop
    of ``concurrency`` requests by ``serving.closed.closed_loop``."""
    from .serving import Deployment, Pool, PoolModel, Workload, analyse
    from .serving.closed import closed_loop

    ttft = np.full(len(runs), np.nan)
    tpot = np.full(len(runs), np.nan)
    gpus: dict[str, GPUSpec] = {}
    for i, r in enumerate(runs):
        gpu = gpus.setdefault(r.gpu, apply_engine(load_gpu(r.gpu), engine))
        model = load_model(r.model)
        pool = Pool(gpu=r.gpu, tp=r.tp, weight_dtype=r.weight_dtype, kv_dtype=r.kv_dtype,
                    **({"max_batch": r.concurrency} if r.concurrency else {}))
        d = Deployment(mode="mixed", scheduler="hybrid", pool=pool, max_batched_tokens=max_batched_tokens)
        rate = served_rate_rps(r)
        w = Workload(rate=rate, isl=r.isl, osl=r.osl)
        pm = PoolModel.build(model, pool, w, gpu)
        if not pm.fits:
            continue
        if r.request_rate is None and r.concurrency is not None:  # a closed loop (means: its lengths are fixed)
            c = closed_loop(pm, r.isl, r.osl, r.concurrency, max_batched_tokens)
            ttft[i], tpot[i] = c.ttft_s, c.tpot_s
            continue
        p = 0.5
        a = analyse(model, d, w, np.array([rate]), p, (pm,))
        if not bool(a.stable[0]):
            continue
        ttft[i] = float((a.ttft_mean_s if r.ttft_stat == "mean" else a.ttft_p_s)[0])
        tpot[i] = float((a.tpot_mean_s if r.tpot_stat == "mean" else a.tpot_p_s)[0])
    return PredictedServing(tuple(runs), ttft, tpot)


def served_fitted(profile: EngineProfile, run: ServedRun) -> bool:
    """Whether the profile was fitted on this run (its source fitted, and a dense model where only those were)."""
    return run.source in profile.fitted_sources and (
        profile.fitted_models == "all" or load_model(run.model).moe is None)


def served_errors(engine: str | EngineProfile, runs: list[ServedRun] | None = None,
                  by: tuple[str, ...] = ("source",)) -> list[PhaseError]:
    """A profile's error on served runs (by default the runs of its own engine; every run for ``generic``):
    over all of them, the fitted and the held-out ones, and per value of each attribute in ``by``. TTFT is
    reported as phase "prefill", TPOT as "decode"; a run pdplan cannot serve is an infinite error."""
    profile = engine if isinstance(engine, EngineProfile) else load_engine(engine)
    if runs is None:
        runs = [r for r in load_served_runs() if profile.engine in ("generic", r.engine)]
    pred = predict_served_runs(runs, profile)
    fitted = np.array([served_fitted(profile, r) for r in runs], dtype=bool)
    measured_ttft = np.array([r.ttft_ms for r in runs]) / 1e3
    measured_tpot = np.array([np.nan if r.tpot_ms is None else r.tpot_ms for r in runs]) / 1e3
    unstable = np.isnan(pred.ttft_s)  # the engine served it; pdplan's layout does not fit, or its load is unstable
    out: list[PhaseError] = []
    for phase, predicted, measured in (("prefill", pred.ttft_s, measured_ttft), ("decode", pred.tpot_s, measured_tpot)):
        err_all = np.where(unstable & np.isfinite(measured), np.inf, predicted / measured - 1)
        subsets = [("all", np.ones(len(runs), dtype=bool)), ("fitted", fitted), ("held out", ~fitted)]
        for attr in by:
            for value in sorted({getattr(r, attr) for r in runs}):
                subsets.append((f"{attr}={value}", np.array([getattr(r, attr) == value for r in runs])))
        for subset, m in subsets:
            s = _summary(profile.id, "served", phase, subset, err_all[m])
            if s is not None:
                out.append(s)
    return out


def engine_errors(engine: str = DEFAULT_ENGINE) -> list[PhaseError]:
    """Every error a profile is reported with: on the engine step latencies (a TensorRT-LLM profile and
    ``generic``, whose GPU defaults were fitted to TensorRT-LLM), per GPU and tp, and on the served runs of its
    engine (``served_errors``), fitted, held out and per source."""
    profile = load_engine(engine)
    steps = profile_errors(profile.id, by=("gpu", "tp")) if profile.engine in ("trtllm", "generic") else []
    return steps + served_errors(profile, by=("source",))
