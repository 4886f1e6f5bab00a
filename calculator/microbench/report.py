"""Write a ValidationReport out: markdown report, JSON of every point, the plot, and the calibration YAMLs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from ..calibration import save_calibration
from .fit import design
from .results import Point, ValidationReport

FILES = ("report.md", "points.json", "plot.png", "calibration.yaml", "hardware.yaml")


def write_outputs(report: ValidationReport, out_dir: Path) -> list[Path]:
    """report.md, points.json, plot.png, calibration.yaml (``calibration=``) and hardware.yaml (a user hardware file)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in FILES]
    md, js, png, cal, hw = paths
    write_plot(report, png)
    js.write_text(report.model_dump_json(indent=1) + "\n", encoding="utf-8")
    write_calibration(report, cal)
    write_hardware_file(report, hw)
    md.write_text(markdown(report, plot=png.name), encoding="utf-8")
    return paths


def write_calibration(report: ValidationReport, path: Path) -> Path:
    """The fitted Efficiency as a calibration profile for ``estimate(..., calibration=path)``."""
    c = report.ceilings
    save_calibration(
        path, report.efficiency, device=report.device_spec.id, device_name=c.device_name, date=report.date,
        peak_tflops_bf16=round(report.device_spec.peak_tflops.bf16, 6),
        hbm_bandwidth_tb_s=round(report.device_spec.hbm_bandwidth_tb_s, 6),
        torch=report.versions.get("torch", ""), threads=c.threads,
        held_out_median_abs_rel_error={ph: round(report.error(ph).median_abs_rel_error, 4) for ph in ("prefill", "decode")},
    )
    return Path(path)


def write_hardware_file(report: ValidationReport, path: Path) -> Path:
    """The measured device, with its fitted efficiency, as a user hardware file (``PDPLAN_HARDWARE_DB``)."""
    body = {"schema_version": 1, "gpus": [report.device_spec.model_dump(mode="json", exclude_none=True)]}
    Path(path).write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return Path(path)


def _what(r: ValidationReport) -> str:
    """What sets the run apart from the device's default grid, for the title: its models and how decode was timed."""
    from .models import GRIDS

    ids = tuple(m.id for m in r.models)
    parts = [] if ids == GRIDS[(r.ceilings.device, r.quick)].models else [", ".join(ids)]
    if r.ceilings.device == "cuda":
        parts.append("decode as CUDA-graph replays" if r.decode_timing == "cuda_graph" else "eager decode")
    return f" ({'; '.join(parts)})" if parts else ""


def _flags(r: ValidationReport) -> str:
    """The command-line flags that measure this report's grid again."""
    from .models import GRIDS

    c = r.ceilings
    ids = tuple(m.id for m in r.models)
    flags = [" --quick"] if r.quick else []
    flags.append(f" --device {c.device}")
    if ids != GRIDS[(c.device, r.quick)].models:
        flags.append(f" --models {','.join(ids)}")
    if c.device == "cuda" and r.decode_timing == "eager" and not any("could not be captured" in n for n in r.notes):
        flags.append(" --no-cuda-graphs")
    if r.reference is not None:
        flags.append(f" --gpu {r.reference.gpu}")
    return "".join(flags)


def _ms(t: float) -> str:
    return f"{t * 1e3:.1f}" if t >= 0.01 else f"{t * 1e3:.2f}"


def _pct(x: float) -> str:
    return f"{x:.1%}"


