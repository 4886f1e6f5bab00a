"""Request traces (Azure, Mooncake, BurstGPT, plain CSV) and bursty arrivals in the serving model.

The trace figures are computed here by hand from the fixture rows (``tests/fixtures/traces``, written
in each trace's documented format). The bursty case is checked against the simulation, which draws
Gamma inter-arrivals of the same coefficient of variation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import calculator as pc
from calculator.errors import InputError
from calculator.traces import parse_trace, prefix_hit_ratio, read_trace, trace_stats, workload_from_trace

FIX = Path(__file__).parent / "fixtures" / "traces"


def _cv2(gaps: list[float]) -> float:
    g = np.array(gaps)
    return float(g.var() / g.mean() ** 2)


def test_azure_trace() -> None:
    st = trace_stats(read_trace(FIX / "azure_code.csv"))
    assert st.format == "azure" and st.requests == 7
    # 18:15:46.6805900 to 18:16:02.6805900: 16 s for 6 gaps
    assert st.duration_s == pytest.approx(16.0) and st.rate_rps == pytest.approx(6 / 16)
    gaps = [50.9951690 - 46.6805900, 51.0 - 50.9951690, 0.25, 4.5, 0.25, 62.6805900 - 56.0]
    assert st.arrival_cv2 == pytest.approx(_cv2(gaps), rel=1e-6)  # 0.96: near Poisson in this sample
    assert st.isl_mean == pytest.approx(20196 / 7) and st.osl_mean == pytest.approx(141 / 7)
    assert st.prefix_hit is None
    window = read_trace(FIX / "azure_code.csv", window=(4.0, 10.0))  # the five arrivals 4.31 ... 9.32 s
    assert window.arrival_s.size == 5 and window.arrival_s[0] == 0.0


def test_mooncake_trace_and_its_prefix_hits() -> None:
    t = read_trace(FIX / "mooncake.jsonl")
    st = trace_stats(t)
    assert st.format == "mooncake" and st.requests == 6 and st.rate_rps == pytest.approx(5 / 6)  # ms timestamps
    # unbounded cache: request 2 reuses blocks 1-2 (1,024 tokens), 4 blocks 1-3 (1,536), 5 block 5 but
    # at most its prompt less one token (511); of 6,760 prompt tokens
    assert st.prefix_hit == pytest.approx((1024 + 1536 + 511) / 6760)
    # an LRU cache of three blocks keeps only request 2's hit (hand-traced in calculator.traces' order)
    assert prefix_hit_ratio(t, cache_tokens=1536) == pytest.approx(1024 / 6760)
    with pytest.raises(InputError, match="whole 512-token blocks"):
        prefix_hit_ratio(t, cache_tokens=100)


def test_burstgpt_trace_leaves_out_failed_requests() -> None:
    st = trace_stats(read_trace(FIX / "burstgpt.csv"))
    assert st.format == "burstgpt" and st.requests == 5 and st.skipped == 1  # 0 response tokens: failed
    assert st.duration_s == pytest.approx(105.0) and st.rate_rps == pytest.approx(4 / 105)
    assert st.isl_mean == pytest.approx(3170 / 5) and st.osl_mean == pytest.approx(1035 / 5)
    assert st.arrival_cv2 == pytest.approx(_cv2([41, 1, 2, 61]))
    # a window of failed requests only says so, not just "no requests"
    text = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,ChatGPT,10,0,10,Conversation log\n"
    with pytest.raises(InputError, match=r"no requests \(all 1 rows are failed requests, with 0 response tokens"):
        parse_trace(text, "failed.csv")


def test_plain_csv_and_the_workload_it_gives() -> None:
    w, st = workload_from_trace(FIX / "generic.csv")
    assert st.format == "csv" and st.rate_rps == pytest.approx(2.0) and st.arrival_cv2 == pytest.approx(0.0)
    assert w.rate == pytest.approx(2.0) and w.arrival_cv == 0.0  # evenly spaced
    assert w.isl.samples == (1000, 2000, 1500, 500, 3000) and w.osl.mean == pytest.approx(110)
    w2 = pc.Workload.from_trace(FIX / "mooncake.jsonl", cache_tokens=1536, rate_scale=3.0)
    assert w2.rate == pytest.approx(2.5) and w2.prefix_hit == pytest.approx(1024 / 6760)
    assert w2.arrival_cv == pytest.approx(np.sqrt(_cv2([0.5, 0.5, 2.0, 0.25, 2.75])))


@pytest.mark.parametrize("name, body, where", [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\nyesterday,10,5\n",
     "a.csv: line 3, column 1 (TIMESTAMP)"),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,x,-4,3,0,y\n",
     "b.csv: line 2, column 3 (Request tokens)"),
    ("c.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 5, "output_length": 2}\n',
     "c.jsonl: line 2: field 'input_length'"),
    ("d.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 5,\n', "d.jsonl: line 2, column"),
    ("e.csv", "time,prompt,answer\n0,1,2\n", "e.csv: line 1: not a known trace format"),
    ("f.csv", "timestamp_s,isl,osl\n0,10,5\n1,10\n", "f.csv: line 3, column 3 (osl): missing"),
])
def test_a_malformed_row_names_file_line_and_column(tmp_path: Path, name: str, body: str, where: str) -> None:
    f = tmp_path / name
    f.write_text(body)
    with pytest.raises(InputError) as e:
        read_trace(f)
    assert e.value.field == "trace" and where in str(e.value)


def test_bursty_arrivals_need_more_gpus_than_poisson() -> None:
    slo = pc.SLO(ttft_s=0.5, tpot_s=0.05)
    poisson = pc.plan("llama-3.1-8b", pc.Workload(rate=20, isl=2000, osl=200), slo, gpus=["h100-sxm"],
                      modes=["mixed"])
    bursty = pc.plan("llama-3.1-8b", pc.Workload(rate=20, isl=2000, osl=200, arrival_cv=2.0), slo, gpus=["h100-sxm"],
                     modes=["mixed"])
    assert poisson.feasible and bursty.feasible and bursty.best.num_gpus > poisson.best.num_gpus


def test_bursty_ttft_against_the_simulation() -> None:
    # Gamma inter-arrivals of cv 2 (cv^2 = 4) at 39% utilisation: prompts come in clusters, so more of them
    # wait (GI/M/1: 71% against 39%) and for longer (Kingman); the simulation draws the same arrivals
    d = pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm"))
    w = pc.Workload(rate=8, isl=2000, osl=200, arrival_cv=2.0)
    e = pc.evaluate("llama-3.1-8b", d, w)
    s = pc.simulate("llama-3.1-8b", d, w, requests=4000, seed=1)
    for p in (50, 90):
        assert e.ttft_s(p) == pytest.approx(s.ttft_by_percentile_s[p], rel=0.20), p
    assert e.tpot_s(90) == pytest.approx(s.tpot_by_percentile_s[90], rel=0.25)
    poisson = pc.evaluate("llama-3.1-8b", d, w.model_copy(update={"arrival_cv": 1.0}))
    assert e.ttft_s(90) > 2 * poisson.ttft_s(90)


def test_poisson_is_the_default_and_unchanged() -> None:
    w = pc.Workload(rate=8, isl=2000, osl=200)
    assert w.arrival_cv == 1.0
    d = pc.Deployment(mode="chunked", pool=pc.Pool(gpu="h100-sxm"), chunk_tokens=1024)
    assert pc.evaluate("llama-3.1-8b", d, w).ttft_s(90) == pc.evaluate(
        "llama-3.1-8b", d, w.model_copy(update={"arrival_cv": 1.0})).ttft_s(90)
    with pytest.raises(InputError):
        pc.evaluate("llama-3.1-8b", d, {"rate": 8, "isl": 2000, "osl": 200, "arrival_cv": -1})


def test_cli_trace_and_plan_with_a_trace() -> None:
    import json

    from typer.testing import CliRunner

    from calculator.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["trace", str(FIX / "mooncake.jsonl"), "--cache-tokens", "1536", "--json"])
    assert r.exit_code == 0, r.output
    body = json.loads(r.output)
    assert body["requests"] == 6 and body["prefix_hit"] == pytest.approx(1024 / 6760)
    assert "burstiness" in runner.invoke(app, ["trace", str(FIX / "azure_code.csv")]).output
    args = ["evaluate", "llama-3.1-8b", "--rate", "8", "--pool", "h100-sxm", "--json"]
    traced = json.loads(runner.invoke(app, [*args, "--trace", str(FIX / "burstgpt.csv")]).output)
    direct = pc.evaluate("llama-3.1-8b", pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm")),
                         pc.Workload.from_trace(FIX / "burstgpt.csv").model_copy(update={"rate": 8.0}))
    assert traced["ttft_mean_s"] == pytest.approx(direct.ttft_mean_s, rel=1e-9)
    bad = runner.invoke(app, ["trace", str(FIX / "mooncake.jsonl"), "--start", "1"])
    assert bad.exit_code == 2 and "--start and --end" in bad.output


def test_the_simulation_replays_a_trace(tmp_path: Path) -> None:
    # a bursty trace written as a plain CSV: Gamma gaps of cv 2 at 8 req/s, 2,000-token prompts, 200-token outputs
    rng = np.random.default_rng(7)
    t = np.cumsum(rng.gamma(0.25, 4.0 / 8.0, 3000))
    f = tmp_path / "bursty.csv"
    f.write_text("timestamp_s,isl,osl\n" + "".join(f"{x:.6f},2000,200\n" for x in t))
    w, st = workload_from_trace(f)
    assert st.arrival_cv2 == pytest.approx(4.0, rel=0.15)
    d = pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm"))
    replayed = pc.simulate("llama-3.1-8b", d, w, replay=f)
    assert replayed.requests == 2700  # all but the 10% warm-up
    closed = pc.evaluate("llama-3.1-8b", d, w)
    assert closed.ttft_s(90) == pytest.approx(replayed.ttft_by_percentile_s[90], rel=0.25)
    # the same rate evenly spaced waits far less than the trace's bursts
    even = tmp_path / "even.csv"
    even.write_text("timestamp_s,isl,osl\n" + "".join(f"{i / 8:.6f},2000,200\n" for i in range(3000)))
    assert pc.simulate("llama-3.1-8b", d, w, replay=even).ttft_by_percentile_s[90] < 0.5 * replayed.ttft_by_percentile_s[90]
    with pytest.raises(InputError, match="at least 20"):
        pc.simulate("llama-3.1-8b", d, w, replay=FIX / "generic.csv")


def test_rest_trace_gives_the_stats_and_a_workload_for_plan() -> None:
    from fastapi.testclient import TestClient

    from api.app import app

    client = TestClient(app)
    r = client.post("/v1/trace", json={"name": "mc.jsonl", "content": (FIX / "mooncake.jsonl").read_text(),
                                       "cache_tokens": 1536, "rate_scale": 3.0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stats"]["prefix_hit"] == pytest.approx(1024 / 6760) and body["workload"]["rate"] == pytest.approx(2.5)
    p = client.post("/v1/plan", json={"model": "llama-3.1-8b", "workload": body["workload"],
                                      "slo": {"ttft_s": 2, "tpot_s": 0.05}, "gpus": ["h100-sxm"]})
    assert p.status_code == 200, p.text
    bad = client.post("/v1/trace", json={"name": "x.csv", "content": "timestamp_s,isl,osl\n0,10,5\n1,ten,5\n"})
    assert bad.status_code == 422 and "x.csv: line 3, column 2 (isl)" in bad.text
    window = client.post("/v1/trace", json={"content": (FIX / "generic.csv").read_text(), "window_s": [5, 1]})
    assert window.status_code == 422 and window.json()["detail"][0]["loc"] == ["body", "window_s"]
