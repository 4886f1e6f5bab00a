"""Request traces: real arrival times and lengths, read into a ``Workload`` and the trace's statistics.

Formats (``format="auto"`` tells them apart by the header or the first record):

- **Azure LLM inference traces** (2023, 2024): CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``,
  the timestamp a date and time with up to 7 fractional digits (``2023-11-16 18:15:46.6805900``).
- **Mooncake / Kimi traces**: JSONL, one request a line: ``timestamp`` (ms), ``input_length``,
  ``output_length`` and ``hash_ids``, one hash per 512-token block of the prompt (a block's hash
  covers every token before it, so a request's cached prefix is its leading blocks already seen).
- **BurstGPT**: CSV ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``, the
  timestamp in seconds. Failed requests have 0 response tokens: they are left out and counted.
- **csv**: ``timestamp_s,isl,osl`` (any order; extra columns ignored).

A malformed row is an ``InputError`` naming the file, the line and the column; nothing is loaded
half-way. The statistics: the mean rate over the window, the squared coefficient of variation of the
inter-arrival times (1 for Poisson, above 1 for bursty traffic), the length means, and for traces
with block hashes the share of prompt tokens a prefix cache of a given size would serve (LRU over
blocks).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .errors import InputError
from .files import json_lines, read_text_file
from .limits import MAX_SAMPLES, MAX_TOKENS

TraceFormat = Literal["auto", "azure", "mooncake", "burstgpt", "csv"]
FORMATS: tuple[TraceFormat, ...] = ("auto", "azure", "mooncake", "burstgpt", "csv")
MAX_TRACE_BYTES = 256 * 2**20
"""A trace file larger than this is refused (the public Azure day-long traces are ~20-60 MB)."""
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Trace:
    """The requests of a trace, in arrival order: arrival times (s, from the first), prompt and output tokens,
    and the prompt's block hashes where the format has them."""

    source: str
    format: str
    arrival_s: np.ndarray
    isl: np.ndarray
    osl: np.ndarray
    hash_ids: tuple[tuple[int, ...], ...] | None
    skipped: int = 0


class TraceStats(BaseModel):
    """What a trace says about its traffic."""

    model_config = ConfigDict(frozen=True)

    source: str
    format: str
    requests: int
    skipped: int = Field(description="rows left out (BurstGPT's failed requests, with 0 response tokens)")
    duration_s: float = Field(description="first to last arrival")
    rate_rps: float = Field(description="requests / duration (arrivals per second over the window)")
    arrival_cv2: float = Field(description="squared coefficient of variation of the inter-arrival times: 1 is "
                               "Poisson, above 1 bursty")
    isl_mean: float
    osl_mean: float
    isl_cv: float
    osl_cv: float
    prefix_hit: float | None = Field(description="share of prompt tokens a prefix cache of cache_tokens would serve "
                                     "(traces with block hashes; None otherwise)")
    cache_tokens: int | None = Field(description="the prefix cache's size in tokens (None: unbounded)")


def read_trace(path: str | os.PathLike[str], format: TraceFormat = "auto",
               window: tuple[float, float] | None = None) -> Trace:
    """The requests of a trace file, optionally only those arriving in ``window`` = (start, end) seconds from the
    trace's first arrival."""
    p = Path(path)
    if format not in FORMATS:
        raise InputError("format", f"choose one of {', '.join(FORMATS)}, got {format!r}")
    return parse_trace(read_text_file(p, "trace", MAX_TRACE_BYTES), p.name, format, window)


