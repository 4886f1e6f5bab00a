"""Fit each GPU's default efficiencies to the published TensorRT-LLM measurements.

    python bench/fit_defaults.py            # print the fit and the remaining error per GPU
    python bench/fit_defaults.py --check    # only the error of the bundled defaults

Method: for each GPU with measurements, a grid search over (compute efficiency, memory efficiency,
per-step overhead) minimises the mean |log(predicted / measured)| over that GPU's records
(kernel latency 4 us, collective latency 8 us and link efficiency 0.8 are held fixed). Records from
TensorRT-LLM v0.6 (2023, static batching) are reported but not fitted: they describe an older
engine than the v1.0 tables. GPUs with fewer than 8 fitted records keep the memory efficiency and
overhead of the Hopper fit and fit compute efficiency only. GPUs without measurements take the
median of the fitted values (see each entry's efficiency.fitted_on).
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculator.measurements import Measurement, load_measurements, predict  # noqa: E402
from hardware_db import load_gpu  # noqa: E402

COMPUTE = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8]
MEMORY = [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9]
OVERHEAD_US = [50, 100, 200, 400, 800, 1200, 1600, 2400, 3200]


def fitted(m: Measurement) -> bool:
    return not m.id.startswith("trtllm-v0.6")


def error(points: list[Measurement], gpu) -> float:
    return statistics.fmean(abs(math.log(predict(m, gpu) / m.value)) for m in points)


def fit(points: list[Measurement], gpu_id: str, memory=None, overhead=None) -> tuple[float, float, float, float]:
    base = load_gpu(gpu_id)
    best = (math.inf, 0.0, 0.0, 0.0)
    for c, mem, o in itertools.product(COMPUTE, memory or MEMORY, overhead or OVERHEAD_US):
        g = base.model_copy(update={"efficiency": base.efficiency.model_copy(
            update={"compute": c, "memory": mem, "step_overhead_us": o})})
        err = error(points, g)
        if err < best[0]:
            best = (err, c, mem, o)
    return best


def report(measurements: list[Measurement]) -> None:
    print(f"{'gpu':14s} {'n':>3s} {'median |err|':>13s} {'max |err|':>10s}  worst")
    for gpu_id in sorted({m.gpu for m in measurements}):
        pts = [m for m in measurements if m.gpu == gpu_id and fitted(m)]
        errs = [(abs(predict(m) / m.value - 1), m.id) for m in pts]
        worst = max(errs)
        print(f"{gpu_id:14s} {len(pts):3d} {statistics.median(e for e, _ in errs):13.1%} {worst[0]:10.1%}  {worst[1]}")
    old = [m for m in measurements if not fitted(m)]
    if old:
        errs = [abs(predict(m) / m.value - 1) for m in old]
        print(f"{'(v0.6 static)':14s} {len(old):3d} {statistics.median(errs):13.1%} {max(errs):10.1%}  not fitted")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report the error of the bundled defaults")
    args = ap.parse_args()
    ms = load_measurements()
    if not args.check:
        by_gpu = {g: [m for m in ms if m.gpu == g and fitted(m)] for g in sorted({m.gpu for m in ms})}
        results = {}
        for gpu_id, pts in sorted(by_gpu.items(), key=lambda kv: -len(kv[1])):
            if len(pts) >= 8:
                results[gpu_id] = fit(pts, gpu_id)
        hopper = results.get("h100-sxm")
        for gpu_id, pts in by_gpu.items():
            if gpu_id not in results and hopper:
                results[gpu_id] = fit(pts, gpu_id, memory=[hopper[2]], overhead=[hopper[3]])
        for gpu_id, (err, c, mem, o) in sorted(results.items()):
            print(f"{gpu_id:14s} n={len(by_gpu[gpu_id]):2d} compute={c:.2f} memory={mem:.2f} "
                  f"step_overhead_us={o:g}  mean|log err|={err:.3f}")
        print("median of fits: compute=%.2f memory=%.2f step_overhead_us=%g" % tuple(
            statistics.median(r[i] for r in results.values()) for i in (1, 2, 3)))
    print("\nerror of the bundled defaults (|predicted/measured - 1|):")
    report(ms)


if __name__ == "__main__":
    main()
