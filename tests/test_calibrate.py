"""``pdplan calibrate``: benchmark result files of vLLM, SGLang, genai-perf and trtllm-bench, read and fitted.

The fixtures (``tests/fixtures/bench_results``, written by ``bench/make_bench_fixtures.py``) are in
each tool's format and hold synthetic runs of Llama-3.1-8B on one H100 whose latencies pdplan's own
serving model gave at compute 0.70, memory 0.85 and a 400 us step overhead, each perturbed by up to
4%: the fit must find those constants again and reproduce every run within its reported error.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

import calculator as pc
from calculator.benchfiles import detect, parse_benchmark_text, read_benchmark_files
from calculator.calibrate import calibrate
from calculator.errors import InputError

FIX = Path(__file__).parent / "fixtures" / "bench_results"
VLLM, SGLANG, GENAI = FIX / "vllm_bench_serve.jsonl", FIX / "sglang_bench_serving.jsonl", FIX / "profile_export_genai_perf.json"
TRTLLM = FIX / "trtllm_bench_report.json"
TRUE = {"compute": 0.70, "memory": 0.85, "step_overhead_us": 400.0}


def test_each_format_is_detected_and_read_with_its_load() -> None:
    v = read_benchmark_files([VLLM])
    assert [p.tool for p in v] == ["vllm"] * 4
    first = json.loads(VLLM.read_text().splitlines()[0])
    # means from the totals: 204,800 prompt tokens / 200 requests
    assert v[0].isl_mean == first["total_input_tokens"] / first["completed"] == 1024
    assert v[0].osl_mean == 128 and v[0].request_rate_rps == 2.0 and v[0].max_concurrency is None
    assert v[0].ttft_p50_s == pytest.approx(first["median_ttft_ms"] / 1e3)
    assert v[3].request_rate_rps is None and v[3].max_concurrency == 16  # "inf" with a concurrency: a closed loop
    s = read_benchmark_files([SGLANG])
    assert [p.tool for p in s] == ["sglang"] * 3 and s[2].isl_mean == 2048 and s[2].throughput_rps == 5.0
    g = read_benchmark_files([GENAI])
    assert g[0].tool == "genai-perf" and g[0].max_concurrency == 8 and g[0].isl_mean == 512
    raw = json.loads(GENAI.read_text())
    assert g[0].tpot_p50_s == pytest.approx(raw["inter_token_latency"]["p50"] / 1e3)  # genai-perf's ITL is per request
    t = read_benchmark_files([TRTLLM])
    rep = json.loads(TRTLLM.read_text())
    # the report keeps the measured requests in flight (3.992), not the --concurrency: a closed loop of 4
    assert t[0].tool == "trtllm-bench" and t[0].max_concurrency == 4 and t[0].request_rate_rps is None
    assert t[0].isl_mean == 2048 and t[0].completed == 64
    assert t[0].ttft_p50_s == pytest.approx(rep["streaming_metrics"]["ttft_percentiles"]["p50"] / 1e3)
    assert t[0].tpot_mean_s == pytest.approx(rep["streaming_metrics"]["avg_tpot_ms"] / 1e3)
    assert t[0].throughput_rps == rep["performance"]["request_throughput_req_s"]


def test_a_bad_record_names_the_file_line_and_field(tmp_path: Path) -> None:
    lines = VLLM.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["median_ttft_ms"] = "fast"
    f = tmp_path / "runs.jsonl"
    f.write_text("\n".join([lines[0], json.dumps(bad), lines[2]]) + "\n")
    with pytest.raises(InputError) as e:
        read_benchmark_files([f])
    assert e.value.field == "files" and "runs.jsonl: line 2" in str(e.value) and "median_ttft_ms" in str(e.value)
    f.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(InputError, match=r"line 2, column 2: not JSON"):
        read_benchmark_files([f])
    with pytest.raises(InputError, match="not a result of vLLM"):
        parse_benchmark_text('{"hello": 1}', "x.json")
    with pytest.raises(InputError, match="'completed' must be positive"):
        parse_benchmark_text(json.dumps({**json.loads(lines[0]), "completed": 0}), "x.json")
    with pytest.raises(InputError, match="request_rate"):
        parse_benchmark_text(json.dumps({**json.loads(lines[0]), "request_rate": -3}), "x.json")
    with pytest.raises(InputError, match="empty"):
        parse_benchmark_text("  \n", "x.json")
    assert detect({"time_to_first_token": {"unit": "ms"}, "request_throughput": {"avg": 1}}) == "genai-perf"
    unstreamed = {k: v for k, v in json.loads(TRTLLM.read_text()).items() if k != "streaming_metrics"}
    with pytest.raises(InputError, match="streaming_metrics.*--streaming"):
        parse_benchmark_text(json.dumps(unstreamed), "report.json")
    broken = json.loads(TRTLLM.read_text())
    broken["request_info"]["avg_input_length"] = -1
    with pytest.raises(InputError, match="report.json: request_info: field 'avg_input_length' must be positive"):
        parse_benchmark_text(json.dumps(broken), "report.json")


def test_the_fit_finds_the_constants_the_runs_were_made_with() -> None:
    fit = calibrate("llama-3.1-8b", "h100-sxm", files=[VLLM, SGLANG, GENAI, TRTLLM])
    e = fit.efficiency
    assert e.compute == pytest.approx(TRUE["compute"], rel=0.10)
    assert e.memory == pytest.approx(TRUE["memory"], rel=0.10)
    # the step overhead is ~5% of these 7-10 ms steps, the size of the runs' perturbation: found within half
    assert e.step_overhead_us == pytest.approx(TRUE["step_overhead_us"], abs=200)
    # the runs were perturbed by at most 4%: the fit reproduces them about that well, and its held-out
    # half-and-half error stays small too
    assert fit.median_abs_error < 0.04 and fit.p90_abs_error < 0.08
    assert fit.held_out_median_abs_error is not None and fit.held_out_median_abs_error < 0.08
    assert len(fit.runs) == 9 and "9 serving benchmark runs" in (e.fitted_on or "")


@pytest.mark.parametrize("results", [VLLM, SGLANG, GENAI, TRTLLM], ids=lambda p: p.name)
def test_the_fitted_profile_round_trips_through_evaluate(tmp_path: Path, results: Path) -> None:
    """The acceptance of each format: calibrate the file, save the YAML, feed it back; every run is reproduced
    as the fit reported it, within the fit's error."""
    from calculator.calibration import save_calibration

    fit = calibrate("llama-3.1-8b", "h100-sxm", files=[results])
    path = tmp_path / "cal.yaml"
    save_calibration(path, fit.efficiency, device=fit.gpu)
    assert yaml.safe_load(path.read_text())["efficiency"]["compute"] == pytest.approx(fit.efficiency.compute)
    closed, errors = 0, []
    for run in fit.runs:  # the YAML fed back reproduces each run as the fit reported it
        d = pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm", **(
            {"max_batch": run.max_concurrency} if run.max_concurrency else {})))
        if run.max_concurrency:  # a closed loop (request_rate "inf"): N requests in flight, its means
            c = pc.closed_loop("llama-3.1-8b", d, run.isl_mean, run.osl_mean, run.max_concurrency, calibration=path)
            ttft, tpot = c.ttft_s, c.tpot_s
            closed += 1
        else:
            ev = pc.evaluate("llama-3.1-8b", d, pc.Workload(rate=run.throughput_rps, isl=run.isl_mean,
                                                            osl=run.osl_mean), calibration=path)
            ttft, tpot = ev.ttft_s(50), ev.tpot_s(50)
        assert ttft == pytest.approx(run.ttft_predicted_s, rel=1e-9)
        assert tpot == pytest.approx(run.tpot_predicted_s, rel=1e-9)
        errors += [abs(ttft / run.ttft_measured_s - 1), abs(tpot / run.tpot_measured_s - 1)]
    assert closed == sum(p.max_concurrency is not None for p in read_benchmark_files([results]))
    # within the error the fit reports: its median, and none beyond its largest
    assert float(np.median(errors)) == pytest.approx(fit.median_abs_error, rel=1e-6)
    assert max(errors) <= fit.max_abs_error + 1e-9 and fit.max_abs_error < 0.08


