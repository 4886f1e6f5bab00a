"""Load the REST API on loopback: one uvicorn worker, concurrent clients, a bounded number of requests.

    python bench/api_load.py [--estimate-requests 2000] [--plan-requests 60]

Starts ``uvicorn api:app`` (1 worker) on a free port, then drives it from this process with
asyncio + httpx: ``/v1/estimate`` at 32 concurrent clients over varied inputs, ``/v1/plan`` at 1
and at 4 concurrent clients (4 GPU types, all modes). Prints req/s and p50/p99 latency per case and
stops the server. Client and server share the machine, so the figures include the client's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-32b", "mixtral-8x7b", "deepseek-v3"]
GPUS = ["h100-sxm", "h200-sxm", "b200", "mi300x", "h20"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def estimate_body(i: int) -> dict:
    return {"model": MODELS[i % len(MODELS)], "gpu": GPUS[(i // 5) % len(GPUS)], "tp": 8 if i % 5 == 4 else 4,
            "isl": 256 + 97 * (i % 40), "osl": 64 + 13 * (i % 17), "batch": 1 + i % 32, "weight_dtype": "fp8"}


def plan_body(i: int) -> dict:
    return {"model": "llama-3.1-70b", "workload": {"rate": 4.0 + i % 9, "isl": 2000 + 250 * (i % 8), "osl": 400},
            "slo": {"ttft_s": 2.0, "tpot_s": 0.05}, "gpus": ["h100-sxm", "h200-sxm", "h20", "a100-sxm-80gb"]}


async def drive(base: str, path: str, bodies: list[dict], concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)

    async def client(c: httpx.AsyncClient) -> None:
        while not queue.empty():
            body = queue.get_nowait()
            t = time.perf_counter()
            r = await c.post(path, json=body)
            latencies.append(time.perf_counter() - t)
            if r.status_code != 200:
                raise RuntimeError(f"{path}: {r.status_code} {r.text[:200]}")

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as c:
        for b in bodies[: min(len(bodies), 8)]:  # warm-up: imports, caches, lambdified formulas
            await c.post(path, json=b)
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for _ in range(concurrency)))
        return time.perf_counter() - t0, latencies


def report(name: str, concurrency: int, elapsed: float, lat: list[float]) -> str:
    q = statistics.quantiles(lat, n=100)
    return (f"{name:14s} concurrency {concurrency:3d}: {len(lat):5d} requests, {len(lat) / elapsed:7.1f} req/s, "
            f"p50 {statistics.median(lat) * 1e3:7.1f} ms, p99 {q[98] * 1e3:7.1f} ms")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimate-requests", type=int, default=2000)
    ap.add_argument("--plan-requests", type=int, default=60)
    a = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "api:app", "--port", str(port), "--workers", "1",
                               "--log-level", "warning"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise SystemExit("server did not start")
        print(f"machine: {cpu_name()}, {os.cpu_count()} cores, python {platform.python_version()}; "
              f"uvicorn 1 worker, client in one asyncio process on the same machine")
        lines = []
        el, lat = asyncio.run(drive(base, "/v1/estimate", [estimate_body(i) for i in range(a.estimate_requests)], 32))
        lines.append(report("/v1/estimate", 32, el, lat))
        el, lat = asyncio.run(drive(base, "/v1/estimate", [estimate_body(i) for i in range(a.estimate_requests // 4)], 1))
        lines.append(report("/v1/estimate", 1, el, lat))
        for conc in (1, 4):
            el, lat = asyncio.run(drive(base, "/v1/plan", [plan_body(i) for i in range(a.plan_requests)], conc))
            lines.append(report("/v1/plan", conc, el, lat))
        print("\n".join(lines))
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
