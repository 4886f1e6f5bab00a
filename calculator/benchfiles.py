"""Serving-benchmark result files, read into one record per benchmark run (``BenchPoint``).

Formats, detected per record (a JSON file holds one record, a JSONL file one per line):

- **vLLM** ``vllm bench serve --save-result`` (and ``benchmarks/benchmark_serving.py``): one JSON
  object with ``num_prompts``, ``request_rate`` (a number or ``"inf"``), ``max_concurrency``,
  ``completed``, ``total_input_tokens``, ``total_output_tokens``, ``request_throughput`` and the
  ``{mean,median,p99}_{ttft,tpot,itl}_ms`` statistics; ``--append-result`` writes one per line.
- **SGLang** ``python -m sglang.bench_serving --output-file``: JSONL, one object per run, with
  ``dataset_name``, ``request_rate``, ``max_concurrency``, ``completed``, the token totals,
  ``request_throughput`` and the same ``*_ttft_ms`` / ``*_tpot_ms`` / ``*_itl_ms`` statistics.
- **NVIDIA genai-perf / AIPerf** profile exports (``profile_export_genai_perf.json``,
  ``profile_export_aiperf.json``): one object whose metrics are ``{"unit": ..., "avg": ..., "p50":
  ...}`` mappings: ``time_to_first_token``, ``inter_token_latency``, ``request_throughput``,
  ``input_sequence_length``, ``output_sequence_length`` (at the top level or under
  ``llm_metrics``); the load (``concurrency`` or ``request_rate``) from ``input_config`` when present.
- **TensorRT-LLM** ``trtllm-bench throughput --streaming --report_json`` (or ``latency --report_json``): one
  object with ``engine``, ``world_info``, ``request_info`` (``num_requests``, ``avg_num_concurrent_requests``,
  ``avg_input_length``, ``avg_output_length``), ``performance`` (``request_throughput_req_s``) and
  ``streaming_metrics`` (``avg_ttft_ms``, ``ttft_percentiles``, ``avg_tpot_ms``, ``tpot_percentiles``, each
  percentile mapping with ``p50``). The report does not keep the ``--concurrency`` it ran at, only the
  measured mean of requests in flight, so the run is taken as a closed loop of that many (rounded); it runs
  in-process, with no HTTP server in front (its TTFT has no request path). Layout from TensorRT-LLM's
  ``tensorrt_llm/bench/dataclasses/reporting.py`` (1.x).

Every number is checked (finite, positive where it must be); an error names the file, the line and
the field. Nothing is loaded half-way: one bad record fails the whole read.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import InputError
from .files import json_lines, read_text_file

MAX_BENCH_FILE_BYTES = 16 * 2**20
"""A result file larger than this is refused (vLLM's ``--save-detailed`` files hold every token's gap)."""
MAX_BENCH_POINTS = 64
"""Benchmark runs one calibration may take (each is one serving-model evaluation per fit iteration)."""

Tool = Literal["vllm", "sglang", "genai-perf", "trtllm-bench"]


class BenchPoint(BaseModel):
    """One benchmark run: the load it offered, what it achieved and its latency statistics (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(description="file and line (or record) it came from")
    tool: Tool
    request_rate_rps: float | None = Field(description="offered Poisson rate; None: as fast as the concurrency allows")
    max_concurrency: int | None = Field(description="requests in flight at most (a closed loop); None: open loop")
    completed: int = Field(ge=1)
    throughput_rps: float = Field(gt=0, description="completed requests per second of the run")
    isl_mean: float = Field(gt=0, description="prompt tokens per request, mean")
    osl_mean: float = Field(gt=0, description="output tokens per request, mean")
    ttft_p50_s: float | None = None
    ttft_mean_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_mean_s: float | None = None
    itl_p50_s: float | None = None


def read_benchmark_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[BenchPoint, ...]:
    """Every benchmark run in ``paths`` (``InputError`` on ``files`` naming the file, line and field)."""
    points: list[BenchPoint] = []
    paths = list(paths)
    if not paths:
        raise InputError("files", "give at least one benchmark result file")
    for path in paths:
        p = Path(path)
        text = read_text_file(p, "files", MAX_BENCH_FILE_BYTES)
        points += parse_benchmark_text(text, str(p))
    if len(points) > MAX_BENCH_POINTS:
        raise InputError("files", f"{len(points)} benchmark runs; at most {MAX_BENCH_POINTS} per calibration")
    return tuple(points)


def parse_benchmark_text(text: str, name: str) -> list[BenchPoint]:
    """The runs in one file's text: a JSON object, a JSON list of objects, or JSONL."""
    stripped = text.strip()
    if not stripped:
        raise InputError("files", f"{name}: the file is empty")
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        return [_record(whole, name)]
    if isinstance(whole, list):
        return [_record(r, f"{name}: record {i + 1}") for i, r in enumerate(whole)]
    return [_record(rec, f"{name}: line {i}") for i, rec in json_lines(text, name, "files")]


def detect(rec: Mapping[str, Any]) -> Tool | None:
    """Which tool wrote a record, from the keys each one always writes."""
    if all(isinstance(rec.get(k), Mapping) for k in ("world_info", "request_info", "performance")):
        return "trtllm-bench"
    metrics = rec.get("llm_metrics") if isinstance(rec.get("llm_metrics"), Mapping) else rec
    if isinstance(metrics.get("time_to_first_token"), Mapping) and isinstance(metrics.get("request_throughput"), Mapping):
        return "genai-perf"
    if "median_ttft_ms" in rec and "request_throughput" in rec:
        if "dataset_name" in rec or "total_output_tokens_retokenized" in rec or "server_info" in rec:
            return "sglang"
        return "vllm"
    return None


def _record(rec: object, where: str) -> BenchPoint:
    if not isinstance(rec, Mapping):
        raise InputError("files", f"{where}: a benchmark record is a JSON object, got {type(rec).__name__}")
    tool = detect(rec)
    if tool is None:
        raise InputError("files", f"{where}: not a result of vLLM's bench serve, SGLang's bench_serving, "
                                  "genai-perf/AIPerf or trtllm-bench (no median_ttft_ms + request_throughput, "
                                  "no time_to_first_token statistics mapping, no world_info + request_info + "
                                  "performance)")
    if tool == "genai-perf":
        return _genai_perf(rec, where)
    if tool == "trtllm-bench":
        return _trtllm_bench(rec, where)
    return _vllm_like(rec, where, tool)


def _num(rec: Mapping[str, Any], key: str, where: str, positive: bool = True, required: bool = True) -> float | None:
    v = rec.get(key)
    if v is None:
        if required:
            raise InputError("files", f"{where}: field '{key}' is missing")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InputError("files", f"{where}: field '{key}' must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise InputError("files", f"{where}: field '{key}' must be positive, got {v!r}")
    if not positive and v < 0:
        raise InputError("files", f"{where}: field '{key}' must not be negative, got {v!r}")
    return float(v)


def _rate(v: object, where: str, key: str) -> float | None:
    """An offered rate: a positive number, or inf / "inf" / null for as fast as possible."""
    if v is None or v == "inf" or (isinstance(v, float) and math.isinf(v) and v > 0):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InputError("files", f"{where}: field '{key}' must be a positive rate or \"inf\", got {v!r}")
    return float(v)


def _concurrency(v: object, where: str, key: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 1 or v != int(v):
        raise InputError("files", f"{where}: field '{key}' must be a positive whole number, got {v!r}")
    return int(v)


def _ms(rec: Mapping[str, Any], key: str, where: str) -> float | None:
    v = _num(rec, key, where, positive=False, required=False)
    return None if v is None else v / 1e3


def _vllm_like(rec: Mapping[str, Any], where: str, tool: Tool) -> BenchPoint:
    completed = _num(rec, "completed", where)
    assert completed is not None
    tin = _num(rec, "total_input_tokens", where)
    tout = _num(rec, "total_output_tokens", where)
    thr = _num(rec, "request_throughput", where)
    assert tin is not None and tout is not None and thr is not None
    ttft = _ms(rec, "median_ttft_ms", where)
    if ttft is None:
        raise InputError("files", f"{where}: field 'median_ttft_ms' is missing")
    return BenchPoint(
        source=where, tool=tool, request_rate_rps=_rate(rec.get("request_rate"), where, "request_rate"),
        max_concurrency=_concurrency(rec.get("max_concurrency"), where, "max_concurrency"), completed=int(completed),
        throughput_rps=thr, isl_mean=tin / completed, osl_mean=tout / completed,
        ttft_p50_s=ttft, ttft_mean_s=_ms(rec, "mean_ttft_ms", where), tpot_p50_s=_ms(rec, "median_tpot_ms", where),
        tpot_mean_s=_ms(rec, "mean_tpot_ms", where), itl_p50_s=_ms(rec, "median_itl_ms", where),
    )


def _stat(metrics: Mapping[str, Any], name: str, stat: str, where: str, required: bool = False) -> float | None:
    m = metrics.get(name)
    if m is None:
        if required:
            raise InputError("files", f"{where}: field '{name}' is missing")
        return None
    if not isinstance(m, Mapping):
        raise InputError("files", f"{where}: field '{name}' must be a statistics mapping (unit, avg, p50, ...)")
    return _num(m, stat, f"{where}: {name}", positive=False, required=required)


_TO_S = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "us": 1e-6, "ns": 1e-9}


def _seconds(metrics: Mapping[str, Any], name: str, stat: str, where: str) -> float | None:
    v = _stat(metrics, name, stat, where)
    if v is None:
        return None
    unit = str(metrics[name].get("unit", "ms"))
    if unit not in _TO_S:
        raise InputError("files", f"{where}: {name}.unit '{unit}' is not a time unit ({', '.join(_TO_S)})")
    return v * _TO_S[unit]


def _genai_perf(rec: Mapping[str, Any], where: str) -> BenchPoint:
    metrics = rec["llm_metrics"] if isinstance(rec.get("llm_metrics"), Mapping) else rec
    thr = _stat(metrics, "request_throughput", "avg", where, required=True)
    isl = _stat(metrics, "input_sequence_length", "avg", where, required=True)
    osl = _stat(metrics, "output_sequence_length", "avg", where, required=True)
    assert thr is not None and isl is not None and osl is not None
    for key, v in (("request_throughput.avg", thr), ("input_sequence_length.avg", isl),
                   ("output_sequence_length.avg", osl)):
        if v <= 0:
            raise InputError("files", f"{where}: field '{key}' must be positive, got {v!r}")
    count = rec.get("request_count")
    count = count.get("avg") if isinstance(count, Mapping) else count
    cfg = rec.get("input_config") if isinstance(rec.get("input_config"), Mapping) else {}
    stimulus = cfg.get("perf_analyzer", {}).get("stimulus", {}) if isinstance(cfg.get("perf_analyzer"), Mapping) else {}
    conc = stimulus.get("concurrency", cfg.get("concurrency"))
    rate = stimulus.get("request_rate", cfg.get("request_rate"))
    ttft = _seconds(metrics, "time_to_first_token", "p50", where)
    if ttft is None:
        raise InputError("files", f"{where}: field 'time_to_first_token.p50' is missing")
    itl_p50 = _seconds(metrics, "inter_token_latency", "p50", where)
    itl_mean = _seconds(metrics, "inter_token_latency", "avg", where)
    return BenchPoint(
        source=where, tool="genai-perf", request_rate_rps=_rate(rate, where, "input_config.request_rate"),
        max_concurrency=_concurrency(conc, where, "input_config.concurrency"),
        completed=int(count) if isinstance(count, (int, float)) and not isinstance(count, bool) and count >= 1 else 1,
        throughput_rps=thr, isl_mean=isl, osl_mean=osl, ttft_p50_s=ttft,
        ttft_mean_s=_seconds(metrics, "time_to_first_token", "avg", where),
        # genai-perf's inter_token_latency is per request (its mean gap): pdplan's TPOT
        tpot_p50_s=itl_p50, tpot_mean_s=itl_mean, itl_p50_s=None,
    )


def _trtllm_bench(rec: Mapping[str, Any], where: str) -> BenchPoint:
    info, perf = rec["request_info"], rec["performance"]
    stream = rec.get("streaming_metrics")
    if not isinstance(stream, Mapping):
        raise InputError("files", f"{where}: field 'streaming_metrics' is missing: trtllm-bench writes TTFT and "
                                  "TPOT only for a streamed run (throughput --streaming, or latency)")
    n = _num(info, "num_requests", f"{where}: request_info")
    in_flight = _num(info, "avg_num_concurrent_requests", f"{where}: request_info")
    isl = _num(info, "avg_input_length", f"{where}: request_info")
    osl = _num(info, "avg_output_length", f"{where}: request_info")
    thr = _num(perf, "request_throughput_req_s", f"{where}: performance")
    assert n is not None and in_flight is not None and isl is not None and osl is not None and thr is not None

    def pct(name: str) -> float | None:
        m = stream.get(name)
        if m is None:
            return None
        if not isinstance(m, Mapping):
            raise InputError("files", f"{where}: field 'streaming_metrics.{name}' must be a percentile mapping")
        v = _num(m, "p50", f"{where}: streaming_metrics.{name}", positive=False, required=False)
        return None if v is None else v / 1e3

    ttft = pct("ttft_percentiles")
    if ttft is None:
        raise InputError("files", f"{where}: field 'streaming_metrics.ttft_percentiles.p50' is missing")
    return BenchPoint(
        source=where, tool="trtllm-bench", request_rate_rps=None, max_concurrency=max(1, round(in_flight)),
        completed=int(n), throughput_rps=thr, isl_mean=isl, osl_mean=osl, ttft_p50_s=ttft,
        ttft_mean_s=_ms(stream, "avg_ttft_ms", f"{where}: streaming_metrics"), tpot_p50_s=pct("tpot_percentiles"),
        tpot_mean_s=_ms(stream, "avg_tpot_ms", f"{where}: streaming_metrics"), itl_p50_s=None,
    )


__all__ = ["MAX_BENCH_POINTS", "BenchPoint", "detect", "parse_benchmark_text", "read_benchmark_files"]
