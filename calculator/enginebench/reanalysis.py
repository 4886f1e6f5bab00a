"""``reanalyse``: a saved serving report predicted again by this version of pdplan.

A report keeps everything its predictions were made from: the CPU ceilings, each instance's unloaded step
times and front end, the 1P1D connector's unloaded TTFT and the time it held the prefill instance, and the
offered rates. Reanalysis fits each instance's efficiencies again on its own step times (the step model may
have changed), splits the 1P1D move again, and asks ``evaluate`` for every load point, capacity and curve;
the measurements are left as they were. ``pdplan validate --serving --reanalyse DIR`` writes the result.

Each load point is predicted at the rate its requests were sent at (``LoadPoint.arrival_rate_rps``). A report
made before that rate was recorded gets it by replaying the run's random draws (``replayed_arrivals``).
"""

from __future__ import annotations

import datetime as dt
from importlib import metadata

import numpy as np

from hardware_db.schema import GPUSpec

from ..microbench.ceilings import device_spec
from ..microbench.results import Ceilings
from .client import poisson_arrivals
from .engine import CONFIGS
from .model import prompt
from .predict import (Drift, at_check, capacity_rps, curve, drift, fit_device, measured_steps, point_checks, predict,
                      prefill_s, split_transfer, with_link)
from .results import Calibration, Predicted, ServingReport

FALLBACK_MEMORY_BYTES = 16e9
"""RAM taken for a report that did not record it (those before 2026-12-04): the engine model's KV limit does not
bind above ~4 GB (MAX_NUM_SEQS sequences of MAX_MODEL_LEN tokens take ~0.3 GB), so any value above that
predicts the same."""


def measured_device(report: ServingReport) -> GPUSpec:
    """The CPU "device" of the report's ceilings (one engine thread), before any fit."""
    copy_bytes = 128 * 2**20
    return device_spec(Ceilings(
        device="cpu", device_name=report.machine, device_details=report.machine_details, threads=1,
        dtype=report.dtype, matmul=(), matmul_flops_per_s=report.matmul_gflops * 1e9, copy_bytes=copy_bytes,
        copy_time_s=2 * copy_bytes / (report.copy_gb_s * 1e9), memory_bytes_per_s=report.copy_gb_s * 1e9,
        memory_total_bytes=report.memory_total_bytes or FALLBACK_MEMORY_BYTES))


def replayed_arrivals(report: ServingReport) -> list[np.ndarray]:
    """Each load point's arrival times (s from its first), replayed from the run's seed: the runner draws, from one
    generator in this order, per configuration (1P1D first sends one warm-up request and the transfer's
    1 + ``TRANSFER_TRIES`` lone ones) and per load point ``requests_per_point`` prompts, then the Poisson gaps.
    Exact for reports of the runner from 2026-12-02 until it drew ``client.conditioned_arrivals`` (checked against
    the committed reports' measured throughput in tests); those reports, like every later one, record their
    arrival rates and do not need it."""
    from .runner import TRANSFER_TRIES

    if report.arrivals != "free":
        raise ValueError("only free exponential arrivals are replayed: this run recorded its arrival rates")

    rng = np.random.default_rng(0 if report.seed is None else report.seed)
    n, out, started = report.requests_per_point, [], set()
    for p in report.points:
        if CONFIGS[p.config].disaggregated and p.config not in started:
            for _ in range(2 + TRANSFER_TRIES):
                prompt(report.isl, rng)
        started.add(p.config)
        for _ in range(n):
            prompt(report.isl, rng)
        out.append(poisson_arrivals(rng, n, p.rate_rps))
    return out


def _arrival_rates(report: ServingReport) -> list[tuple[float, bool]]:
    """(arrival rate, replayed) per load point: as recorded, else replayed."""
    if all(p.arrival_rate_rps is not None for p in report.points):
        return [(p.arrival_rate_rps, p.arrival_rate_replayed) for p in report.points]  # type: ignore[misc]
    replay = replayed_arrivals(report)
    return [(p.arrival_rate_rps, p.arrival_rate_replayed) if p.arrival_rate_rps is not None
            else ((a.size - 1) / (a[-1] - a[0]), True) for p, a in zip(report.points, replay)]


def _refit(base: GPUSpec, calib: Calibration, dtype: str) -> tuple[Calibration, GPUSpec]:
    device, rms = fit_device(base, measured_steps(calib), dtype)
    return calib.model_copy(update={"efficiency": device.efficiency, "fit_rms_rel_error": rms}), device