def parse_trace(text: str, name: str, format: TraceFormat = "auto",
                window: tuple[float, float] | None = None) -> Trace:
    """``read_trace`` on a trace's text (``name`` is what errors cite)."""
    if format not in FORMATS:
        raise InputError("format", f"choose one of {', '.join(FORMATS)}, got {format!r}")
    fmt = _detect(text, name) if format == "auto" else format
    trace = {"azure": _azure, "mooncake": _mooncake, "burstgpt": _burstgpt, "csv": _generic}[fmt](text, name)
    if trace.arrival_s.size == 0:
        why = (f" (all {trace.skipped:,} rows are failed requests, with 0 response tokens, which are left out)"
               if trace.skipped else "")
        raise InputError("trace", f"{name}: no requests{why}")
    order = np.argsort(trace.arrival_s, kind="stable")
    t = trace.arrival_s[order] - trace.arrival_s[order][0]
    keep = np.ones(t.size, dtype=bool)
    if window is not None:
        start, end = window
        if not (math.isfinite(start) and math.isfinite(end) and 0 <= start < end):
            raise InputError("window", f"give (start, end) seconds with 0 <= start < end, got {window!r}")
        keep = (t >= start) & (t < end)
        if keep.sum() < 2:
            raise InputError("window", f"{name}: fewer than 2 requests arrive in {start:g}-{end:g} s")
    hashes = None if trace.hash_ids is None else tuple(trace.hash_ids[i] for i in order[keep])
    return Trace(trace.source, fmt, t[keep] - t[keep][0], trace.isl[order][keep], trace.osl[order][keep], hashes,
                 trace.skipped)


def _detect(text: str, name: str) -> str:
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.lstrip().startswith("{"):
        return "mooncake"
    header = [h.strip() for h in first.split(",")]
    if header[:3] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
        return "azure"
    if "Request tokens" in header and "Response tokens" in header:
        return "burstgpt"
    if {"timestamp_s", "isl", "osl"} <= set(header):
        return "csv"
    raise InputError("trace", f"{name}: line 1: not a known trace format (Azure: TIMESTAMP,ContextTokens,"
                              "GeneratedTokens; BurstGPT: Timestamp,...,Request tokens,Response tokens; csv: "
                              "timestamp_s,isl,osl; Mooncake: JSON lines)")


def _rows(text: str, name: str, need: tuple[str, ...]) -> tuple[list[str], list[tuple[int, list[str]]]]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputError("trace", f"{name}: empty") from None
    missing = [c for c in need if c not in header]
    if missing:
        raise InputError("trace", f"{name}: line 1: missing column(s) {', '.join(missing)}")
    return header, [(reader.line_num, row) for row in reader if row and any(c.strip() for c in row)]


def _cell(row: list[str], header: list[str], col: str, name: str, line: int) -> str:
    i = header.index(col)
    if i >= len(row):
        raise InputError("trace", f"{name}: line {line}, column {i + 1} ({col}): missing")
    return row[i].strip()


def _tokens(value: str, name: str, line: int, col: int, label: str, zero_ok: bool = False) -> int:
    try:
        n = int(value)
    except ValueError:
        raise InputError("trace", f"{name}: line {line}, column {col} ({label}): not a whole number: {value!r}") from None
    if n < (0 if zero_ok else 1) or n > MAX_TOKENS:
        raise InputError("trace", f"{name}: line {line}, column {col} ({label}): {n} is outside "
                                  f"{0 if zero_ok else 1}...{MAX_TOKENS:,} tokens")
    return n


def _seconds(value: str, name: str, line: int, col: int, label: str) -> float:
    try:
        t = float(value)
    except ValueError:
        raise InputError("trace", f"{name}: line {line}, column {col} ({label}): not a number: {value!r}") from None
    if not math.isfinite(t):
        raise InputError("trace", f"{name}: line {line}, column {col} ({label}): not finite")
    return t


