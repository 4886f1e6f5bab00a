"""Fit the engine profiles to public measurements, and report each on sources it never saw.

    python bench/fit_engine_profiles.py            # fit, print the profiles and their errors
    python bench/fit_engine_profiles.py --write    # also write them into hardware_db/data/engines.yaml
    python bench/fit_engine_profiles.py --only vllm-0.11 --write   # one profile
    python bench/fit_engine_profiles.py --check    # only the errors of the bundled profiles

``trtllm-0.9`` is fitted on engine step latencies (below). ``vllm-0.11`` and ``sglang-0.5`` are fitted on public
serving benchmarks (``hardware_db/data/serving_latencies.csv``, sources in its header) through pdplan's serving
model (a closed loop by ``calculator.serving.closed``, an open loop by the serving modes): the request path in
front of the engine (``request_overhead_us``), the per-step cost and the CUDA-graph launch share, and each GPU's
compute and memory efficiency where a GPU has runs at two shapes or more; only dense models' runs of the fitted
sources are fitted, the rest (mixture-of-experts runs, other sources and versions) are held out.

``trtllm-0.9``'s data: ``hardware_db/data/step_latencies.csv`` (sources in its header). The fit uses one source only,
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
from calculator.engines import (  # noqa: E402
    FIT_SOURCE, engine_errors, load_served_runs, load_step_latencies, predict_served_runs, predict_step_latencies,
    served_fitted)
from hardware_db import load_gpu  # noqa: E402
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


def _values(z: np.ndarray, names: list[tuple], gpus: list[str]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The free constants at the unbounded point ``z``: (shared fields, per-GPU fields), rounded."""
    shared: dict[str, float] = {}
    per_gpu: dict[str, dict[str, float]] = {g: {} for g in gpus}
    for zi, (where, field, _, lo, hi) in zip(z, names):
        value = round(_logistic(float(zi), lo, hi), 4)
        (shared if where == "shared" else per_gpu[where])[field] = value
    return shared, per_gpu


