"""Take one vLLM CPU configuration apart: its hybrid steps measured directly, one load point read step by
step from the token stream, and the closed form and the simulation beside it (docs/engine-validation.md,
"Chunking off, taken apart").

    python bench/engine_probe.py --engine-python .engine-venv/bin/python --config off --rate 2.8 \
        --requests 200 --out probe.json          # ~6 min on a 2-core VM (fp32)

It starts the engine as ``pdplan validate --serving`` does (same model, pinning and calibration), then:

1. **Hybrid steps.** B decodes stream (prompts of ``--decode-prompt`` tokens); once each has 30 tokens a
   whole prompt of P tokens is sent. The decodes' gap that ends nearest the prompt's first token is the
   step that carried it; the median over the decodes, over three tries, against the fitted model's
   ``hybrid_s`` (and a decode-only step against ``decode_s``).
2. **A load point.** Poisson arrivals at ``--rate`` with 512-token prompts and 64 output tokens, every
   token's arrival time kept. Tokens that reach the client within 1.5 ms of each other are one engine
   step; a step that carries first tokens is a prompt step. Reported: the time in prompt steps and in
   decode-only steps against the model's step times for the same steps, the engine's own counters, and
   the CPU share of the engine core, the API server and this client over the point.
3. **Predictions** at the rate the requests arrived at (recorded; 200 Poisson arrivals stray ~7% from the
   offered rate): ``evaluate`` and ``simulate`` (4,000 requests, seed 1) with the fitted device.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculator.enginebench import runner as R
from calculator.enginebench.client import (
    RequestRecord,
    arrival_rate_rps,
    completion_body,
    poisson_load,
    stream_tokens,
)
from calculator.enginebench.engine import CONFIGS, HOST
from calculator.enginebench.model import ENGINE_MODEL, prompt, write_model
from calculator.enginebench.predict import deployment, predict
from calculator.enginebench.reanalysis import FALLBACK_MEMORY_BYTES
from calculator.microbench.ceilings import device_spec
from calculator.microbench.results import Ceilings
from calculator.serving import Pool, Workload
from calculator.serving.base import PoolModel
from calculator.serving.simulate import run_deployment, simulate
from hardware_db.schema import Efficiency

ISL, OSL = 512, 64
STEP_GAP_S = 0.0015
"""Tokens that reach the client within this of each other came from one engine step."""


async def hybrid_gap(port: int, batch: int, prompt_tokens: int, decode_prompt: int, rng) -> tuple[float, float, float]:
    """(the decodes' gap across the step that carried a whole prompt, a plain decode gap, the decodes' context)."""
    t0 = time.perf_counter()
    recs = [RequestRecord(i, decode_prompt, 160, 0.0) for i in range(batch)]
    tasks = [asyncio.create_task(stream_tokens(HOST, port, completion_body(R.SERVED_NAME, prompt(decode_prompt, rng),
                                                                           160, True), r, t0)) for r in recs]
    while min(len(r.token_s) for r in recs) < 30:
        await asyncio.sleep(0.002)
    p = RequestRecord(batch, prompt_tokens, 1, time.perf_counter() - t0)
    await stream_tokens(HOST, port, completion_body(R.SERVED_NAME, prompt(prompt_tokens, rng), 1, True), p, t0)
    await asyncio.gather(*tasks)
    first = p.token_s[0]
    spans, plain = [], []
    for r in recs:
        ends, gaps = np.array(r.token_s[1:]), np.diff(r.token_s)
        j = int(np.argmin(np.abs(ends - first)))
        spans.append(gaps[j])
        plain += list(gaps[max(0, j - 25):max(0, j - 3)]) + list(gaps[j + 3:j + 25])
    context = decode_prompt + sum(t < first for t in recs[0].token_s)
    return float(np.median(spans)), float(np.median(plain)), float(context)


def cpu_seconds() -> dict[str, tuple[float, str]]:
    """CPU seconds (user + system, all threads) and command line of every process."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:100]
        except OSError:
            continue
        out[pid] = ((int(fields[11]) + int(fields[12])) / tick, cmd)
    return out


def role(pid: str, cmd: str) -> str:
    """What a process is to the probe (no paths: the record is committed)."""
    if int(pid) == os.getpid():
        return "client (this probe)"
    if "EngineCore" in cmd:
        return "engine core"
    if "api_server" in cmd:
        return "API server"
    return f"other ({Path(cmd.split(' ')[0]).name})"


