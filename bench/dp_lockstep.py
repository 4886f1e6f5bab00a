"""Attention-DP ranks that step together: the closed form against the lock-step simulation.

    python bench/dp_lockstep.py            # the table of docs/concepts/parallelism.md, "The ranks step together"

DeepSeek-V3 fp8 (fp8 KV) on one dp8 ep8 H200 instance whose ranks admit their own prompts
(``Pool(dp_balance=False)``): for each case, pdplan's ``evaluate`` against ``simulate`` (seed 1, 3,000 measured
requests, the eight ranks run in lock-step), errors as closed form / simulated - 1. About two minutes on two cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import calculator as pc  # noqa: E402

CASES = (  # (mode, scheduler, prompt tokens, output tokens, req/s)
    ("mixed", "hybrid", 2000, 200, 2.0), ("mixed", "hybrid", 2000, 200, 6.0), ("mixed", "hybrid", 2000, 500, 4.0),
    ("mixed", "hybrid", 2000, 500, 8.0), ("mixed", "hybrid", 1000, 1000, 10.0), ("mixed", "hybrid", 4000, 300, 3.0),
    ("chunked", "hybrid", 2000, 200, 6.0), ("mixed", "prefill_first", 2000, 200, 2.0),
    ("mixed", "prefill_first", 2000, 500, 6.0),
)


def main() -> None:
    pool = pc.Pool(gpu="h200-sxm", dp=8, ep=8, weight_dtype="fp8", kv_dtype="fp8")
    print("| mode | prompt / output tokens | req/s | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 | simulated TPOT p50 |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, scheduler, isl, osl, rate in CASES:
        d = pc.Deployment(mode=mode, scheduler=scheduler, chunk_tokens=1024, pool=pool)
        w = pc.Workload(rate=rate, isl=isl, osl=osl)
        e = pc.evaluate("deepseek-v3", d, w)
        s = pc.simulate("deepseek-v3", d, w, requests=3000, seed=1)
        ttft, tpot = s.ttft_by_percentile_s, s.tpot_by_percentile_s
        err = [e.ttft_s(50) / ttft[50], e.ttft_s(90) / ttft[90], e.tpot_s(50) / tpot[50], e.tpot_s(90) / tpot[90]]
        label = f"{mode} ({'chunk 1,024' if mode == 'chunked' else scheduler.replace('_', '-')})"
        print(f"| {label} | {isl:,} / {osl:,} | {rate:g} | " + " | ".join(f"{x - 1:+.0%}" for x in err)
              + f" | {tpot[50] * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
