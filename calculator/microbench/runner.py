"""``run``: measure the device and the models, fit the calibration on half the grid, predict every point."""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import platform
import statistics
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import numpy as np

from hardware_db.schema import Efficiency, GPUSpec, ModelSpec

from .ceilings import best_of, device_spec, measure_ceilings, model_dtype
from .fit import CEILING, Design, design, fit_efficiency, predict_point_s
from .models import BENCH_MODELS, GRIDS, split_of
from .results import (
    Ceilings,
    FitResult,
    KVCheck,
    Measurement,
    ParamCheck,
    PhaseError,
    Point,
    Stalls,
    ValidationReport,
)
from .timing import Guard

INSTALL_HINT = "pip install 'pdplan[bench]'"
Progress = Callable[[int, int, str], None]
"""``progress(done, total, step)``, called as each step of ``run`` begins (device ceilings, building
a model, one sweep of a model's grid, the ceilings again, the fit) and once more at the end with
``done == total``. The units are measured points (a matmul size or the copy, a grid point; one for
a model build or the fit), so ``done / total`` follows the time."""


class TorchMissingError(ImportError):
    """torch or transformers is not installed; the message says how to install them."""


def require_torch() -> None:
    """Raise TorchMissingError unless torch and transformers are importable (transformers is only imported after torch)."""
    missing = []
    try:
        import torch  # noqa: F401
    except ImportError:
        missing.append("torch")
    try:
        found = importlib.util.find_spec("transformers") is not None
    except ValueError:  # a module object without a spec (stubbed out)
        found = False
    if not found:
        missing.append("transformers")
    if missing:
        raise TorchMissingError(
            f"the microbenchmark needs {' and '.join(missing)}: {INSTALL_HINT} "
            "(pins the CPU build of torch 2.13.0; on a CUDA machine your own torch is used)"
        )


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def run(quick: bool = False, device: str = "cpu", out_dir: Path | None = None, seed: int = 0,
        threads: int | None = None, progress: Progress | None = None) -> ValidationReport:
    """Measure ceilings and the benchmark models on ``device``, fit, predict, and (with ``out_dir``) write outputs.

    ``device`` is ``cpu``, ``cuda`` or ``auto`` (cuda when available). ``quick`` runs the reduced grid
    (under a minute on a 2-core CPU). ``progress`` hears of each step (see ``Progress``). Raises
    ``TorchMissingError`` without torch/transformers.
    """
    require_torch()
    import torch

    from .measure import ModelBench

    t0 = time.perf_counter()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: must be cpu, cuda or auto, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for but torch sees no CUDA device")
    n_threads = threads or _threads()
    if device == "cpu":
        torch.set_num_threads(n_threads)
    grid = GRIDS[(device, quick)]  # type: ignore[index]

    models = [BENCH_MODELS[name] for name in grid.models]
    points = len(grid.prefill_points()) + len(grid.decode_points())
    ceiling = len(grid.matmul_sizes) + 1
    total, done = 2 * ceiling + len(models) * (1 + grid.sweeps * points) + 1, 0

    def begin(what: str) -> None:
        if progress is not None:
            progress(done, total, what)

    def end(units: int) -> None:
        nonlocal done
        done += units

    begin("device ceilings")
    guard = Guard.for_device(device, max_wait_s=5.0 if quick else 30.0, dtype=model_dtype(device))
    ceilings = measure_ceilings(device, grid.matmul_sizes, grid.copy_bytes, n_threads, quick, guard)
    end(ceiling)
    benches = []
    for m in models:
        begin(f"building {m.id}")
        benches.append(ModelBench(m, grid, device, ceilings.dtype, seed))
        end(1)
    for sweep in range(grid.sweeps):  # whole-grid sweeps, so that a stall of the machine hits one sweep of a point
        for bench in benches:
            begin(f"sweep {sweep + 1}/{grid.sweeps} of {bench.m.id}")
            bench.sweep(guard, check_kv=sweep == 0)
            end(points)
    measurements = [x for b in benches for x in b.measurements()]
    kv_checks = [k for b in benches for k in b.kv_checks]
    param_checks = [b.param_check for b in benches]
    for bench in benches:
        bench.close()
    # the ceilings again, after the models: a stall during the first measurement cannot lower them
    begin("device ceilings again")
    ceilings = best_of(ceilings, measure_ceilings(device, grid.matmul_sizes, grid.copy_bytes, n_threads, quick, guard))
    end(ceiling)
    begin("fit and held-out error")
    stalls = None if guard.probe is None else Stalls(
        probe_baseline_s=guard.baseline_s, waited_s=guard.waited_s, remeasured=guard.remeasured,
        unstable=guard.unstable, timeouts=guard.timeouts)
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": _version("transformers"), "pdplan": _version("pdplan")}
    report = analyse(ceilings, models, measurements, kv_checks, param_checks, quick=quick, seed=seed,
                     date=dt.date.today().isoformat(), versions=versions, stalls=stalls)
    report = report.model_copy(update={"wall_s": time.perf_counter() - t0})
    end(1)
    begin("done")
    if out_dir is not None:
        from .report import write_outputs

        write_outputs(report, Path(out_dir))
    return report