def steps_of(records: list[RequestRecord]) -> dict[str, np.ndarray]:
    """The engine steps read from the token stream (each step after the first): end time, tokens, first tokens,
    duration and the idle time before it. A step starts when the one before it ends, or, if the engine had
    nothing to do until then, when the latest of the prompts whose first token it emits arrived."""
    events = sorted((t, i == 0, r.sent_s) for r in records for i, t in enumerate(r.token_s))
    t = np.array([e[0] for e in events])
    first = np.array([e[1] for e in events], dtype=float)
    sent = np.array([e[2] if e[1] else -np.inf for e in events])
    step = np.concatenate([[0], np.cumsum(np.diff(t) > STEP_GAP_S)])
    n = int(step[-1]) + 1
    end, latest_sent = np.full(n, -np.inf), np.full(n, -np.inf)
    np.maximum.at(end, step, t)
    np.maximum.at(latest_sent, step, sent)
    start = np.maximum(end[:-1], latest_sent[1:])
    return {"end": end[1:], "tokens": np.bincount(step, minlength=n)[1:].astype(float),
            "prompts": np.bincount(step, weights=first, minlength=n)[1:], "duration": end[1:] - start,
            "idle": start - end[:-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reanalyse", type=Path, help="a record to predict again (no engine needed)")
    ap.add_argument("--engine-python")
    ap.add_argument("--config", default="off", choices=sorted(c for c in CONFIGS if not CONFIGS[c].disaggregated))
    ap.add_argument("--rate", type=float, default=2.8, help="offered req/s of the load point")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--decode-prompt", type=int, default=512, help="prompt tokens of the probe's decodes")
    ap.add_argument("--out", type=Path, default=Path("probe.json"))
    a = ap.parse_args()
    if a.reanalyse is not None:
        reanalyse(a.reanalyse)
        return
    if a.engine_python is None:
        ap.error("--engine-python is required to run the engine")
    cfg = CONFIGS[a.config]
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"pdplan-probe-{os.getpid()}"
    work.mkdir(parents=True)
    ceilings = R._ceilings()
    out: dict = {"config": a.config, "rate_rps": a.rate, "dtype": ceilings.dtype, "machine": ceilings.device_name}
    try:
        run_probe(a, cfg, work, ceilings, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_probe(a: argparse.Namespace, cfg, work: Path, ceilings, out: dict) -> None:  # type: ignore[no-untyped-def]
    dtype = ceilings.dtype
    model_dir = write_model(work / "model", seed=0, dtype=dtype)
    rng = np.random.default_rng(1)
    with R._servers(a.engine_python, model_dir, work, cfg, dtype) as ports, R._client_core(1):
        port = ports[0]
        # the full run's calibration: decode steps at batch 1, 8 and 32 at the load point's context (the quick
        # one has only 1 and 16 there, and missed batch 8 by up to 37% on one start)
        calib, device = R._calibrate(port, cfg, ceilings, False)
        out["efficiency"] = device.efficiency.model_dump()
        out["calibration"] = {"fit_rms_rel_error": calib.fit_rms_rel_error,
                              "steps": [s.model_dump() for s in calib.steps]}
        pm = PoolModel.build(ENGINE_MODEL, Pool(gpu=device.id, max_batch=64, weight_dtype=dtype, kv_dtype=dtype),
                             Workload(rate=1.0, isl=ISL, osl=OSL), device)
        out["hybrid"] = []
        for batch in (8, 32):
            for tokens in (128, 512):
                if cfg.chunk_tokens is not None and tokens > cfg.chunk_tokens - batch:
                    continue
                tries = [asyncio.run(hybrid_gap(port, batch, tokens, a.decode_prompt, rng)) for _ in range(3)]
                ctx = statistics.mean(x[2] for x in tries)
                row = {"decodes": batch, "prompt_tokens": tokens, "context": ctx,
                       "hybrid_ms": statistics.median(x[0] for x in tries) * 1e3,
                       "predicted_hybrid_ms": float(pm.hybrid_s(batch, ctx, tokens, 0.0)) * 1e3,
                       "decode_ms": statistics.median(x[1] for x in tries) * 1e3,
                       "predicted_decode_ms": float(pm.decode_s(batch, ctx)) * 1e3}
                print(row, flush=True)
                out["hybrid"].append(row)
        prompts = [prompt(ISL, rng) for _ in range(a.requests)]
        before, wall0, metrics0 = cpu_seconds(), time.time(), asyncio.run(R._metrics(port))
        recs = asyncio.run(poisson_load(R._sender(ports, cfg), prompts, ISL, OSL, a.rate, rng))
        after, wall, metrics1 = cpu_seconds(), time.time() - wall0, asyncio.run(R._metrics(port))
    out["cpu_share"] = {role(pid, cmd): round((t - before.get(pid, (0.0, ""))[0]) / wall, 3)
                        for pid, (t, cmd) in after.items() if t - before.get(pid, (0.0, ""))[0] > 0.02 * wall}
    out["engine_counters"] = {k: metrics1[k] - metrics0.get(k, 0.0) for k in metrics1
                              if k.endswith(("_sum", "_count", "_total")) and "bucket" not in k}
    failed = sum(not r.ok for r in recs)
    # the rate the requests arrived at counts every request sent, failed ones too (they loaded the engine)
    arrived_rps = arrival_rate_rps(recs)
    recs = [r for r in recs if r.ok]
    s = steps_of(recs)
    prompt_step = s["prompts"] > 0
    decodes = s["tokens"] - s["prompts"]
    predicted = step_predictions(pm, s["tokens"], s["prompts"])
    tpot = [(r.token_s[-1] - r.token_s[0]) / (len(r.token_s) - 1) for r in recs if len(r.token_s) > 1]
    ttft = [r.ttft_s for r in recs if r.token_s]
    out["measured"] = {"ttft_p50_ms": np.percentile(ttft, 50) * 1e3, "ttft_p90_ms": np.percentile(ttft, 90) * 1e3,
                       "tpot_p50_ms": np.percentile(tpot, 50) * 1e3, "tpot_p90_ms": np.percentile(tpot, 90) * 1e3,
                       "tpot_mean_ms": float(np.mean(tpot)) * 1e3}
    out["steps"] = {"read": int(s["end"].size + 1), "failed_requests": failed,
                    "span_s": float((s["duration"] + s["idle"]).sum()), "idle_s": float(s["idle"].sum()),
                    "prompt_steps_without_decodes": int((prompt_step & (decodes == 0)).sum()),
                    "prompt_steps_s": float(s["duration"][prompt_step].sum()),
                    "prompt_steps_predicted_s": float(predicted[prompt_step].sum()),
                    "decode_steps_s": float(s["duration"][~prompt_step].sum()),
                    "decode_steps_predicted_s": float(predicted[~prompt_step].sum()),
                    "by_prompts": {int(k): {"steps": int((s["prompts"] == k).sum()),
                                            "median_ms": float(np.median(s["duration"][s["prompts"] == k])) * 1e3,
                                            "predicted_median_ms": float(np.median(predicted[s["prompts"] == k])) * 1e3}
                                   for k in (1, 2, 3, 4) if (s["prompts"] == k).any()},
                    # every step read: tokens, first tokens, duration and the model's time for it (ms)
                    "each": {"tokens": s["tokens"].astype(int).tolist(), "prompts": s["prompts"].astype(int).tolist(),
                             "duration_ms": np.round(s["duration"] * 1e3, 3).tolist(),
                             "predicted_ms": np.round(np.asarray(predicted) * 1e3, 3).tolist()}}
    # predicted at the rate the requests arrived at: 200 Poisson arrivals stray ~7% from the offered rate, and
    # near capacity that moves TPOT by tens of percent (the first record's arrived 15% fast)
    out["arrival_rate_rps"] = arrived_rps or a.rate
    out["ceilings"] = {"matmul_flops_per_s": ceilings.matmul_flops_per_s, "memory_bytes_per_s": ceilings.memory_bytes_per_s}
    add_predictions(out, cfg, device)
    a.out.write_text(json.dumps(out, indent=1, default=float))
    for key in ("measured", "closed_form", "simulation", "simulation_at_loaded_steps", "steps", "cpu_share"):
        print(key, json.dumps(out[key], default=float))


def step_predictions(pm: PoolModel, tokens: np.ndarray, prompts: np.ndarray) -> np.ndarray:
    """The model's time for each step read from the token stream, s: ``prompts`` whole prompts (first tokens)
    beside the rest of its ``tokens`` as decodes, or a decode-only step."""
    tokens, prompts = np.asarray(tokens, dtype=float), np.asarray(prompts, dtype=float)
    decodes = tokens - prompts
    return np.where(prompts > 0, np.asarray(pm.step_s(decodes, ISL + OSL / 2, ISL, 0.0, np.maximum(prompts, 1))),
                    np.asarray(pm.decode_s(np.maximum(decodes, 1), ISL + OSL / 2)))


class LoadedSteps:
    """The fitted pool model with its step times scaled to what the engine's steps cost during the load point:
    steps that carry prompts by one factor, decode-only steps by another (both read from the token stream). The
    simulation on it separates the queueing model from the step costs: what is left is not the steps."""

    def __init__(self, pm: PoolModel, prompt_scale: float, decode_scale: float) -> None:
        self._pm, self.prompt_scale, self.decode_scale = pm, prompt_scale, decode_scale

    def decode_s(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._pm.decode_s(*args, **kwargs) * self.decode_scale

    def step_s(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._pm.step_s(*args, **kwargs) * self.prompt_scale

    def prefill_s(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._pm.prefill_s(*args, **kwargs) * self.prompt_scale

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._pm, name)


def add_predictions(out: dict, cfg, device) -> None:  # type: ignore[no-untyped-def]
    """The closed form and the simulation at the record's arrival rate, and the simulation with the steps the
    engine ran at their loaded cost (``LoadedSteps``)."""
    dtype, rate = out["dtype"], out["arrival_rate_rps"]
    w = Workload(rate=rate, isl=ISL, osl=OSL)
    d = deployment(cfg, device.id, dtype)
    e = predict(cfg, device, rate, ISL, OSL, dtype)
    sim = simulate(ENGINE_MODEL, d, w, gpus=[device], requests=4000, seed=1)
    out["closed_form"] = {"stable": e.stable, "ttft_p50_ms": e.ttft_s(50) * 1e3 if e.stable else None,
                          "ttft_p90_ms": e.ttft_s(90) * 1e3 if e.stable else None,
                          "tpot_p50_ms": e.tpot_s(50) * 1e3 if e.stable else None,
                          "tpot_p90_ms": e.tpot_s(90) * 1e3 if e.stable else None,
                          "tpot_mean_ms": e.tpot_mean_s * 1e3, "utilisation": e.utilisation, "binding": e.binding}
    out["simulation"] = {"stable": sim.stable, "decode_batch": sim.decode_batch,
                         "tpot_mean_ms_by_littles_law": sim.decode_batch / rate / (OSL - 1) * 1e3,
                         **{f"{k}_p{p}_ms": v[p] * 1e3 for k, v in (("ttft", sim.ttft_by_percentile_s),
                                                                     ("tpot", sim.tpot_by_percentile_s))
                            for p in (50, 90) if p in v}}
    st = out["steps"]
    pm = PoolModel.build(ENGINE_MODEL, d.pool, w, device)
    each = st.get("each")
    if each:  # the steps predicted again by this version's step model (a reanalysis), so the scales are its own
        prompts = np.asarray(each["prompts"], dtype=float)
        predicted = step_predictions(pm, each["tokens"], prompts)
        st["prompt_steps_predicted_s"] = float(predicted[prompts > 0].sum())
        st["decode_steps_predicted_s"] = float(predicted[prompts == 0].sum())
        each["predicted_ms"] = np.round(predicted * 1e3, 3).tolist()
        for k, row in st.get("by_prompts", {}).items():
            row["predicted_median_ms"] = float(np.median(predicted[prompts == int(k)])) * 1e3
    loaded = LoadedSteps(pm, st["prompt_steps_s"] / st["prompt_steps_predicted_s"],
                         st["decode_steps_s"] / st["decode_steps_predicted_s"])
    t = run_deployment(ENGINE_MODEL, d, w, [loaded], requests=4000, seed=1)  # type: ignore[list-item]
    out["simulation_at_loaded_steps"] = {"prompt_step_scale": loaded.prompt_scale,
                                         "decode_step_scale": loaded.decode_scale, "stable": t.stable,
                                         "ttft_p50_ms": t.ttft_p(50) * 1e3, "ttft_p90_ms": t.ttft_p(90) * 1e3,
                                         "tpot_p50_ms": t.tpot_p(50) * 1e3, "tpot_p90_ms": t.tpot_p(90) * 1e3,
                                         "tpot_mean_ms": float(np.nanmean(t.tpot_s)) * 1e3}


def reanalyse(path: Path) -> None:
    """Make a record's predictions again with this version of pdplan (no engine): its device from the recorded
    CPU ceilings and fitted efficiencies. Records without their ceilings (the first one) cannot be."""
    out = json.loads(path.read_text())
    if "ceilings" not in out or "arrival_rate_rps" not in out:
        raise SystemExit(f"{path}: no recorded ceilings or arrival rate; run the probe again")
    c = Ceilings(device="cpu", device_name=out["machine"], device_details="", threads=1, dtype=out["dtype"], matmul=(),
                 matmul_flops_per_s=out["ceilings"]["matmul_flops_per_s"], copy_bytes=COPY_BYTES,
                 copy_time_s=2 * COPY_BYTES / out["ceilings"]["memory_bytes_per_s"],
                 memory_bytes_per_s=out["ceilings"]["memory_bytes_per_s"], memory_total_bytes=FALLBACK_MEMORY_BYTES)
    add_predictions(out, CONFIGS[out["config"]], device_spec(c, Efficiency(**out["efficiency"])))
    path.write_text(json.dumps(out, indent=1, default=float))
    for key in ("measured", "closed_form", "simulation", "simulation_at_loaded_steps"):
        print(key, json.dumps(out[key], default=float))


COPY_BYTES = 128 * 2**20


if __name__ == "__main__":
    main()
