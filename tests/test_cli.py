"""The pdplan command line: tables by default, the service models as JSON with --json, one-line errors."""

import json

import pytest
from typer.testing import CliRunner

import calculator as pc
from calculator.cli import _length, app, parse_duration

runner = CliRunner()


def _ok(*args: str):
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("text, seconds", [("2s", 2.0), ("50ms", 0.05), ("0.05", 0.05), ("200us", 2e-4),
                                           ("1m", 60.0), ("1.5 s", 1.5)])
def test_durations_take_units(text, seconds):
    assert parse_duration(text, "ttft") == pytest.approx(seconds)


def test_bad_duration_names_the_option():
    with pytest.raises(ValueError, match="^tpot: cannot read '5 parsecs'"):
        parse_duration("5 parsecs", "tpot")


def test_gpus_and_models_tables_and_json():
    assert "h100-sxm" in _ok("gpus")
    assert {g["id"] for g in json.loads(_ok("gpus", "--json"))} == set(pc.list_gpus())
    rows = json.loads(_ok("models", "--json"))
    assert next(r for r in rows if r["spec"]["id"] == "llama-3.1-8b")["param_count"] == 8_030_261_248
    assert "llama-3.1-8b" in _ok("models")


def test_kv_json_is_the_api_response():
    body = json.loads(_ok("kv", "llama-3.1-70b", "--tokens", "8192", "--batch", "32", "--tp", "4", "--json"))
    assert body["bytes_per_token"] == 327_680 and body["bytes_per_gpu_batch"] == 327_680 * 8192 * 32 / 4
    assert "327,680" in _ok("kv", "llama-3.1-70b")


def test_estimate_table_and_json_agree_with_python():
    body = json.loads(_ok("estimate", "llama-3.1-70b", "h200-sxm", "--tp", "4", "--isl", "4000", "--osl", "500",
                          "--json"))
    py = pc.estimate("llama-3.1-70b", "h200-sxm", tp=4, isl=4000, osl=500)
    assert body["estimate"]["tpot_s"] == pytest.approx(py.tpot_s, rel=1e-12)
    text = _ok("estimate", "llama-3.1-70b", "h200-sxm", "--tp", "4", "--isl", "4000", "--osl", "500")
    assert f"{py.tpot_s * 1e3:,.2f} ms" in text and "attention_proj" in text
    # with an engine profile's request path the TTFT line names the step (which the rows add up to) and the path
    served = pc.estimate("llama-3.1-8b", "h100-sxm", isl=600, engine="vllm-0.11")
    text = _ok("estimate", "llama-3.1-8b", "h100-sxm", "--isl", "600", "--engine", "vllm-0.11")
    assert served.ttft_s - served.prefill_s > 0.01
    assert (f"{served.ttft_s * 1e3:,.2f} ms  (prefill step {served.prefill_s * 1e3:,.2f} ms" in text
            and f"+ request path {(served.ttft_s - served.prefill_s) * 1e3:,.2f} ms)" in text)


def test_plan_prints_the_explanation_and_json():
    args = ["plan", "llama-3.1-70b", "--rate", "12", "--isl", "4000", "--osl", "500", "--ttft", "2s", "--tpot",
            "50ms", "--gpu", "h100-sxm", "--gpu", "h200-sxm"]
    assert "Best:" in _ok(*args)
    body = json.loads(_ok(*args, "--json"))
    assert body["plan"]["feasible"] and body["plan"]["slo"]["tpot_s"] == 0.05


def test_infeasible_plan_exits_1_with_the_reason():
    r = runner.invoke(app, ["plan", "llama-3.1-70b", "--rate", "1", "--ttft", "2s", "--tpot", "1ms",
                            "--gpu", "h100-sxm"])
    assert r.exit_code == 1 and "decode floor" in r.output and "Nearest feasible SLO" in r.output


def test_infeasible_plan_exits_1_with_json_too():
    r = runner.invoke(app, ["plan", "llama-3.1-70b", "--rate", "1", "--ttft", "2s", "--tpot", "1ms",
                            "--gpu", "h100-sxm", "--json"])
    assert r.exit_code == 1
    body = json.loads(r.stdout)  # the whole response is still printed, and nothing else
    assert body["plan"]["feasible"] is False and body["plan"]["nearest_feasible_slo"]["tpot_s"] > 0.001


