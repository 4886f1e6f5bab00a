"""Fit the ``trtllm-0.9`` engine profile to its public step latencies, and report it on a source it never saw.

    python bench/fit_engine_profiles.py            # fit, print the profile and its errors
    python bench/fit_engine_profiles.py --write    # also write it into hardware_db/data/engines.yaml
    python bench/fit_engine_profiles.py --check    # only the errors of the bundled profiles

Data: ``hardware_db/data/step_latencies.csv`` (sources in its header). The fit uses one source only,
``trtllm-0.9-dli`` (TensorRT-LLM 0.9, static batch, prefill and decode measured apart, 1,357 rows over 4
GPUs, 5 models, tp 1-8, batch 1-1,536); the other source (NVIDIA NIM at concurrency 1, another engine build
and another measurement campaign) is held out by source, never fitted.

Free constants: each GPU's compute and memory efficiency, and the engine's shared terms: the GEMM roll-off
``gemm_half_tokens``, the bandwidth one decode attention thread block streams
(``decode_attention_block_gb_s``), the per-kernel, per-collective, per-step and per-sequence latencies and the
link efficiency. TensorRT-LLM 0.9's benchmark launched every kernel (no CUDA graphs), so ``decode_graph_launch``
stays 1. Loss: mean |log(predicted / measured)| over both phases of every row; Nelder-Mead in a bounded
(logistic) parametrisation, two restarts. Every prediction is pdplan's own step model (``calculator.engines``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculator.calibrate import nelder_mead  # noqa: E402
from calculator.engines import FIT_SOURCE, load_step_latencies, predict_step_latencies, profile_errors  # noqa: E402
from hardware_db.loader import ENGINE_FILE  # noqa: E402
from hardware_db.schema import EngineProfile  # noqa: E402

PROFILE_ID = "trtllm-0.9"
SHARED = {  # field: (start, low, high)
    "gemm_half_tokens": (64.0, 0.0, 4096.0),
    "kernel_latency_us": (6.0, 0.0, 30.0),
    "collective_latency_us": (12.0, 0.0, 100.0),
    "link": (0.6, 0.1, 1.0),
    "step_overhead_us": (100.0, 0.0, 5000.0),
    "sequence_overhead_us": (5.0, 0.0, 100.0),
    "decode_attention_block_gb_s": (40.0, 1.0, 400.0),
}
PER_GPU = {"compute": (0.6, 0.2, 1.0), "memory": (0.85, 0.3, 1.0)}
ITERATIONS = 400


def _logistic(z: float, lo: float, hi: float) -> float:
    return lo + (hi - lo) / (1.0 + math.exp(-z))


def _logit(x: float, lo: float, hi: float) -> float:
    q = min(max((x - lo) / (hi - lo), 1e-4), 1 - 1e-4)
    return math.log(q / (1 - q))


def fit() -> EngineProfile:
    points = load_step_latencies(FIT_SOURCE)
    gpus = sorted({p.gpu for p in points})
    names = [("shared", k, *v) for k, v in SHARED.items()] + [(g, k, *v) for g in gpus for k, v in PER_GPU.items()]
    measured = np.concatenate([[p.prefill_ms / 1e3 for p in points], [p.decode_step_ms / 1e3 for p in points]])

    def profile(z: np.ndarray) -> EngineProfile:
        shared: dict[str, float] = {}
        per_gpu: dict[str, dict[str, float]] = {g: {} for g in gpus}
        for zi, (where, field, _, lo, hi) in zip(z, names):
            value = round(_logistic(float(zi), lo, hi), 4)
            (shared if where == "shared" else per_gpu[where])[field] = value
        return EngineProfile(
            id=PROFILE_ID, engine="trtllm", version="0.9", gpus=per_gpu, shared={**shared, "decode_graph_launch": 1.0},
            description="TensorRT-LLM 0.9 C++ runtime (static batch, XQA attention, custom all-reduce, kernels "
                        "launched one by one)",
            fitted_on=f"bench/fit_engine_profiles.py: {len(points)} prefill and decode step latencies of source "
                      f"{FIT_SOURCE} in hardware_db/data/step_latencies.csv",
            sources=("NVIDIA DLI 'Sizing LLM Inference Systems' dataset trt_llm_0_9_0_dli.csv, as published in "
                     "github.com/wbing520/ai-performance-engineering@5a4d0c37a3231b2ff8a268df7f129be259c48a48",))

    def loss(z: np.ndarray) -> float:
        pred = predict_step_latencies(points, profile(z))
        err = np.log(np.concatenate([pred.prefill_s, pred.decode_step_s]) / measured)
        return float(np.mean(np.abs(err[np.isfinite(err)])))

    z = np.array([_logit(start, lo, hi) for _, _, start, lo, hi in names])
    for step in (0.6, 0.25):
        z = nelder_mead(loss, z, step, ITERATIONS)
        print(f"  loss {loss(z):.4f}", file=sys.stderr)
    return profile(z)


def write(profile: EngineProfile) -> None:
    raw = yaml.safe_load(ENGINE_FILE.read_text(encoding="utf-8"))
    header = "".join(line + "\n" for line in ENGINE_FILE.read_text(encoding="utf-8").splitlines()
                     if line.startswith("#"))
    entry = profile.model_dump(exclude_defaults=True)
    entry["sources"] = list(profile.sources)
    raw["engines"] = [e for e in raw["engines"] if e["id"] != profile.id] + [entry]
    ENGINE_FILE.write_text(header + yaml.safe_dump(raw, sort_keys=False, width=110), encoding="utf-8")


def report(engine: str) -> None:
    print(f"\n{engine}: |predicted / measured - 1| per source and phase")
    print(f"{'source':16s} {'phase':8s} {'subset':20s} {'n':>5s} {'median':>7s} {'p90':>7s} {'bias':>7s}")
    for e in profile_errors(engine, by=("gpu", "tp")):
        print(f"{e.source:16s} {e.phase:8s} {e.subset:20s} {e.points:5d} {e.median_abs_error:7.1%} "
              f"{e.p90_abs_error:7.1%} {e.median_signed_error:+7.1%}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the fitted profile into engines.yaml")
    ap.add_argument("--check", action="store_true", help="only report the bundled profiles")
    args = ap.parse_args()
    if not args.check:
        profile = fit()
        print(yaml.safe_dump(profile.model_dump(exclude_defaults=True), sort_keys=False, width=110))
        if args.write:
            write(profile)
    from hardware_db.loader import list_engines

    for engine in list_engines():
        report(engine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