def analyse(
    ceilings: Ceilings, models: list[ModelSpec], measurements: list[Measurement], kv_checks: list[KVCheck],
    param_checks: list[ParamCheck], *, quick: bool, seed: int, date: str, versions: dict[str, str],
    stalls: Stalls | None = None,
) -> ValidationReport:
    """Fit the calibration on the fit half of the measurements and predict every point (pure: no torch)."""
    dtype = ceilings.dtype
    bare = device_spec(ceilings, date=date)
    by_id = {m.id: m for m in models}
    index = {m.id: k for k, m in enumerate(models)}
    measured = np.array([r.measured_s for r in measurements])
    splits = [split_of(index[r.model], *r.grid_index) for r in measurements]
    d = Design.concat([design(by_id[r.model], bare, r.phase, np.array([r.tokens]), np.array([r.batch]), dtype)
                       for r in measurements])
    fit_rows = np.array([s == "fit" for s in splits])
    fitted_on = f"calculator.microbench on {ceilings.device_name}, {date}: {int(fit_rows.sum())} points (fit half)"
    fit = fit_efficiency(d.take(fit_rows), measured[fit_rows], fitted_on=fitted_on)
    eff = fit.efficiency
    spec = device_spec(ceilings, eff, date=date)

    fast = d.predict_s(eff)
    points = []
    for r, y, split, t_fast in zip(measurements, measured, splits, fast, strict=True):
        m = by_id[r.model]
        pred, bound = predict_point_s(m, spec, r.phase, r.tokens, r.batch, dtype, eff)
        ceil, _ = predict_point_s(m, spec, r.phase, r.tokens, r.batch, dtype, CEILING)
        if abs(pred / t_fast - 1) > 1e-9:
            raise AssertionError(f"fit design and calculator.estimate disagree at {r}: {t_fast} vs {pred}")
        points.append(Point(model=r.model, phase=r.phase, batch=r.batch, tokens=r.tokens, grid_index=r.grid_index,
                            split=split, measured_s=float(y), sweeps_s=r.sweeps_s, predicted_s=pred, ceiling_s=ceil,
                            bound=bound))
    errors = [phase_error(points, phase, subset, by_id, spec, dtype, eff)
              for phase in ("prefill", "decode") for subset in ("held_out", "fit", "all_at_ceilings")]
    return ValidationReport(
        date=date, quick=quick, seed=seed, wall_s=0.0, versions=versions, ceilings=ceilings, device_spec=spec,
        models=tuple(models), points=tuple(points), kv_checks=tuple(kv_checks), param_checks=tuple(param_checks),
        fit=FitResult(efficiency=eff, n_points=int(fit_rows.sum()), rms_rel_error=fit.rms_rel_error,
                      method="least squares of the relative errors on the fit half: log grid over (eta_c, eta_m) in "
                             "[1e-3, 1], refined four times around the best cell; closed-form non-negative "
                             "(kernel latency, step overhead) per cell"),
        errors=tuple(errors), stalls=stalls,
        notes=_notes(kv_checks, param_checks, ceilings.device) + ((stalls.summary,) if stalls else ()),
    )


def reanalyse(report: ValidationReport) -> ValidationReport:
    """Fit and predict a saved report's measurements again (e.g. after a change to the model)."""
    measurements = [Measurement(model=p.model, phase=p.phase, batch=p.batch, tokens=p.tokens, grid_index=p.grid_index,
                                sweeps_s=p.sweeps_s) for p in report.points]
    new = analyse(report.ceilings, list(report.models), measurements, list(report.kv_checks), list(report.param_checks),
                  quick=report.quick, seed=report.seed, date=report.date, versions=report.versions, stalls=report.stalls)
    return new.model_copy(update={"wall_s": report.wall_s})


def phase_error(points: list[Point], phase: str, subset: str, models: dict[str, ModelSpec], device: GPUSpec,
                dtype: str, eff: Efficiency) -> PhaseError:
    """Median and max |pred/meas - 1| of a phase over a subset, with the worst point and its likely cause."""
    if subset == "all_at_ceilings":
        pts = [p for p in points if p.phase == phase]
        errs = [abs(p.ceiling_s / p.measured_s - 1) for p in pts]
        preds = [p.ceiling_s for p in pts]
    else:
        pts = [p for p in points if p.phase == phase and p.split == subset]
        errs = [abs(p.rel_error) for p in pts]
        preds = [p.predicted_s for p in pts]
    if not pts:
        raise ValueError(f"no {phase} points in the {subset} subset")
    k = int(np.argmax(errs))
    worst = pts[k]
    if subset == "all_at_ceilings":
        reason = ("bare ceilings: every efficiency 1 and no kernel or step latency, so the model predicts the "
                  "fastest the measured ceilings allow")
    else:
        reason = explain(worst, models[worst.model], device, dtype, eff)
    return PhaseError(phase=phase, subset=subset, n=len(pts), median_abs_rel_error=float(np.median(errs)),  # type: ignore[arg-type]
                      max_abs_rel_error=float(errs[k]), worst=worst.label, worst_predicted_s=preds[k],
                      worst_measured_s=worst.measured_s, reason=reason)