def test_plan_takes_the_search_options_of_the_api():
    """--tps, --dps, --cps, --chunk-sizes, --kv-link and --spec reach the PlanRequest as REST's fields do."""
    args = ["plan", "deepseek-v3", "--rate", "20", "--isl", "2000", "--osl", "500", "--ttft", "2s", "--tpot", "25ms",
            "--gpu", "h200-sxm", "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--tps", "8", "--dps", "8,16",
            "--chunk-sizes", "512,2048", "--kv-link", "scaleup", "--spec", "mtp:1:0.85", "--json"]
    body = json.loads(_ok(*args))
    want = pc.plan("deepseek-v3", pc.Workload(rate=20, isl=2000, osl=500), pc.SLO(ttft_s=2.0, tpot_s=0.025),
                   gpus=["h200-sxm"], weight_dtype="fp8", kv_dtype="fp8", tps=[8], dps=[8, 16], chunk_sizes=[512, 2048],
                   kv_link="scaleup", spec=pc.Speculation(kind="mtp", tokens=1, acceptance=0.85))
    assert body["plan"]["best"]["num_gpus"] == want.best.num_gpus and body["plan"]["searched"] == want.searched
    assert body["plan"]["best"]["deployment"] == want.best.deployment.model_dump(mode="json")
    assert all(p.tp == 8 or p.dp in (8, 16) for c in want.candidates for p in c.deployment.pools)
    assert any(p.spec is not None for c in want.candidates for p in c.deployment.pools)
    # "none": no attention-DP at all
    none = json.loads(_ok("plan", "deepseek-v3", "--rate", "20", "--ttft", "2s", "--tpot", "50ms", "--gpu", "h200-sxm",
                          "--weight-dtype", "fp8", "--dps", "none", "--json"))
    without = pc.plan("deepseek-v3", pc.Workload(rate=20, isl=1024, osl=256), pc.SLO(ttft_s=2.0, tpot_s=0.05),
                      gpus=["h200-sxm"], weight_dtype="fp8", dps=[])
    assert none["plan"]["searched"] == without.searched
    assert all(p.dp == 1 for c in without.candidates for p in c.deployment.pools)


def test_plan_length_spread_is_a_mean_and_cv():
    body = json.loads(_ok("plan", "llama-3.1-8b", "--rate", "2", "--isl", "2000", "--isl-cv", "0.5", "--osl", "300",
                          "--ttft", "2s", "--tpot", "50ms", "--gpu", "h100-sxm", "--json"))
    isl, osl = body["plan"]["workload"]["isl"], body["plan"]["workload"]["osl"]
    assert (isl["mean"], isl["cv"]) == (2000, 0.5) and (osl["mean"], osl["cv"]) == (300, 0.0)
    assert _length(2000, 0.5) == {"mean": 2000, "cv": 0.5} and _length(300, 0.0) == 300


@pytest.mark.parametrize("args, message", [
    (["estimate", "llama-3.1-70b", "h100-sxn"], "unknown GPU id 'h100-sxn'; closest: h100-sxm"),
    (["estimate", "llama-3.1-70b", "h100"], "ambiguous GPU id 'h100': it names h100-pcie, h100-sxm"),
    (["estimate", "llama-3.1-8b", "h100-sxm", "--isl", "-5"], "isl: Input should be greater than or equal to 1"),
    (["kv", "llama-3.1-8b", "--kv-dtype", "fp3"], "kv_dtype: "),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2x", "--tpot", "50ms"], "ttft: cannot read '2x'"),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2s", "--tpot", "50ms", "--tps", "3,x"], "--tps: cannot read '3,x'"),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2s", "--tpot", "50ms", "--tps", "4,,8"], "--tps: cannot read '4,,8'"),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2s", "--tpot", "50ms", "--tps", "1e0"], "--tps: cannot read '1e0'"),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2s", "--tpot", "50ms", "--chunk-sizes", "none"],
     "--chunk-sizes: needs at least one value (only --dps and --cps take none)"),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2s", "--tpot", "50ms", "--tps", "3"], "tps.0: Input should be"),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2s", "--tpot", "50ms", "--spec", "mtp:1"], "spec: cannot read"),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2s", "--tpot", "50ms", "--spec", "mtp:x:0.8"], "spec.tokens: "),
    (["plan", "llama-3.1-8b", "--rate", "1", "--ttft", "2s", "--tpot", "50ms", "--kv-link", "nic"], "kv_link: "),
    (["estimate", "/nonexistent/config.json", "h100-sxm"], "model: /nonexistent/config.json: no such file"),
    (["estimate", "llama-3.1-8b"], "Missing argument 'gpu'. (see root estimate --help)"),
    (["kv", "llama-3.1-8b", "--tokens", "many"], "Invalid value for '--tokens': "),
    (["gpus", "--bogus"], "No such option: --bogus"),
    (["frobnicate"], "No such command 'frobnicate'."),
    (["serve", "--port", "70000"], "port: must be in 1 ... 65535, got 70000"),
])
def test_errors_are_one_line_and_exit_2(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    assert message in r.output
    assert r.stdout == "" and r.output.startswith("error: ")
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_validate_without_torch_says_how_to_install(monkeypatch):
    import calculator.microbench as mb

    def missing(**_kwargs):
        raise mb.TorchMissingError(f"torch and transformers are needed: {mb.INSTALL_HINT}")

    monkeypatch.setattr(mb, "run", missing)
    r = runner.invoke(app, ["validate", "--quick"])
    assert r.exit_code == 2 and "pip install 'pdplan[bench]'" in r.output and "Traceback" not in r.output


def test_validate_rejects_an_unknown_device():
    r = runner.invoke(app, ["validate", "--device", "tpu"])
    assert r.exit_code == 2 and "device: choose auto, cpu or cuda" in r.output