def test_bad_calls_are_clear() -> None:
    with pytest.raises(InputError, match="either benchmark runs or result files"):
        calibrate("llama-3.1-8b", "h100-sxm")
    with pytest.raises(InputError) as e:
        calibrate("llama-3.1-8b", "h100-sxm", files=[VLLM], tp=3)
    assert "tp" in str(e.value)
    with pytest.raises(InputError, match="at least one"):
        read_benchmark_files([])
    assert math.isfinite(calibrate("llama-3.1-8b", "h100-sxm", files=[GENAI]).median_abs_error)


def test_cli_writes_a_profile_that_evaluate_and_plan_take(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from calculator.cli import app

    runner = CliRunner()
    cal = tmp_path / "cal.yaml"
    r = runner.invoke(app, ["calibrate", str(VLLM), str(GENAI), "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                            "--out", str(cal)])
    assert r.exit_code == 0, r.output
    assert "compute efficiency" in r.output and "held out" in r.output and cal.is_file()
    body = yaml.safe_load(cal.read_text())
    assert body["device"] == "h100-sxm" and body["runs"] == 5 and body["efficiency"]["compute"] == pytest.approx(0.7, rel=0.1)
    args = ["evaluate", "llama-3.1-8b", "--rate", "4", "--pool", "h100-sxm", "--isl", "1024", "--osl", "128", "--json"]
    plain = json.loads(runner.invoke(app, args).output)
    tuned = json.loads(runner.invoke(app, [*args, "--calibration", str(cal)]).output)
    # the CLI applies the profile as Python does, and the profile moves the answer off the bundled constants
    py = pc.evaluate("llama-3.1-8b", pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm")),
                     pc.Workload(rate=4, isl=1024, osl=128), calibration=cal)
    assert tuned["tpot_mean_s"] == pytest.approx(py.tpot_mean_s, rel=1e-9)
    assert abs(tuned["tpot_mean_s"] / plain["tpot_mean_s"] - 1) > 0.02
    r = runner.invoke(app, ["plan", "llama-3.1-8b", "--rate", "4", "--ttft", "2s", "--tpot", "50ms", "--gpu", "h100-sxm",
                            "--calibration", str(cal), "--json"])
    assert r.exit_code == 0, r.output
    # the fit does not carry the H100's block-scaled fp8 limit (0.6, a property of Hopper's tensor cores) to the
    # file: applied to a B200 the profile leaves it unlimited, applied to an H200 that GPU's 0.6 holds (a file
    # written with the H100's 0.6 slowed DeepSeek-V3's B200 MoE decode row from 5.5 to 8.3 ms)
    assert "block_scaled_memory" not in body["efficiency"]
    from calculator.calibration import apply_calibration

    assert apply_calibration(pc.load_gpu("b200"), cal).efficiency.block_scaled_memory == 0.0
    assert apply_calibration(pc.load_gpu("h200-sxm"), cal).efficiency.block_scaled_memory == 0.6
    # a file that is not a benchmark: exit 2, the file and the reason named
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    r = runner.invoke(app, ["calibrate", str(bad), "--model", "llama-3.1-8b", "--gpu", "h100-sxm"])
    assert r.exit_code == 2 and "notes.json" in r.output and "not a result of vLLM" in r.output


def test_rest_calibrate_and_its_profile_in_plan() -> None:
    from fastapi.testclient import TestClient

    from api.app import app

    client = TestClient(app)
    r = client.post("/v1/calibrate", json={"model": "llama-3.1-8b", "gpu": "h100-sxm", "files": [
        {"name": "sglang.jsonl", "content": SGLANG.read_text()}, {"name": "genai.json", "content": GENAI.read_text()}]})
    assert r.status_code == 200, r.text
    body = r.json()
    eff = body["fit"]["efficiency"]
    assert eff["compute"] == pytest.approx(0.7, rel=0.1) and "efficiency:" in body["calibration_yaml"]
    p = client.post("/v1/plan", json={"model": "llama-3.1-8b", "workload": {"rate": 4, "isl": 1024, "osl": 128},
                                      "slo": {"ttft_s": 2, "tpot_s": 0.05}, "gpus": ["h100-sxm"], "calibration": eff})
    assert p.status_code == 200, p.text
    bad = client.post("/v1/calibrate", json={"model": "llama-3.1-8b", "gpu": "h100-sxm",
                                             "files": [{"name": "x.jsonl", "content": "{\"completed\": 3}\n"}]})
    assert bad.status_code == 422 and "x.jsonl" in bad.text
    assert client.post("/v1/calibrate", json={"model": "llama-3.1-8b", "gpu": "h100-sxm", "files": []}).status_code == 422


def test_a_calibration_with_lower_efficiency_needs_more_gpus() -> None:
    w, slo = pc.Workload(rate=30, isl=2000, osl=200), pc.SLO(ttft_s=1.0, tpot_s=0.04)
    base = pc.plan("llama-3.1-8b", w, slo, gpus=["h100-sxm"], modes=["mixed"])
    slow = pc.plan("llama-3.1-8b", w, slo, gpus=["h100-sxm"], modes=["mixed"],
                   calibration={"compute": 0.3, "memory": 0.4, "step_overhead_us": 400.0})
    assert base.feasible and slow.feasible and slow.best.num_gpus > base.best.num_gpus


def test_runs_that_no_efficiency_can_serve_are_refused() -> None:
    h100 = pc.load_gpu("h100-sxm")
    tiny = h100.model_copy(update={"id": "tiny-gpu", "hbm_bandwidth_tb_s": 1e-4,
                                   "peak_tflops": h100.peak_tflops.model_copy(update={"bf16": 1e-3})})
    with pytest.raises(InputError, match="cannot serve any run"):  # open-loop runs at their Poisson rates
        calibrate("llama-3.1-8b", tiny, files=[SGLANG])
    # a closed loop is served at whatever rate the engine manages, so it is fitted, and badly
    fit = calibrate("llama-3.1-8b", tiny, files=[GENAI])
    assert fit.unstable_runs == 0 and fit.median_abs_error > 10
