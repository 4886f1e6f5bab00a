"""``calibrate``: fit a GPU's efficiencies to a user's own serving benchmarks.

Each benchmark run (``calculator.benchfiles``) is predicted by pdplan's serving model itself
(``calculator.serving.evaluate``): the deployment the user ran (one instance, ``tp`` GPUs, the
engine's scheduler) and the run's mean prompt and output lengths. An open-loop run (a Poisson
``request_rate``) arrives at the throughput it achieved; a closed-loop run (``max_concurrency`` N and no rate:
N requests always in flight) is ``serving.closed.closed_loop``, since a Poisson queue at a closed loop's
throughput with N slots would be saturated by construction. The free constants, compute and memory
efficiency and the fixed cost per step, minimise the squared log errors of the median TTFT and the
median TPOT over all runs (Nelder-Mead in log efficiency, bounded). The held-out error is two-fold:
runs sorted by load, alternate ones fitted, the others predicted, and the other way round.

The fitted profile is a calibration YAML (``calculator.calibration``) that ``estimate``,
``evaluate``, ``plan``, REST and the CLI accept, as they accept ``pdplan validate``'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hardware_db.schema import Efficiency, GPUSpec, ModelSpec

from . import budget
from .calibration import efficiency_body
from .arguments import gpu_spec, model_spec
from .benchfiles import BenchPoint, read_benchmark_files
from .errors import InputError
from .formula import quieted
from .serving import Deployment, Pool, PoolModel, Workload, analyse
from .serving.closed import closed_loop

FITTED = ("compute", "memory", "step_overhead_us")
"""The constants a serving benchmark constrains: prefill (TTFT) is compute-bound, decode (TPOT) memory-bound, and
the fixed cost per step shows at small batches."""
MAX_ITERATIONS = 120
"""Nelder-Mead iterations per fit (each evaluates every run once): bounds a request's work."""
MISS_PENALTY = 3.0
"""The log error charged to a run the model calls unstable at the run's throughput (ln 20)."""


class RunFit(BaseModel):
    """One benchmark run: measured against predicted median TTFT and TPOT, seconds."""

    model_config = ConfigDict(frozen=True)

    source: str
    throughput_rps: float
    max_concurrency: int | None
    isl_mean: float
    osl_mean: float
    ttft_measured_s: float
    ttft_predicted_s: float | None
    tpot_measured_s: float | None
    tpot_predicted_s: float | None
    held_out_ttft_predicted_s: float | None = Field(default=None, description="predicted by the fit on the other half")
    held_out_tpot_predicted_s: float | None = None

    @property
    def errors(self) -> list[float]:
        return _errors(self.ttft_predicted_s, self.ttft_measured_s, self.tpot_predicted_s, self.tpot_measured_s)

    @property
    def held_out_errors(self) -> list[float]:
        return _errors(self.held_out_ttft_predicted_s, self.ttft_measured_s, self.held_out_tpot_predicted_s,
                       self.tpot_measured_s)


def _errors(tp: float | None, tm: float, dp: float | None, dm: float | None) -> list[float]:
    out = [math.inf if tp is None else tp / tm - 1]
    if dm is not None:
        out.append(math.inf if dp is None else dp / dm - 1)
    return out


class CalibrationFit(BaseModel):
    """The fitted efficiencies, every run's fit and held-out errors, and what was fitted on what."""

    model_config = ConfigDict(frozen=True)

    model: str
    gpu: str
    tp: int
    weight_dtype: str
    scheduler: str
    efficiency: Efficiency
    fitted: tuple[str, ...]
    runs: tuple[RunFit, ...]
    median_abs_error: float = Field(description="over every run's median TTFT and TPOT, fitted on all runs (runs "
                                    "the model calls unstable at their throughput are counted in unstable_runs)")
    p90_abs_error: float
    max_abs_error: float = Field(default=0.0, description="the largest of them: every run's TTFT and TPOT is within "
                                 "this of the fitted profile's prediction")
    unstable_runs: int = Field(default=0, description="runs whose throughput the fitted model calls unstable")
    held_out_median_abs_error: float | None = Field(description="two-fold: each half predicted by the other's fit; "
                                                    "None with fewer than 4 runs")
    held_out_p90_abs_error: float | None
    held_out_unstable_runs: int = 0


def _deployment(gpu_id: str, tp: int, weight_dtype: str, kv_dtype: str, run: BenchPoint, scheduler: str,
                max_batched_tokens: int, chunk_tokens: int | None) -> Deployment:
    pool = Pool(gpu=gpu_id, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype,  # type: ignore[arg-type]
                **({"max_batch": run.max_concurrency} if run.max_concurrency else {}))
    if chunk_tokens is not None:
        return Deployment(mode="chunked", pool=pool, chunk_tokens=chunk_tokens)
    return Deployment(mode="mixed", scheduler=scheduler, pool=pool, max_batched_tokens=max_batched_tokens)  # type: ignore[arg-type]


