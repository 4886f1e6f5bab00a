"""Time ``calculator.plan`` in-process over the default search space (all modes, 4 GPU types,
heterogeneous prefill/decode pairs) and ``calculator.estimate``; prints medians of repeated runs.

    python bench/plan_speed.py
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import cpu_name

import calculator as pc


def median_s(fn, repeats: int) -> float:
    fn()  # warm caches (database, lambdified formulas)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    w = pc.Workload(rate=12.0, isl=4000, osl=500)
    slo = pc.SLO(ttft_s=2.0, tpot_s=0.05, percentile=90)
    gpus = ["h100-sxm", "h200-sxm", "h20", "a100-sxm-80gb"]
    p = pc.plan("llama-3.1-70b", workload=w, slo=slo, gpus=gpus)
    plan_s = median_s(lambda: pc.plan("llama-3.1-70b", workload=w, slo=slo, gpus=gpus), 15)
    all_s = median_s(lambda: pc.plan("llama-3.1-70b", workload=w, slo=slo), 5)
    est_s = median_s(lambda: pc.estimate("llama-3.1-70b", "h200-sxm", tp=4, isl=4000, osl=500), 50)
    # every catalog mixture-of-experts model, with attention-DP + EP searched (dp 2 ... 32)
    moe = [mid for mid in pc.list_models() if pc.load_model(mid).moe is not None]
    moe_w = pc.Workload(rate=12.0, isl=2000, osl=500)
    moe_s = {mid: median_s(lambda mid=mid: pc.plan(mid, workload=moe_w, slo=slo, gpus=gpus, weight_dtype="fp8"), 5)
             for mid in moe}
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"plan (llama-3.1-70b, 4 GPU types, all modes, {p.searched} configurations): median {plan_s * 1e3:.0f} ms")
    print(f"plan (llama-3.1-70b, all {len(pc.list_gpus())} GPU types, all modes):            median {all_s * 1e3:.0f} ms")
    print(f"estimate (llama-3.1-70b on h200-sxm tp4):                         median {est_s * 1e3:.2f} ms")
    slowest = max(moe_s, key=moe_s.get)
    print(f"plan ({len(moe)} MoE models, fp8, 4 GPU types, dp/ep searched): median of medians "
          f"{statistics.median(moe_s.values()) * 1e3:.0f} ms, slowest {slowest} {moe_s[slowest] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