def _azure(text: str, name: str) -> Trace:
    header, rows = _rows(text, name, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    ts, isl, osl = [], [], []
    for line, row in rows:
        stamp = _cell(row, header, "TIMESTAMP", name, line)
        base, _, frac = stamp.partition(".")
        try:
            when = dt.datetime.fromisoformat(base).replace(tzinfo=dt.UTC)
            sub = float(f"0.{frac}") if frac else 0.0
        except ValueError:
            raise InputError("trace", f"{name}: line {line}, column 1 (TIMESTAMP): not a date and time: "
                                      f"{stamp!r}") from None
        ts.append(when.timestamp() + sub)
        isl.append(_tokens(_cell(row, header, "ContextTokens", name, line), name, line, 2, "ContextTokens"))
        osl.append(_tokens(_cell(row, header, "GeneratedTokens", name, line), name, line, 3, "GeneratedTokens"))
    return Trace(name, "azure", np.array(ts), np.array(isl), np.array(osl), None)


def _burstgpt(text: str, name: str) -> Trace:
    header, rows = _rows(text, name, ("Timestamp", "Request tokens", "Response tokens"))
    cols = {c: header.index(c) + 1 for c in ("Timestamp", "Request tokens", "Response tokens")}
    ts, isl, osl, skipped = [], [], [], 0
    for line, row in rows:
        t = _seconds(_cell(row, header, "Timestamp", name, line), name, line, cols["Timestamp"], "Timestamp")
        out = _tokens(_cell(row, header, "Response tokens", name, line), name, line, cols["Response tokens"],
                      "Response tokens", zero_ok=True)
        inp = _tokens(_cell(row, header, "Request tokens", name, line), name, line, cols["Request tokens"],
                      "Request tokens")
        if out == 0:  # a failed request: nothing was generated
            skipped += 1
            continue
        ts.append(t)
        isl.append(inp)
        osl.append(out)
    return Trace(name, "burstgpt", np.array(ts, dtype=float), np.array(isl, dtype=int), np.array(osl, dtype=int),
                 None, skipped)


def _generic(text: str, name: str) -> Trace:
    header, rows = _rows(text, name, ("timestamp_s", "isl", "osl"))
    cols = {c: header.index(c) + 1 for c in ("timestamp_s", "isl", "osl")}
    ts, isl, osl = [], [], []
    for line, row in rows:
        ts.append(_seconds(_cell(row, header, "timestamp_s", name, line), name, line, cols["timestamp_s"], "timestamp_s"))
        isl.append(_tokens(_cell(row, header, "isl", name, line), name, line, cols["isl"], "isl"))
        osl.append(_tokens(_cell(row, header, "osl", name, line), name, line, cols["osl"], "osl"))
    return Trace(name, "csv", np.array(ts), np.array(isl), np.array(osl), None)


def _mooncake(text: str, name: str) -> Trace:
    ts, isl, osl, hashes = [], [], [], []
    for line, rec in json_lines(text, name, "trace"):
        if not isinstance(rec, dict):
            raise InputError("trace", f"{name}: line {line}: a request is a JSON object")
        for key in ("timestamp", "input_length", "output_length"):
            v = rec.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError("trace", f"{name}: line {line}: field '{key}' must be a number, got {v!r}")
        ts.append(_seconds(str(rec["timestamp"]), name, line, 1, "timestamp") / 1e3)  # ms
        isl.append(_tokens(str(int(rec["input_length"])), name, line, 1, "input_length"))
        osl.append(_tokens(str(int(rec["output_length"])), name, line, 1, "output_length"))
        h = rec.get("hash_ids", [])
        if not isinstance(h, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in h):
            raise InputError("trace", f"{name}: line {line}: field 'hash_ids' must be a list of integers")
        hashes.append(tuple(h))
    return Trace(name, "mooncake", np.array(ts), np.array(isl), np.array(osl), tuple(hashes))


def prefix_hit_ratio(trace: Trace, cache_tokens: int | None = None,
                     block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> float | None:
    """Share of prompt tokens served from a prefix cache of ``cache_tokens`` (LRU over blocks; None: unbounded),
    replaying the trace in arrival order: a request reuses its leading blocks that are cached (at most its
    prompt less one token, which every engine computes), then every block of its prompt is cached."""
    if trace.hash_ids is None:
        return None
    if cache_tokens is not None and cache_tokens < block_tokens:
        raise InputError("cache_tokens", f"a prefix cache holds whole {block_tokens}-token blocks; give at least "
                                         f"{block_tokens}, got {cache_tokens}")
    capacity = None if cache_tokens is None else cache_tokens // block_tokens
    cache: OrderedDict[int, None] = OrderedDict()
    hit = 0
    for blocks, n in zip(trace.hash_ids, trace.isl.tolist(), strict=True):
        lead = 0
        for b in blocks:
            if b not in cache:
                break
            lead += 1
        hit += min(lead * block_tokens, n - 1)
        for b in blocks:
            cache[b] = None
            cache.move_to_end(b)
        while capacity is not None and len(cache) > capacity:
            cache.popitem(last=False)
    return hit / float(trace.isl.sum())


def _cv(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x)) if x.size > 1 and np.mean(x) > 0 else 0.0


def trace_stats(trace: Trace, cache_tokens: int | None = None) -> TraceStats:
    gaps = np.diff(trace.arrival_s)
    duration = float(trace.arrival_s[-1] - trace.arrival_s[0])
    if duration <= 0:
        raise InputError("trace", f"{trace.source}: every request arrives at the same time; no rate")
    mean_gap = float(gaps.mean())
    return TraceStats(
        source=trace.source, format=trace.format, requests=int(trace.arrival_s.size), skipped=trace.skipped,
        duration_s=duration, rate_rps=(trace.arrival_s.size - 1) / duration,
        arrival_cv2=float(gaps.var() / mean_gap**2) if mean_gap > 0 else 0.0,
        isl_mean=float(trace.isl.mean()), osl_mean=float(trace.osl.mean()), isl_cv=_cv(trace.isl),
        osl_cv=_cv(trace.osl), prefix_hit=prefix_hit_ratio(trace, cache_tokens), cache_tokens=cache_tokens,
    )


def _subsample(x: np.ndarray) -> list[int]:
    """At most MAX_SAMPLES lengths, evenly spaced through the trace (deterministic)."""
    if x.size <= MAX_SAMPLES:
        return x.astype(int).tolist()
    idx = np.linspace(0, x.size - 1, MAX_SAMPLES).round().astype(int)
    return x[idx].astype(int).tolist()


def workload_from_trace(path: str | os.PathLike[str], format: TraceFormat = "auto",
                        window: tuple[float, float] | None = None, cache_tokens: int | None = None,
                        rate_scale: float = 1.0):  # type: ignore[no-untyped-def]
    """(Workload, TraceStats) of a trace file: its rate (times ``rate_scale``), its prompt and output lengths as
    samples (at most ``MAX_SAMPLES``, evenly spaced), its burstiness as ``arrival_cv``, and for traces with block
    hashes the prefix-hit ratio of a cache of ``cache_tokens``."""
    return workload_of(read_trace(path, format, window), cache_tokens, rate_scale)


def workload_of(trace: Trace, cache_tokens: int | None = None, rate_scale: float = 1.0):  # type: ignore[no-untyped-def]
    """(Workload, TraceStats) of a trace already read (``workload_from_trace``)."""
    from .serving.workload import Workload

    if isinstance(rate_scale, bool) or not isinstance(rate_scale, (int, float)) or not 0 < rate_scale <= 1e4:
        raise InputError("rate_scale", f"give a positive factor up to 10,000, got {rate_scale!r}")
    stats = trace_stats(trace, cache_tokens)
    w = Workload(rate=stats.rate_rps * rate_scale, isl={"samples": _subsample(trace.isl)},
                 osl={"samples": _subsample(trace.osl)}, prefix_hit=min(stats.prefix_hit or 0.0, 0.99),
                 arrival_cv=math.sqrt(stats.arrival_cv2))
    return w, stats


__all__ = ["FORMATS", "Trace", "TraceStats", "parse_trace", "prefix_hit_ratio", "read_trace", "trace_stats",
           "workload_from_trace", "workload_of"]