def _predict(model: ModelSpec, gpu: GPUSpec, runs: Sequence[BenchPoint], setup: dict[str, Any]) -> list[tuple[float | None, float | None]]:
    """(median TTFT, median TPOT) of each run, or (None, None) where the model calls the run's throughput
    unstable: ``evaluate``'s 50th-percentile computation (``analyse`` at p = 0.5), without its other percentiles.
    Open-loop runs on the same deployment with the same mean lengths (a rate sweep) share one ``analyse`` call
    over their throughputs (it is element-wise in the rate)."""
    out: list[tuple[float | None, float | None]] = [(None, None)] * len(runs)
    sweeps: dict[tuple[Deployment, float, float], list[int]] = {}
    for i, r in enumerate(runs):
        budget.check()
        d = _deployment(gpu.id, run=r, **setup)
        if r.request_rate_rps is None and r.max_concurrency is not None and (
                d.mode == "chunked" or d.scheduler == "hybrid"):
            # a closed loop: N requests always in flight, no Poisson queue (its means; fixed lengths)
            pool = _pool_model(model, d, Workload(rate=r.throughput_rps, isl=r.isl_mean, osl=r.osl_mean), gpu)[0]
            c = closed_loop(pool, r.isl_mean, r.osl_mean, r.max_concurrency,
                            setup["chunk_tokens"] or setup["max_batched_tokens"])
            out[i] = (c.ttft_s, c.tpot_s)
        else:
            sweeps.setdefault((d, r.isl_mean, r.osl_mean), []).append(i)
    for (d, isl, osl), members in sweeps.items():
        budget.check()
        w = Workload(rate=runs[members[0]].throughput_rps, isl=isl, osl=osl)
        a = analyse(model, d, w, np.array([runs[i].throughput_rps for i in members]), 0.5, _pool_model(model, d, w, gpu))
        for j, i in enumerate(members):
            if bool(a.stable[j]):
                out[i] = (float(a.ttft_p_s[j]), float(a.tpot_p_s[j]))
    return out


def _pool_model(model: ModelSpec, d: Deployment, w: Workload, gpu: GPUSpec) -> tuple[PoolModel, ...]:
    """The deployment's pool models; a layout that does not fit the GPU's memory is an error naming ``tp``."""
    pools = tuple(PoolModel.build(model, p, w, gpu) for p in d.pools)
    if not all(pm.fits for pm in pools):
        raise InputError("tp", f"{pools[0].reason}")
    return pools


def _with(gpu: GPUSpec, x: np.ndarray) -> GPUSpec:
    eff = gpu.efficiency.model_copy(update={"compute": float(np.exp(x[0])), "memory": float(np.exp(x[1])),
                                            "step_overhead_us": float(x[2]) * 1e3})
    return gpu.model_copy(update={"efficiency": eff})


LOWER = np.array([math.log(0.02), math.log(0.02), 0.0])
UPPER = np.array([0.0, 0.0, 50.0])  # efficiencies at most 1; step overhead at most 50 ms


def _loss(model: ModelSpec, gpu: GPUSpec, runs: Sequence[BenchPoint], setup: dict[str, Any], x: np.ndarray) -> float:
    total = 0.0
    for r, (ttft, tpot) in zip(runs, _predict(model, _with(gpu, x), runs, setup), strict=True):
        assert r.ttft_p50_s is not None
        total += (math.log(ttft / r.ttft_p50_s) if ttft else MISS_PENALTY) ** 2
        if r.tpot_p50_s:
            total += (math.log(tpot / r.tpot_p50_s) if tpot else MISS_PENALTY) ** 2
    return total


