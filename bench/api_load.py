"""Load the REST API on loopback: one server worker, closed-loop clients, bounded request counts.

    python bench/api_load.py [--estimate-requests 4000] [--plan-requests 60]

Starts ``pdplan``'s server (``api.server.serve``: uvicorn, 1 worker) on a free port, then drives it
from this process with a lean asyncio HTTP/1.1 keep-alive client (a few tens of microseconds per
request, so the figures are the server's, not the client's): ``/v1/estimate`` at 1, 8 and 32
concurrent clients over 4,000 distinct inputs (5 models x 5 GPUs x lengths x batches: no two
consecutive requests alike), ``/v1/plan`` at 1 and 4 (4 GPU types, all modes). Prints req/s and
p50/p99 latency per case as a Markdown table and stops the server. Client and server share the
machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_name  # bench/machine.py

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


class Connection:
    """One keep-alive HTTP/1.1 connection: POST a JSON body, read the status and the whole response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def drive(port: int, path: str, bodies: list[bytes], concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    pending = list(reversed(bodies))

    async def client(conn: Connection) -> None:
        while pending:
            body = pending.pop()
            t = time.perf_counter()
            status, payload = await conn.post(path, body)
            latencies.append(time.perf_counter() - t)
            if status != 200:
                raise RuntimeError(f"{path}: {status} {payload[:200]!r}")

    conns = [await Connection.open(port) for _ in range(concurrency)]
    for body in bodies[:16]:  # warm-up: caches, first-call paths
        await conns[0].post(path, body)
    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.close()
    return elapsed, latencies


def row(name: str, concurrency: int, elapsed: float, lat: list[float]) -> str:
    q = statistics.quantiles(lat, n=100)
    return (f"| `{name}` | {concurrency} | {len(lat)} | {len(lat) / elapsed:,.0f} | "
            f"{statistics.median(lat) * 1e3:.2f} ms | {q[98] * 1e3:.2f} ms |")


def wait_ready(port: int) -> None:
    for _ in range(300):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimate-requests", type=int, default=4000)
    ap.add_argument("--plan-requests", type=int, default=60)
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", f"from api.server import serve; serve(port={port})"],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port)
        load = os.getloadavg()[0]
        print(f"machine: {cpu_name()}, {os.cpu_count()} cores, python {platform.python_version()}, "
              f"load average {load:.2f} at start; 1 server worker; the client shares the machine\n")
        print("| endpoint | clients | requests | req/s | p50 | p99 |\n|---|---|---|---|---|---|")
        estimates = [json.dumps(estimate_body(i)).encode() for i in range(a.estimate_requests)]
        plans = [json.dumps(plan_body(i)).encode() for i in range(a.plan_requests)]
        for conc, n in ((1, len(estimates) // 4), (8, len(estimates)), (32, len(estimates))):
            el, lat = asyncio.run(drive(port, "/v1/estimate", estimates[:n], conc))
            print(row("/v1/estimate", conc, el, lat), flush=True)
        for conc in (1, 4):
            el, lat = asyncio.run(drive(port, "/v1/plan", plans, conc))
            print(row("/v1/plan", conc, el, lat), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
