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
from .measure import GROUPED_SDPA
from .models import BENCH_MODELS, grid_for, resolve_models, split_of
from .results import (
    CatalogPhaseError,
    CatalogReference,
    Ceilings,
    FitResult,
    KVCheck,
    Measurement,
    ParamCheck,
    PhaseError,
    Point,
    Stalls,
    ValidationReport,
    repeats_kv,
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
        threads: int | None = None, progress: Progress | None = None, models: list[str] | None = None,
        cuda_graphs: bool = True, reference_gpu: str | None = None, engine: str = "generic") -> ValidationReport:
    """Measure ceilings and the benchmark models on ``device``, fit, predict, and (with ``out_dir``) write outputs.

    ``device`` is ``cpu``, ``cuda`` or ``auto`` (cuda when available). ``quick`` runs the reduced grid
    (under a minute on a 2-core CPU). ``models`` replaces the grid's models: bench model ids or catalog
    llama/qwen2 models (random weights of their exact shapes; on CUDA they take ``CATALOG_GRID``).
    ``cuda_graphs`` times CUDA decode steps as graph replays (as serving engines run decode).
    ``reference_gpu`` (a catalog GPU id) also predicts every point on that entry as shipped, with ``engine``'s
    efficiencies. ``progress`` hears of each step (see ``Progress``). Raises ``TorchMissingError`` without
    torch/transformers and ``InputError`` naming a bad argument.
    """
    specs = None if models is None else resolve_models(models)
    if reference_gpu is not None:
        reference_spec(reference_gpu, engine)  # a bad id fails before anything is measured
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
    if reference_gpu is not None:
        dtype = model_dtype(device)
        if getattr(reference_spec(reference_gpu, engine).peak_tflops, dtype, None) is None:
            from ..errors import InputError

            raise InputError("gpu", f"{reference_gpu} has no {dtype} peak in the database, and this {device} runs "
                                    f"the models in {dtype}")
    if specs is not None:
        _check_memory(specs, device)
    n_threads = threads or _threads()
    if device == "cpu":
        torch.set_num_threads(n_threads)
    grid = grid_for(device, quick, specs)  # type: ignore[arg-type]
    models = specs or [BENCH_MODELS[name] for name in grid.models]
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
        benches.append(ModelBench(m, grid, device, ceilings.dtype, seed, cuda_graphs=cuda_graphs))
        end(1)
    if any(b.graph_failure for b in benches):  # one way of timing decode for every model: one fit covers them
        for bench in benches:
            bench.cuda_graphs = False
    for sweep in range(grid.sweeps):  # whole-grid sweeps, so that a stall of the machine hits one sweep of a point
        for bench in benches:
            begin(f"sweep {sweep + 1}/{grid.sweeps} of {bench.m.id}")
            bench.sweep(guard, check_kv=sweep == 0)
            end(points)
    measurements = [x for b in benches for x in b.measurements()]
    if out_dir is not None:  # the raw timings first: an analysis that fails leaves them for reanalysis
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "measurements.json").write_text(
            "[\n" + ",\n".join(x.model_dump_json() for x in measurements) + "\n]\n", encoding="utf-8")
    kv_checks = [k for b in benches for k in b.kv_checks]
    param_checks = [b.param_check for b in benches]
    graph_failures = [f"{b.m.id}: {b.graph_failure}" for b in benches if b.graph_failure]
    graphed = device == "cuda" and cuda_graphs and not graph_failures
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
                     date=dt.date.today().isoformat(), versions=versions, stalls=stalls,
                     decode_timing="cuda_graph" if graphed else "eager", reference_gpu=reference_gpu, engine=engine,
                     attention=GROUPED_SDPA)
    notes = tuple(f"a CUDA graph of a decode step could not be captured, so every model's decode steps were timed "
                  f"eager from then on ({f})" for f in graph_failures)
    report = report.model_copy(update={"wall_s": time.perf_counter() - t0, "notes": report.notes + notes})
    end(1)
    begin("done")
    if out_dir is not None:
        from .report import write_outputs

        write_outputs(report, Path(out_dir))
    return report


