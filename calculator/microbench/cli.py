"""Command line of the microbenchmark (``python -m calculator.microbench``; ``pdplan validate`` calls the same ``run``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .runner import TorchMissingError, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m calculator.microbench",
        description="Measure a real transformer's prefill, decode and KV cache on this device, calibrate pdplan's "
                    "model to it and report its error on held-out points.",
    )
    ap.add_argument("--quick", action="store_true", help="reduced grid (under a minute on a 2-core CPU)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where to run (auto: cuda when torch sees one, else cpu)")
    ap.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="write report.md, points.json, plot.png, calibration.yaml and hardware.yaml here")
    ap.add_argument("--calibration-out", type=Path, default=None, metavar="FILE",
                    help="also save the fitted calibration profile to FILE (for estimate(..., calibration=FILE))")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all this process may use)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=None, metavar="ID,ID",
                    help="measure these instead of the grid's models: bench model ids or catalog llama/qwen2 models "
                         "(random weights of their shapes), comma-separated")
    ap.add_argument("--gpu", default=None, metavar="ID",
                    help="also predict every point on this catalog GPU entry as shipped (datasheet peaks, default "
                         "efficiencies) and report that error")
    ap.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                    help="time CUDA decode steps eager instead of as CUDA-graph replays")
    ap.add_argument("--reanalyse", type=Path, default=None, metavar="DIR",
                    help="measure nothing: fit and predict the points.json in DIR again with this version's model "
                         "(and --gpu), and write the outputs to --out (default DIR)")
    a = ap.parse_args(argv)
    if a.reanalyse is not None:
        return _reanalyse(a.reanalyse, a.out or a.reanalyse, a.gpu)
    models = None if a.models is None else [x.strip() for x in a.models.split(",") if x.strip()]
    try:
        report = run(quick=a.quick, device=a.device, out_dir=a.out, seed=a.seed, threads=a.threads, models=models,
                     cuda_graphs=a.cuda_graphs, reference_gpu=a.gpu)
    except TorchMissingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.calibration_out is not None:
        from .report import write_calibration

        a.calibration_out.parent.mkdir(parents=True, exist_ok=True)
        write_calibration(report, a.calibration_out)
    print(summary(report))
    if a.out is not None:
        print(f"wrote {a.out}/report.md, points.json, plot.png, calibration.yaml, hardware.yaml")
    if a.calibration_out is not None:
        print(f"wrote {a.calibration_out}")
    return 0


def _reanalyse(src: Path, out: Path, gpu: str | None) -> int:
    from pydantic import ValidationError

    from .report import write_outputs
    from .results import ValidationReport
    from .runner import reanalyse

    try:
        report = ValidationReport.model_validate_json((src / "points.json").read_text(encoding="utf-8"))
    except OSError as e:
        print(f"error: reanalyse: cannot read {src / 'points.json'} ({e.strerror or e})", file=sys.stderr)
        return 2
    except ValidationError as e:
        print(f"error: reanalyse: {src / 'points.json'} is not a microbenchmark report "
              f"({e.error_count()} errors; first at {'.'.join(map(str, e.errors()[0]['loc']))})", file=sys.stderr)
        return 2
    try:
        report = reanalyse(report, reference_gpu=gpu)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_outputs(report, out)
    print(summary(report))
    print(f"wrote {out}/report.md, points.json, plot.png, calibration.yaml, hardware.yaml")
    return 0


def summary(report) -> str:  # type: ignore[no-untyped-def]
    """A few lines for the terminal: device, ceilings, fitted constants, held-out error, KV check."""
    c, eff = report.ceilings, report.efficiency
    lines = [
        (f"{c.device_name} ({c.device}, {c.threads or 'GPU'} threads, {c.dtype}), {report.date}, "
        f"{'quick' if report.quick else 'full'} grid, {report.wall_s:.0f} s"),
        f"ceilings: {c.matmul_flops_per_s / 1e9:.0f} GFLOP/s matmul, {c.memory_bytes_per_s / 1e9:.1f} GB/s copy",
        (f"fitted: eta_c {eff.compute:.3f}, eta_m {eff.memory:.3f}, kernel latency {eff.kernel_latency_us:.1f} us, "
        f"step overhead {eff.step_overhead_us:.0f} us"
        + (f", GEMV speedup {eff.gemv_speedup:.2f}" if eff.gemv_speedup != 1.0 else "")),
    ]
    for ph in ("prefill", "decode"):
        e = report.error(ph)
        lines.append(f"held-out {ph:7s}: median |err| {e.median_abs_rel_error:6.1%}, max {e.max_abs_rel_error:6.1%} "
                     f"over {e.n} points; worst: {e.worst}")
    exact = sum(k.exact for k in report.kv_checks)
    lines.append(f"KV bytes: {exact}/{len(report.kv_checks)} cache checks equal to the byte")
    if report.ceilings.device == "cuda":
        lines.append(f"decode timed as {'CUDA-graph replays' if report.decode_timing == 'cuda_graph' else 'eager steps'}")
    if report.reference is not None:
        ref = report.reference
        for e in ref.errors:
            lines.append(f"catalog {ref.gpu} ({ref.engine}) {e.phase:7s}: median |err| {e.median_abs_rel_error:6.1%} "
                         f"(signed {e.median_rel_error:+.1%}), max {e.max_abs_rel_error:6.1%} over {e.n} points")
    if report.stalls is not None and report.stalls.busy:
        lines.append("warning: " + report.stalls.summary)
    return "\n".join(lines)
