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
    err = err[np.isfinite(err)]
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
