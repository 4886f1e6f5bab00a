"""``python -m calculator``: print one estimate on the bundled defaults, opened into its operator rows."""

from __future__ import annotations

import argparse
import sys

from .estimate import estimate
from .hf_config import SUPPORTED_FAMILIES  # noqa: F401  (import check: the package is complete)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calculator", description="One closed-form estimate.")
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--gpu", default="h200-sxm")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--isl", type=int, default=4000)
    ap.add_argument("--osl", type=int, default=500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--weight-dtype", default="bf16")
    ap.add_argument("--kv-dtype", default="bf16")
    a = ap.parse_args(argv)
    try:
        e = estimate(a.model, a.gpu, tp=a.tp, isl=a.isl, osl=a.osl, batch=a.batch,
                     weight_dtype=a.weight_dtype, kv_dtype=a.kv_dtype)
    except (ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{e.model} on {e.num_gpus} x {e.gpu} (tp={e.tp}), isl={e.isl} osl={e.osl} batch={e.batch}, "
          f"{e.weight_dtype} weights, {e.kv_dtype} KV")
    if not e.fits:
        print(f"does not fit: {e.reason}")
        return 1
    print(f"  TTFT {e.ttft_s * 1e3:9.1f} ms   ({e.prefill_bound}-bound, {e.prefill_intensity_flops_per_byte:.0f} FLOP/B)")
    print(f"  TPOT {e.tpot_s * 1e3:9.2f} ms   ({e.decode_bound}-bound, {e.decode_intensity_flops_per_byte:.1f} FLOP/B;"
          f" ridge {e.ridge_point_flops_per_byte:.0f} FLOP/B)")
    print(f"  E2E  {e.e2e_s:9.2f} s    = TTFT + (osl-1) x TPOT")
    print(f"  KV   {e.kv_bytes_per_token / 1e3:.1f} kB/token, {e.kv_cache_bytes / 1e9:.2f} GB for the batch;"
          f" max batch {e.max_batch}; weights {e.weights_bytes_per_gpu / 1e9:.1f} GB/GPU")
    print(f"\n  {'phase':8s} {'group':15s} {'GFLOP':>12s} {'MB':>10s} {'FLOP/B':>8s} {'bound':>13s} {'ms':>9s}")
    for r in e.rows:
        ai = f"{r.arithmetic_intensity:.0f}" if r.arithmetic_intensity is not None else "-"
        print(f"  {r.phase:8s} {r.group:15s} {r.flops / 1e9:12.1f} {r.bytes / 1e6:10.1f} {ai:>8s} {r.bound:>13s}"
              f" {r.time_s * 1e3:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