def fit() -> EngineProfile:
    points = load_step_latencies(FIT_SOURCE)
    gpus = sorted({p.gpu for p in points})
    names = [("shared", k, *v) for k, v in SHARED.items()] + [(g, k, *v) for g in gpus for k, v in PER_GPU.items()]
    measured = np.concatenate([[p.prefill_ms / 1e3 for p in points], [p.decode_step_ms / 1e3 for p in points]])

    def profile(z: np.ndarray) -> EngineProfile:
        shared, per_gpu = _values(z, names, gpus)
        return EngineProfile(
            id=PROFILE_ID, engine="trtllm", version="0.9", gpus=per_gpu, shared={**shared, "decode_graph_launch": 1.0},
            fitted_sources=(FIT_SOURCE,),
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


# --- profiles of served engines, fitted on public serving benchmarks (hardware_db/data/serving_latencies.csv) ---
SERVED_SHARED = {  # field: (start, low, high); each GPU keeps its own compute and memory efficiency
    "request_overhead_us": (20_000.0, 0.0, 200_000.0),
    "step_overhead_us": (300.0, 0.0, 5_000.0),
    "decode_graph_launch": (0.5, 0.0, 1.0),
}
SERVED_PROFILES = {  # id: (engine, version, fitted sources (their dense-model runs), description, sources)
    "vllm-0.11": ("vllm", "0.10-0.11", ("gpustack-perf-lab",),
                  "vLLM V1 (0.10-0.11): its OpenAI server in front of the engine core, hybrid scheduler "
                  "(--max-num-batched-tokens 8192), decode steps from CUDA graphs",
                  ("GPUStack Performance Lab, github.com/gpustack/gpustack@47277d79f4a5bae12a2d25e9ecbed2a2177a5f2d "
                   "docs/performance-lab/",)),
    "sglang-0.5": ("sglang", "0.5", ("gpustack-perf-lab", "sglang-cookbook"),
                   "SGLang 0.5: its HTTP server and tokenizer manager in front of the scheduler, chunked prefill "
                   "(--chunked-prefill-size 8192), decode steps from CUDA graphs",
                   ("GPUStack Performance Lab, github.com/gpustack/gpustack@47277d79f4a5bae12a2d25e9ecbed2a2177a5f2d "
                    "docs/performance-lab/",
                    "SGLang Cookbook, github.com/sgl-project/sgl-cookbook@172d80bdea5035d636774eb90d11c911cfa22590 "
                    "docs/autoregressive/Llama/Llama3.1.md")),
}
MISS = 3.0  # the log error charged to a run the model cannot serve (a layout that does not fit, an unstable load)


def fit_served(profile_id: str) -> EngineProfile:
    """A served engine's shared terms (its request path, per-step cost and CUDA-graph launch share) fitted to
    the TTFT and TPOT of its benchmark runs in the fitted sources (mean |log error|, Nelder-Mead, bounded);
    every GPU keeps its own compute and memory efficiencies (too few runs per GPU to fit them)."""
    engine, version, fit_sources, description, sources = SERVED_PROFILES[profile_id]
    base = EngineProfile(id=profile_id, engine=engine, description=description, fitted_sources=fit_sources,
                         fitted_models="dense")
    runs = [r for r in load_served_runs(engine) if served_fitted(base, r)]
    # a GPU with runs at two or more shapes gets its own compute and memory efficiency
    gpus = sorted(g for g in {r.gpu for r in runs} if len({(r.model, r.isl) for r in runs if r.gpu == g}) >= 2)
    names = [("shared", k, *v) for k, v in SERVED_SHARED.items()] + [
        (g, k, getattr(load_gpu(g).efficiency, k), *PER_GPU[k][1:]) for g in gpus for k in PER_GPU]
    measured = np.array([[r.ttft_ms / 1e3, (r.tpot_ms or np.nan) / 1e3] for r in runs])

    def profile(z: np.ndarray) -> EngineProfile:
        shared, per_gpu = _values(z, names, gpus)
        return base.model_copy(update=dict(
            version=version, shared=shared, gpus=per_gpu, sources=sources,
            fitted_on=f"bench/fit_engine_profiles.py: {len(runs)} serving benchmark runs of dense models, sources "
                      f"{', '.join(fit_sources)} in hardware_db/data/serving_latencies.csv"))

    def loss(z: np.ndarray) -> float:
        pred = predict_served_runs(runs, profile(z))
        err = np.log(np.stack([pred.ttft_s, pred.tpot_s], axis=1) / measured)
        err = np.where(np.isnan(err) & np.isfinite(measured), MISS, np.abs(err))
        return float(np.nanmean(err))

    z = np.array([_logit(start, lo, hi) for _, _, start, lo, hi in names])
    for step in (0.8, 0.3):
        z = nelder_mead(loss, z, step, 300)
        print(f"  {profile_id} loss {loss(z):.4f}", file=sys.stderr)
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
    print(f"{'source':16s} {'phase':8s} {'subset':28s} {'n':>5s} {'median':>7s} {'p90':>7s} {'bias':>7s}")
    for e in engine_errors(engine):
        print(f"{e.source:16s} {e.phase:8s} {e.subset:28s} {e.points:5d} {e.median_abs_error:7.1%} "
              f"{e.p90_abs_error:7.1%} {e.median_signed_error:+7.1%}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the fitted profile into engines.yaml")
    ap.add_argument("--check", action="store_true", help="only report the bundled profiles")
    ap.add_argument("--only", action="append", choices=[PROFILE_ID, *SERVED_PROFILES],
                    help="fit only this profile (repeatable)")
    args = ap.parse_args()
    if not args.check:
        ids = args.only or [PROFILE_ID, *SERVED_PROFILES]
        for profile in [fit() if i == PROFILE_ID else fit_served(i) for i in ids]:
            print(yaml.safe_dump(profile.model_dump(exclude_defaults=True), sort_keys=False, width=110))
            if args.write:
                write(profile)
    from hardware_db.loader import list_engines

    for engine in list_engines():
        report(engine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