def nelder_mead(f, x0: np.ndarray, scale: np.ndarray | float, iterations: int,  # type: ignore[no-untyped-def]
                lower: np.ndarray | float = -np.inf, upper: np.ndarray | float = np.inf) -> np.ndarray:
    """Minimise ``f`` over the box [lower, upper] (points are clipped into it): the simplex method, at most
    ``iterations`` steps, stopping early once the simplex's values agree to 1e-6."""
    def g(x: np.ndarray) -> float:
        return f(np.clip(x, lower, upper))

    n = x0.size
    simplex = [np.clip(x0, lower, upper)] + [np.clip(x0 + scale * np.eye(n)[i], lower, upper) for i in range(n)]
    values = [g(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < 1e-6 * (1 + abs(values[0])):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = g(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = g(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = g(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [g(x) for x in simplex[1:]]
    return np.clip(simplex[int(np.argmin(values))], lower, upper)


def _fit(model: ModelSpec, gpu: GPUSpec, runs: Sequence[BenchPoint], setup: dict[str, Any]) -> GPUSpec:
    e = gpu.efficiency
    x0 = np.array([math.log(e.compute), math.log(e.memory), e.step_overhead_us / 1e3])
    x = nelder_mead(lambda x: _loss(model, gpu, runs, setup, x), x0, np.array([0.4, 0.4, 0.5]), MAX_ITERATIONS,
                    LOWER, UPPER)
    return _with(gpu, x)


@quieted
def calibrate(model: str | ModelSpec, gpu: str | GPUSpec, runs: Iterable[BenchPoint] | None = None, *,
              files: Iterable[str | os.PathLike[str]] | None = None, tp: int = 1, weight_dtype: str = "bf16",
              kv_dtype: str = "bf16", scheduler: str = "hybrid", max_batched_tokens: int = 8192,
              chunk_tokens: int | None = None) -> CalibrationFit:
    """Fit ``gpu``'s compute and memory efficiency and step overhead to benchmark ``runs`` (or the runs in
    ``files``) of ``model`` served on one instance of ``tp`` GPUs (see the module docstring)."""
    m, g = model_spec(model), gpu_spec(gpu)
    if (runs is None) == (files is None):
        raise InputError("files", "give either benchmark runs or result files")
    points = tuple(runs) if runs is not None else read_benchmark_files(files)  # type: ignore[arg-type]
    if not points:
        raise InputError("files", "no benchmark runs to fit")
    if any(p.ttft_p50_s is None or p.ttft_p50_s <= 0 for p in points):
        raise InputError("files", "every run needs a positive median TTFT")
    setup = {"tp": tp, "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "scheduler": scheduler,
             "max_batched_tokens": max_batched_tokens, "chunk_tokens": chunk_tokens}
    _deployment(g.id, run=points[0], **setup)  # layout errors (tp, dtypes, chunk) before any fitting
    fitted = _fit(m, g, points, setup)
    preds = _predict(m, fitted, points, setup)
    held: list[tuple[float | None, float | None]] = [(None, None)] * len(points)
    if len(points) >= 4:
        order = sorted(range(len(points)), key=lambda i: (points[i].isl_mean, points[i].throughput_rps))
        halves = (order[0::2], order[1::2])
        for train, test in (halves, halves[::-1]):
            half_fit = _fit(m, g, [points[i] for i in train], setup)
            for i, pr in zip(test, _predict(m, half_fit, [points[i] for i in test], setup), strict=True):
                held[i] = pr
    fits = tuple(RunFit(source=p.source, throughput_rps=p.throughput_rps, max_concurrency=p.max_concurrency,
                        isl_mean=p.isl_mean, osl_mean=p.osl_mean, ttft_measured_s=p.ttft_p50_s,  # type: ignore[arg-type]
                        ttft_predicted_s=pr[0], tpot_measured_s=p.tpot_p50_s, tpot_predicted_s=pr[1],
                        held_out_ttft_predicted_s=h[0], held_out_tpot_predicted_s=h[1])
                 for p, pr, h in zip(points, preds, held, strict=True))
    errs = np.abs([e for f in fits for e in f.errors if math.isfinite(e)])
    if errs.size == 0:
        raise InputError("files", f"{m.id} on {g.id} tp{tp} cannot serve any run's throughput at any fitted efficiency "
                         "(the model calls every run unstable): check --model, --gpu and --tp against the benchmark")
    held_all = [e for f in fits for e in f.held_out_errors] if len(points) >= 4 else None
    held_errs = None if held_all is None else np.abs([e for e in held_all if math.isfinite(e)])
    if held_errs is not None and held_errs.size == 0:
        held_errs = None
    eff = fitted.efficiency.model_copy(update={"fitted_on": f"{len(points)} serving benchmark runs of {m.id} on "
                                                            f"{g.id} tp{tp}"})
    # the fit leaves the block-scaled fp8 limit as it found it: a property of the GPU's tensor cores, so the
    # calibration does not carry the fitting GPU's (applied to another GPU, that GPU's own holds)
    eff = Efficiency.model_validate(eff.model_dump(exclude={"block_scaled_memory"}))
    return CalibrationFit(
        model=m.id, gpu=g.id, tp=tp, weight_dtype=weight_dtype, scheduler="chunked" if chunk_tokens else scheduler,
        efficiency=eff, fitted=FITTED, runs=fits, median_abs_error=float(np.median(errs)),
        p90_abs_error=float(np.percentile(errs, 90)), max_abs_error=float(np.max(errs)),
        unstable_runs=sum(f.ttft_predicted_s is None for f in fits),
        held_out_unstable_runs=0 if held_all is None else sum(f.held_out_ttft_predicted_s is None for f in fits),
        held_out_median_abs_error=None if held_errs is None else float(np.median(held_errs)),
        held_out_p90_abs_error=None if held_errs is None else float(np.percentile(held_errs, 90)),
    )


def calibration_yaml(fit: CalibrationFit) -> str:
    """The fitted profile as calibration YAML (``calculator.calibration``), with its provenance and errors."""
    import yaml

    body = {"device": fit.gpu, "model": fit.model, "tp": fit.tp, "weight_dtype": fit.weight_dtype,
            "scheduler": fit.scheduler, "fitted": list(fit.fitted), "runs": len(fit.runs),
            "median_abs_error": round(fit.median_abs_error, 4), "p90_abs_error": round(fit.p90_abs_error, 4),
            "max_abs_error": round(fit.max_abs_error, 4),
            "held_out_median_abs_error": None if fit.held_out_median_abs_error is None
            else round(fit.held_out_median_abs_error, 4),
            "efficiency": efficiency_body(fit.efficiency)}
    return yaml.safe_dump(body, sort_keys=False)


__all__ = ["FITTED", "CalibrationFit", "RunFit", "calibrate", "calibration_yaml"]