def markdown(r: ValidationReport, plot: str = "plot.png") -> str:
    c, eff = r.ceilings, r.efficiency
    mode = "quick" if r.quick else "full"
    lines = [
        f"# pdplan microbenchmark: {c.device_name}, {r.date}{_what(r)}",
        "",
        f"- Device: **{c.device}**, {c.device_name}"
        + (f", {c.threads} torch threads" if c.device == "cpu" else "") + f"; models run in {c.dtype}",
        f"- Details: {c.device_details or 'n/a'}",
        f"- Date: {r.date}; grid: {mode}; seed {r.seed}; wall time {r.wall_s:.0f} s",
        (f"- Software: torch {r.versions.get('torch')}, transformers {r.versions.get('transformers')}, "
        f"Python {r.versions.get('python')}, pdplan {r.versions.get('pdplan')}; attention `{r.attention}`"
        + (" (one-token steps repeat each KV head over its query heads)" if r.repeats_kv else "")),
        f"- Reproduce: `pdplan validate{_flags(r)} --out DIR` (or `python -m calculator.microbench{_flags(r)} --out DIR`)",
        *([f"- **Warning**: {r.stalls.summary}"] if r.stalls is not None and r.stalls.busy else []),
        "",
        "## Held-out error",
        "",
        ("Every point is predicted by `calculator.estimate` on the measured device, with the constants fitted "
        "on the other half of the grid (a checkerboard over each model's tokens x batch grid)."),
        "",
        "| phase | points | median \\|pred/meas − 1\\| | max | worst point | predicted | measured | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ph in ("prefill", "decode"):
        e = r.error(ph)
        lines.append(f"| {ph} | {e.n} | {_pct(e.median_abs_rel_error)} | {_pct(e.max_abs_rel_error)} | {e.worst} | "
                     f"{_ms(e.worst_predicted_s)} ms | {_ms(e.worst_measured_s)} ms | {e.reason} |")
    lines += [
        "",
        "The other subsets, for comparison:",
        "",
        "| phase | subset | points | median | max | worst point |",
        "|---|---|---|---|---|---|",
    ]
    for ph in ("prefill", "decode"):
        for sub, label in (("fit", "fit half (calibrated)"), ("all_at_ceilings", "all points, bare ceilings")):
            e = r.error(ph, sub)
            lines.append(f"| {ph} | {label} | {e.n} | {_pct(e.median_abs_rel_error)} | {_pct(e.max_abs_rel_error)} | "
                         f"{e.worst} |")
    if r.reference is not None:
        lines += ["", *_reference_section(r)]
    lines += [
        "",
        f"![predicted vs measured; latency against prompt length, batch and context]({plot})",
        "",
        "## Fitted constants",
        "",
        "| compute efficiency η_c | memory efficiency η_m | kernel latency | step overhead | cost per sequence | "
        "decode attention share | decode graph launch share | GEMV speedup | fit points | rms relative error on them |",
        "|---|---|---|---|---|---|---|---|---|---|",
        (f"| {eff.compute:.3f} | {eff.memory:.3f} | {eff.kernel_latency_us:.1f} µs | {eff.step_overhead_us:.0f} µs | "
         f"{eff.sequence_overhead_us:.1f} µs | {eff.decode_attention:.3g} | {eff.decode_graph_launch:.3g} | "
         f"{eff.gemv_speedup:.3g} | {r.fit.n_points} | {_pct(r.fit.rms_rel_error)} |"),
        "",
        f"Method: {r.fit.method}. Link efficiency and collective latency are not fitted (one device).",
        "",
        ("Use them: `pc.estimate(model, gpu, calibration='calibration.yaml')` applies the efficiencies to any GPU "
        f"entry; `hardware.yaml` is a user hardware file with this device as `{r.device_spec.id}` "
        f"(`PDPLAN_HARDWARE_DB=hardware.yaml`, then `pc.load_gpu('{r.device_spec.id}')`)."),
        "",
        "## Device ceilings",
        "",
        (f"Memory bandwidth: **{c.memory_bytes_per_s / 1e9:.1f} GB/s** (copy of {c.copy_bytes / 2**20:.0f} MiB, read + "
        f"written, median {c.copy_time_s * 1e3:.1f} ms). Matmul ceiling: **{c.matmul_flops_per_s / 1e9:.0f} GFLOP/s** "
        f"in {c.dtype} (best size). Memory size: {c.memory_total_bytes / 1e9:.1f} GB."),
        "",
        "| dtype | n | median time | achieved |",
        "|---|---|---|---|",
    ]
    for s in c.matmul:
        lines.append(f"| {s.dtype} | {s.n} | {_ms(s.time_s)} ms | {s.flops_per_s / 1e9:.0f} GFLOP/s |")
    lines += [
        "",
        "## Models",
        "",
        "Random weights from transformers' own classes built from each ModelSpec's config (nothing downloaded).",
        "",
        ("| id | class | layers | hidden | q/kv heads | head dim | FFN | sliding layers (window) | parameters | "
        "transformers count equal |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    checks = {p.model: p for p in r.param_checks}
    for m in r.models:
        cls = "LlamaForCausalLM" if m.family == "llama" else "Qwen2ForCausalLM"
        sw = f"{m.num_sliding_layers} ({m.sliding_window})" if m.num_sliding_layers else "-"
        pc = checks[m.id]
        lines.append(f"| {m.id} | {cls} | {m.num_layers} | {m.hidden_size} | {m.num_attention_heads}/{m.num_kv_heads} | "
                     f"{m.head_dim} | {m.intermediate_size} | {sw} | {pc.predicted_params / 1e6:.1f} M | "
                     f"{'yes' if pc.exact else f'NO ({pc.hf_params})'} |")
    lines += [
        "",
        "## KV cache bytes",
        "",
        ("Bytes of the key/value tensors the cache object holds after the prefill, against "
        "`batch × calculator.kv_cache_bytes(model, tokens, dtype)`."),
        "",
        "| model | cache | batch | tokens | held | kv_cache_bytes × batch | documented offset | equal to the byte |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in r.kv_checks:
        lines.append(f"| {k.model} | {k.cache} | {k.batch} | {k.tokens} | {k.measured_bytes:,} | {k.predicted_bytes:,} | "
                     f"{k.convention_offset_bytes:,} | {'yes' if k.exact else 'NO'} |")
    notes = dict.fromkeys(f"- {k.cache}: {k.note}." for k in r.kv_checks if k.note)
    if notes:
        lines += ["", *notes]
    sweeps = len(r.points[0].sweeps_s) if r.points else 0
    lines += ["", "## Notes", ""] + [f"- {n}" for n in r.notes] + [
        ("- Prefill: a batch of random prompts through the model with a fresh DynamicCache and logits for the last "
         "position only. Decode: one prompt prefilled into a StaticCache, replicated to the batch and updated in "
         "place (as a paged serving cache is; DynamicCache would re-copy the whole cache every step), consecutive "
         "one-token steps timed; a decode point's context is that of the middle timed step. Each point: warm-up, "
         f"then the median of its repeats; the grid is swept {sweeps} times and a point keeps its least disturbed "
         "sweep. CUDA times use events after synchronisation."
         + (" Decode steps are CUDA-graph replays: each point's step is captured once (after two eager steps on a "
            "side stream) and replayed, as serving engines run decode, so transformers' Python dispatch is not "
            "in the decode times; prefill runs eager." if r.decode_timing == "cuda_graph" else "")),
        "",
        "## All points",
        "",
        "| model | phase | batch | tokens | split | measured ms | predicted ms | error | bound | bare ceilings ms |"
        + (f" {r.reference.gpu} as shipped ms | error |" if r.reference else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if r.reference else ""),
    ]
    shipped = r.reference.predicted_s if r.reference else (None,) * len(r.points)
    for p, t in zip(r.points, shipped, strict=True):
        lines.append(f"| {p.model} | {p.phase} | {p.batch} | {p.tokens} | {p.split.replace('_', '-')} | "
                     f"{_ms(p.measured_s)} | {_ms(p.predicted_s)} | {p.rel_error:+.1%} | {p.bound} | {_ms(p.ceiling_s)} |"
                     + ("" if t is None else f" {_ms(t)} | {t / p.measured_s - 1:+.1%} |"))
    return "\n".join(lines) + "\n"


def _reference_section(r: ValidationReport) -> list[str]:
    """The run against a catalog GPU entry as shipped (datasheet peaks, default efficiencies)."""
    ref, c = r.reference, r.ceilings
    assert ref is not None
    lines = [
        f"## Error of the catalog entry `{ref.gpu}` as shipped",
        "",
        (f"Every point predicted by `calculator.estimate` on {ref.gpu_name} from the database, with the "
         f"{'entry' if ref.engine == 'generic' else ref.engine + ' profile'}'s own efficiencies: nothing here is "
         "fitted to this run. This is the error a planner user gets without calibrating. The measured ceilings are "
         f"{c.matmul_flops_per_s / ref.peak_flops_per_s:.0%} of the entry's {c.dtype} peak "
         f"({ref.peak_flops_per_s / 1e12:.0f} TFLOP/s) and {c.memory_bytes_per_s / ref.memory_bytes_per_s:.0%} of its "
         f"memory bandwidth ({ref.memory_bytes_per_s / 1e12:.2f} TB/s)."),
        "",
        "| phase | points | median \\|pred/meas − 1\\| | median signed | max | worst point |",
        "|---|---|---|---|---|---|",
    ]
    for e in ref.errors:
        lines.append(f"| {e.phase} | {e.n} | {_pct(e.median_abs_rel_error)} | {e.median_rel_error:+.1%} | "
                     f"{_pct(e.max_abs_rel_error)} | {e.worst} |")
    return lines


def _curve_s(r: ValidationReport, model_id: str, phase: str, tokens: np.ndarray, batch: np.ndarray) -> np.ndarray:
    m = next(m for m in r.models if m.id == model_id)
    return design(m, r.device_spec, phase, tokens, batch, r.ceilings.dtype).predict_s(r.efficiency)


def write_plot(r: ValidationReport, path: Path) -> Path:
    """Predicted vs measured, and latency against prompt length, decode batch and decode context (both curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    colours = dict(zip([m.id for m in r.models], plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    fig, axes = plt.subplots(2, 2, figsize=(13, 10))
    (ax_pm, ax_pre), (ax_bat, ax_ctx) = axes
    mode = "quick" if r.quick else "full"
    fig.suptitle(f"pdplan microbenchmark: {r.ceilings.device_name} ({r.ceilings.device}, {r.ceilings.dtype}), "
                 f"{r.date}, {mode} grid\n"
                 f"fitted η_c={r.efficiency.compute:.2f}, η_m={r.efficiency.memory:.2f}, kernel "
                 f"{r.efficiency.kernel_latency_us:.0f} µs, step {r.efficiency.step_overhead_us:.0f} µs; held-out median "
                 f"error prefill {r.error('prefill').median_abs_rel_error:.1%}, decode "
                 f"{r.error('decode').median_abs_rel_error:.1%}", fontsize=11)

    # (a) predicted vs measured
    ms = [p.measured_s * 1e3 for p in r.points] + [p.predicted_s * 1e3 for p in r.points]
    lo, hi = min(ms) / 1.5, max(ms) * 1.5
    xs = np.geomspace(lo, hi, 50)
    ax_pm.plot(xs, xs, "k-", lw=1)
    ax_pm.fill_between(xs, xs / 1.2, xs * 1.2, color="0.85", label="±20%")
    for p in r.points:
        marker = "o" if p.phase == "prefill" else "s"
        face = colours[p.model] if p.split == "fit" else "none"
        ax_pm.scatter(p.measured_s * 1e3, p.predicted_s * 1e3, marker=marker, facecolors=face,
                      edgecolors=colours[p.model], s=30, linewidths=1.2)
    ax_pm.text(0.97, 0.03, f"{len(r.points)} points", transform=ax_pm.transAxes, ha="right", fontsize=8)
    for mid, col in colours.items():
        ax_pm.scatter([], [], color=col, marker="o", label=mid)
    for phase, marker in (("prefill", "o"), ("decode", "s")):
        ax_pm.scatter([], [], marker=marker, facecolors="k", edgecolors="k", label=f"{phase}, fit half")
        ax_pm.scatter([], [], marker=marker, facecolors="none", edgecolors="k", label=f"{phase}, held out")
    ax_pm.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured (ms)", ylabel="predicted (ms)",
              title="predicted vs measured, every point")
    ax_pm.legend(fontsize=8, loc="upper left")

    # (b) prefill vs prompt length, batch 1
    for mid, col in colours.items():
        pts = sorted((p for p in r.points if p.model == mid and p.phase == "prefill" and p.batch == 1), key=lambda p: p.tokens)
        if not pts:
            continue
        s = np.unique(np.geomspace(pts[0].tokens, pts[-1].tokens, 60).round())
        ax_pre.plot(s, _curve_s(r, mid, "prefill", s, np.ones_like(s)) * 1e3, "-", color=col, lw=1.2)
        _measured(ax_pre, pts, [p.tokens for p in pts], col, mid)
    ax_pre.set(xscale="log", yscale="log", xlabel="prompt length (tokens)", ylabel="prefill time (ms)",
               title="prefill, batch 1: measured (markers) and model (lines)")
    ax_pre.legend(fontsize=8)

    # (c) decode vs batch at the smallest context; (d) decode vs context at the largest batch measured at 2+ contexts
    for mid, col in colours.items():
        dec = [p for p in r.points if p.model == mid and p.phase == "decode"]
        if not dec:
            continue
        first_ctx = min(p.grid_index[0] for p in dec)
        pts = sorted((p for p in dec if p.grid_index[0] == first_ctx), key=lambda p: p.batch)
        b = np.arange(pts[0].batch, pts[-1].batch + 1, dtype=float)
        ax_bat.plot(b, _curve_s(r, mid, "decode", np.full_like(b, pts[0].tokens), b) * 1e3, "-", color=col, lw=1.2)
        _measured(ax_bat, pts, [p.batch for p in pts], col, f"{mid}, context {pts[0].tokens}")
        counts = {b: sum(q.batch == b for q in dec) for b in {q.batch for q in dec}}
        batch = max(b for b, n in counts.items() if n == max(counts.values()))
        pts = sorted((p for p in dec if p.batch == batch), key=lambda p: p.tokens)
        c = np.unique(np.linspace(pts[0].tokens, pts[-1].tokens, 60).round())
        ax_ctx.plot(c, _curve_s(r, mid, "decode", c, np.full_like(c, pts[0].batch)) * 1e3, "-", color=col, lw=1.2)
        _measured(ax_ctx, pts, [p.tokens for p in pts], col, f"{mid}, batch {pts[0].batch}")
    batches = sorted({p.batch for p in r.points if p.phase == "decode"})
    ax_bat.set(xscale="log", yscale="log", xlabel="decode batch (sequences)", ylabel="decode step (ms)",
               title="decode step vs batch: measured and model", xticks=batches)
    ax_bat.legend(fontsize=8)
    ax_ctx.set(yscale="log", xlabel="cached context (tokens)", ylabel="decode step (ms)",
               title="decode step vs context: measured and model")
    ax_ctx.legend(fontsize=8, loc="best", framealpha=0.6)
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log" and not (axis is ax_bat.xaxis):
                axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
                axis.set_major_formatter(plain)
                axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            elif axis.get_scale() == "log":
                axis.set_major_formatter(plain)
                axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _measured(ax, pts: list[Point], x: list[float], colour: str, label: str) -> None:  # type: ignore[no-untyped-def]
    for p, xv in zip(pts, x, strict=True):
        ax.scatter(xv, p.measured_s * 1e3, marker="o" if p.phase == "prefill" else "s", s=30, linewidths=1.2,
                   facecolors=colour if p.split == "fit" else "none", edgecolors=colour)
    ax.plot([], [], "-", marker="o", color=colour, label=label)