def analyse(
    ceilings: Ceilings, models: list[ModelSpec], measurements: list[Measurement], kv_checks: list[KVCheck],
    param_checks: list[ParamCheck], *, quick: bool, seed: int, date: str, versions: dict[str, str],
    stalls: Stalls | None = None, decode_timing: str = "eager", reference_gpu: str | None = None,
    engine: str = "generic", attention: str = "sdpa",
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
    options = fit_options(ceilings.device, decode_timing)
    fit = fit_efficiency(d.take(fit_rows), measured[fit_rows], fitted_on=fitted_on, **options)
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
    repeated = repeats_kv(attention, versions.get("transformers", ""))
    errors = [phase_error(points, phase, subset, by_id, spec, dtype, eff, repeated)
              for phase in ("prefill", "decode") for subset in ("held_out", "fit", "all_at_ceilings")]
    reference = None if reference_gpu is None else catalog_reference(points, by_id, reference_gpu, engine, dtype)
    return ValidationReport(
        date=date, quick=quick, seed=seed, wall_s=0.0, versions=versions, ceilings=ceilings, device_spec=spec,
        models=tuple(models), points=tuple(points), kv_checks=tuple(kv_checks), param_checks=tuple(param_checks),
        fit=FitResult(efficiency=eff, n_points=int(fit_rows.sum()), rms_rel_error=fit.rms_rel_error,
                      method="least squares of the relative errors on the fit half: log grid over (eta_c, eta_m) in "
                             "[1e-3, 1], refined four times around the best cell; closed-form non-negative "
                             "(kernel latency, step overhead" + (", cost per sequence" if options["per_sequence"] else "")
                             + ") per cell" + "".join(f"; {what}" for key, what in FIT_EXTRAS if options[key])),
        errors=tuple(errors), stalls=stalls, decode_timing=decode_timing, reference=reference,  # type: ignore[arg-type]
        attention=attention,
        notes=_notes(kv_checks, param_checks, ceilings.device) + ((stalls.summary,) if stalls else ()),
    )


def _check_memory(models: list[ModelSpec], device: str) -> None:
    """``InputError`` naming ``models`` where their weights together pass 80% of the device's memory (a run holds
    every model at once), before anything is built."""
    import torch

    from ..errors import InputError
    from ..params import param_count
    from ..precision import weight_bytes
    from .ceilings import ram_bytes

    dtype = model_dtype(device)
    total = float(torch.cuda.get_device_properties(0).total_memory) if device == "cuda" else ram_bytes()
    need = sum(param_count(m) for m in models) * weight_bytes(dtype)
    if need > 0.8 * total:
        raise InputError("models", f"their weights take {need / 1e9:.1f} GB together in {dtype}, over 80% of this "
                                   f"{device}'s {total / 1e9:.1f} GB; name fewer or smaller models")


FIT_EXTRAS = (
    ("attention", "the best of 25 decode attention shares (Efficiency.decode_attention, 0.02 to 1): the decode "
                  "attention kernel's own efficiency"),
    ("gemv", "the best of 13 GEMV speedups (Efficiency.gemv_speedup, 1 to 4): how many times faster a one-row linear "
             "layer (batch-1 decode, a prompt's LM head) streams its weights than a GEMM of more rows"),
    ("graph", "the best of 9 graph launch shares (Efficiency.decode_graph_launch, 0.02 to 1): the per-kernel latency "
              "a decode step replayed from a CUDA graph still pays"),
)


def fit_options(device: str, decode_timing: str) -> dict[str, bool]:
    """Which constants beyond (eta_c, eta_m, kernel latency, step overhead) a run's grid can identify.

    CUDA: the decode attention kernel's share (a masked SDPA over the static cache is no paged-attention kernel;
    with transformers 5.17's repeated GQA heads an H200 run put it at 12% of the efficiencies). Graph replays:
    also the launch share the replayed steps pay. No cost per sequence: a replay does no host work per sequence
    (on the H200 catalog run it would have taken 143 us a sequence to stand in for the repeated GQA heads). A CPU grid keeps the four (on the committed CPU record the attention share
    moved prefill's held-out error 5.2% -> 5.7%, and on a quick run 5.5% -> 13%: two decode contexts do not
    identify it). A CPU grid also fits the GEMV speedup: CPU BLAS streams the weights of a one-row linear layer
    about twice as fast as those of a GEMM of 2+ rows, which it packs first (torch 2.13 fp32 on a 2-core AMD EPYC:
    a 32000 x 512 layer 4.9 ms at one row, 10.4 ms at two, 11.4 ms at eight; a quick run's decode held-out error
    31% -> 4% with it). GPUs stream a GEMV like any GEMM, and their records keep 1.
    """
    cuda, graphed = device == "cuda", decode_timing == "cuda_graph"
    return {"attention": cuda, "graph": graphed, "per_sequence": False, "gemv": not cuda}


def reference_spec(gpu: str, engine: str = "generic") -> GPUSpec:
    """The catalog GPU entry as a planner user gets it: its datasheet peaks with ``engine``'s efficiencies."""
    from ..arguments import gpu_spec
    from ..engines import engine_gpu

    return engine_gpu(gpu_spec(gpu), engine, None)


def catalog_reference(points: list[Point], models: dict[str, ModelSpec], gpu: str, engine: str,
                      dtype: str) -> CatalogReference:
    """Every point predicted on the catalog entry ``gpu`` with ``engine``'s efficiencies (nothing fitted), and the
    error of each phase against the measurement."""
    spec = reference_spec(gpu, engine)
    predicted = [predict_point_s(models[p.model], spec, p.phase, p.tokens, p.batch, dtype, spec.efficiency)[0]
                 for p in points]
    errors = []
    for phase in ("prefill", "decode"):
        rows = [(p, t) for p, t in zip(points, predicted, strict=True) if p.phase == phase]
        if not rows:
            continue
        rel = [t / p.measured_s - 1.0 for p, t in rows]
        k = int(np.argmax(np.abs(rel)))
        errors.append(CatalogPhaseError(
            phase=phase, n=len(rows), median_abs_rel_error=float(np.median(np.abs(rel))),  # type: ignore[arg-type]
            max_abs_rel_error=float(abs(rel[k])), median_rel_error=float(np.median(rel)), worst=rows[k][0].label))
    return CatalogReference(gpu=spec.id, gpu_name=spec.name, engine=engine,
                            peak_flops_per_s=float(getattr(spec.peak_tflops, dtype) or 0.0) * 1e12,
                            memory_bytes_per_s=spec.hbm_bandwidth_tb_s * 1e12, predicted_s=tuple(predicted),
                            errors=tuple(errors))


def reanalyse(report: ValidationReport, reference_gpu: str | None = None, engine: str | None = None) -> ValidationReport:
    """Fit and predict a saved report's measurements again (e.g. after a change to the model); ``reference_gpu``
    (default: the report's own) predicts them on a catalog entry too."""
    if reference_gpu is None and report.reference is not None:
        reference_gpu = report.reference.gpu
    if engine is None:
        engine = report.reference.engine if report.reference is not None else "generic"
    measurements = [Measurement(model=p.model, phase=p.phase, batch=p.batch, tokens=p.tokens, grid_index=p.grid_index,
                                sweeps_s=p.sweeps_s) for p in report.points]
    new = analyse(report.ceilings, list(report.models), measurements, list(report.kv_checks), list(report.param_checks),
                  quick=report.quick, seed=report.seed, date=report.date, versions=report.versions, stalls=report.stalls,
                  decode_timing=report.decode_timing, reference_gpu=reference_gpu, engine=engine,
                  attention=report.attention)
    # notes of the run itself (a failed capture); a note the analysis writes again replaces its older wording
    topics = {n.split(":", 1)[0] for n in new.notes}
    extra = tuple(n for n in report.notes if n.split(":", 1)[0] not in topics)
    return new.model_copy(update={"wall_s": report.wall_s, "notes": new.notes + extra})


def phase_error(points: list[Point], phase: str, subset: str, models: dict[str, ModelSpec], device: GPUSpec,
                dtype: str, eff: Efficiency, kv_repeated: bool = False) -> PhaseError:
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
        reason = explain(worst, models[worst.model], device, dtype, eff, kv_repeated)
    return PhaseError(phase=phase, subset=subset, n=len(pts), median_abs_rel_error=float(np.median(errs)),  # type: ignore[arg-type]
                      max_abs_rel_error=float(errs[k]), worst=worst.label, worst_predicted_s=preds[k],
                      worst_measured_s=worst.measured_s, reason=reason)


def explain(p: Point, m: ModelSpec, device: GPUSpec, dtype: str, eff: Efficiency, kv_repeated: bool = False) -> str:
    """The known cause that best fits where and which way the model misses a point (``kv_repeated``: the run's
    attention repeated each KV head over its query heads in decode steps)."""
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
    group = m.num_attention_heads // m.num_kv_heads
    if p.phase == "decode" and under and kv_repeated and group > 1 and kv_share > 0.05:
        return (f"the KV cache is {kv_share:.0%} of the step's bytes as a paged-attention kernel reads it, once per KV "
                f"head; transformers' SDPA decode with a mask (before 5.23) repeats each of the {m.num_kv_heads} KV "
                f"heads {group} times (repeat_kv) before attending, so it streams the cache several times over "
                "(the benchmark now attends with pdplan_grouped_sdpa, which does not)" + noise)
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