def explain(p: Point, m: ModelSpec, device: GPUSpec, dtype: str, eff: Efficiency) -> str:
    """The known cause that best fits where and which way the model misses a point."""
    d = design(m, device, p.phase, np.array([p.tokens]), np.array([p.batch]), dtype)
    compute = float((d.compute_s / eff.compute).sum())
    memory = float((d.memory_s / eff.memory).sum())
    latency = float(d.kernels[0] * eff.kernel_latency_us * 1e-6 + eff.step_overhead_us * 1e-6)
    total = float(d.predict_s(eff)[0])
    kv_share = float(d.memory_s[0, -1] / d.memory_s[0].sum())  # the attention group (last) moves the KV cache
    under = p.rel_error < 0
    sweep = min(p.sweeps_s, key=statistics.median)
    spread = (max(sweep) - min(sweep)) / p.measured_s
    noise = f" (its timed repeats spread {spread:.0%})"
    window = m.sliding_window or 0
    if p.phase == "prefill" and m.num_sliding_layers and p.tokens > window and under:
        return (f"the {m.num_sliding_layers} sliding layers run SDPA over the whole {p.tokens}-token causal score matrix "
                f"with the window as a mask, while pdplan counts only the {window}-token window's pairs" + noise)
    if p.phase == "decode" and under and p.batch > 1 and abs(compute + memory + latency - p.measured_s) < 0.15 * p.measured_s:
        return (f"the step's multiply-adds take {compute * 1e3:.1f} ms at the fitted rate and its weight and KV stream "
                f"{memory * 1e3:.1f} ms; the measured {p.measured_s * 1e3:.1f} ms is close to their sum plus latency, "
                "not the larger of the two: small-batch GEMMs here do not hide the arithmetic under the weight stream, "
                "which the roofline assumes" + noise)
    if p.phase == "decode" and not under and p.batch == 1 and memory > compute:
        return ("a batch-1 step streams the weights faster than the fitted memory efficiency: the fit lowers eta_m to "
                "absorb the arithmetic that larger batches do not overlap with the weight stream" + noise)
    if p.phase == "decode" and under and kv_share > 0.15:
        return (f"the KV cache is {kv_share:.0%} of the step's bytes, and attention over it (SDPA with a mask over the "
                "static cache) runs below the copy bandwidth" + noise)
    if latency / total > 0.5:
        return (f"{latency / total:.0%} of the predicted step is fixed latency (step overhead + per-kernel latency): "
                "transformers' eager Python dispatch, which is not the same fixed cost per kernel for every shape" + noise)
    if p.phase == "decode" and p.bound == "compute":
        return (f"a batch-{p.batch} decode runs GEMMs with only {p.batch} rows, which reach a different fraction of the "
                "square-matmul ceiling than prefill's long GEMMs; one eta_c serves both" + noise)
    if p.phase == "prefill" and not under and p.bound == "compute":
        return (f"one eta_c ({eff.compute:.2f}) serves prefill's long GEMMs and decode's short ones; the fit settles "
                "between them, so a long prompt comes out slower than measured" + noise)
    if p.phase == "prefill" and p.tokens * p.batch <= 64:
        return (f"a {p.tokens * p.batch}-token forward runs small GEMMs below the large-matmul ceiling, and its "
                "non-GEMM work (norms, RoPE, softmax) is not in the roofline" + noise)
    return "no specific cause identified" + noise


def _notes(kv: list[KVCheck], params: list[ParamCheck], device: str) -> tuple[str, ...]:
    notes = []
    bad_kv = [c for c in kv if not c.exact]
    notes.append(f"KV bytes: {len(kv) - len(bad_kv)} of {len(kv)} cache checks equal calculator.kv_cache_bytes to the byte"
                 + (f"; MISMATCH in {', '.join(f'{c.model} {c.cache} b{c.batch}x{c.tokens}' for c in bad_kv)}"
                    if bad_kv else ""))
    bad_p = [c for c in params if not c.exact]
    notes.append(f"parameters: {len(params) - len(bad_p)} of {len(params)} transformers models have exactly "
                 "param_count(ModelSpec) parameters" + (f"; MISMATCH in {', '.join(c.model for c in bad_p)}" if bad_p else ""))
    if device == "cpu":
        notes.append("CPU: one process, torch intra-op threads = the cores this process may run on; the machine should "
                     "be otherwise idle (another busy process stalls every parallel region)")
    return tuple(notes)