def reanalyse(report: ServingReport) -> ServingReport:
    """The report with every prediction made again (see the module docstring); ``predicted_by`` names this
    pdplan and today's date. Each point keeps the fraction of capacity the run offered it at (its plan:
    ``runner.PLANS``), which chooses the points the accuracy bounds cover: a version that predicts a lower
    capacity does not move its hardest points out of them."""
    from .runner import PLANS

    unknown = sorted({c.config for c in report.calibrations} - set(CONFIGS)
                     | {p.config for p in report.points} - set(CONFIGS))
    if unknown:
        raise ValueError(f"reanalyse: configurations {unknown} are not the serving validation's ({sorted(CONFIGS)})")
    base = measured_device(report)
    dtype, isl, osl = report.dtype, report.isl, report.osl
    colocated: dict[str, tuple[Calibration, GPUSpec]] = {}
    calibrations = []
    for calib in report.calibrations:
        if CONFIGS[calib.config].disaggregated:
            continue
        colocated[calib.config] = _refit(base, calib, dtype)
        calibrations.append(colocated[calib.config][0])
    devices: dict[str, tuple[Calibration, GPUSpec]] = dict(colocated)
    for calib in report.calibrations:
        if not CONFIGS[calib.config].disaggregated:
            continue
        # as the run did: the calibration of the co-located instance that runs with chunking off, as 1P1D's do
        same = [v for k, v in colocated.items() if CONFIGS[k].chunk_tokens is None]
        if not same or calib.disaggregated_unloaded_ttft_s is None or calib.save_s is None:
            raise ValueError(f"reanalyse: {calib.config} needs a co-located calibration with chunking off and its "
                             f"unloaded TTFT and save")
        first, device = same[-1]
        old = next(c for c in report.calibrations if c.config == first.config)
        # the prefill engine's CPU time on a lone request: the save it was credited plus the prefill then fitted
        held = calib.save_s + prefill_s(base.model_copy(update={"efficiency": old.efficiency}), isl, dtype)
        move, save = split_transfer(device, isl, calib.disaggregated_unloaded_ttft_s, held,
                                    first.front_end_request_s, dtype)
        new = first.model_copy(update={"config": calib.config, "transfer_s": move, "save_s": save,
                                       "disaggregated_unloaded_ttft_s": calib.disaggregated_unloaded_ttft_s})
        devices[calib.config] = (new, with_link(device, isl, save, dtype))
        calibrations.append(new)
    points, curves = [], []
    arrivals = dict(zip((id(p) for p in report.points), _arrival_rates(report)))
    for name in dict.fromkeys(p.config for p in report.points):
        cfg = CONFIGS[name]
        calib, device = devices[name]
        cap = capacity_rps(cfg, device, isl, osl, dtype=dtype)
        curves.append(curve(name, cfg, device, cap, calib.front_end_s(cfg), isl, osl, dtype))
        mine = [p for p in report.points if p.config == name]
        checked = point_checks(mine, calib, cfg.disaggregated)
        plan = PLANS[report.quick][2]
        planned = plan if len(mine) == len(plan) else [p.fraction_of_capacity for p in mine]
        steps = measured_steps(calib)
        moved: dict[Drift, tuple[GPUSpec, float]] = {}
        for p, (check_d, check_p), frac in zip(mine, checked, planned, strict=True):
            rate, replayed = arrivals[id(p)]
            d = drift(steps, isl, check_d, check_p)
            if d not in moved:
                dev = device
                if d != Drift():
                    dev = at_check(base, steps, d, dtype)[0]
                    if cfg.disaggregated:  # the connector's save as the run measured it
                        dev = with_link(dev, isl, calib.save_s or 0.0, dtype)
                moved[d] = (dev, capacity_rps(cfg, dev, isl, osl, dtype=dtype))
            dev, cap_now = moved[d]
            checked_here = d != Drift() or check_d is not None or check_p is not None
            pred = Predicted.of(predict(cfg, dev, rate, isl, osl, dtype), calib.front_end_s(cfg))
            points.append(p.model_copy(update={
                "predicted": pred, "predicted_capacity_rps": cap, "fraction_of_capacity": frac,
                "arrival_rate_rps": rate, "arrival_rate_replayed": replayed,
                "capacity_at_check_rps": cap_now if checked_here else None}))
    last = next((c for c in calibrations if c.config == report.calibration.config), report.calibration)
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    return report.model_copy(update={
        "calibration": last, "calibrations": tuple(calibrations), "points": tuple(points), "curves": tuple(curves),
        "predicted_by": f"pdplan {_pdplan_version()}, reanalysed {today}"})


def _pdplan_version() -> str:
    try:
        return metadata.version("pdplan")
    except metadata.PackageNotFoundError:
        return "(not installed)"


__all__ = ["FALLBACK_MEMORY_BYTES", "measured_device", "reanalyse", "replayed_arrivals"]
