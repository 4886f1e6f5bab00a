"""What the command line prints: tables that fit 80 and 120 columns without cutting an id, the plan's
ranked and labelled candidates, sweep and evaluate as the REST endpoints answer them, CSV and plots,
exit statuses, and validate's progress bar."""

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

import calculator as pc
from calculator import cli
from calculator import service as s
from calculator.cli import app, pool_label, ranked

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
PLAN = ["plan", "llama-3.1-70b", "--rate", "12", "--isl", "4000", "--osl", "500", "--ttft", "2s", "--tpot", "50ms",
        "--gpu", "h100-sxm", "--gpu", "h200-sxm"]
PLAN_REQUEST = {"model": "llama-3.1-70b", "workload": {"rate": 12, "isl": 4000, "osl": 500},
                "slo": {"ttft_s": 2, "tpot_s": 0.05}, "gpus": ["h100-sxm", "h200-sxm"]}
EVALUATE = ["evaluate", "llama-3.1-70b", "--rate", "4", "--isl", "4000", "--osl", "500", "--ttft", "2s", "--tpot",
            "50ms", "--prefill", "h100-sxm:tp2:x3", "--decode", "h20:tp4:x2", "--weight-dtype", "fp8"]
EVALUATE_BODY = {"model": "llama-3.1-70b", "workload": {"rate": 4, "isl": 4000, "osl": 500},
                 "slo": {"ttft_s": 2, "tpot_s": 0.05},
                 "deployment": {"mode": "disaggregated",
                                "prefill": {"gpu": "h100-sxm", "tp": 2, "instances": 3, "weight_dtype": "fp8"},
                                "decode": {"gpu": "h20", "tp": 4, "instances": 2, "weight_dtype": "fp8"}}}
INFEASIBLE = ["plan", "llama-3.1-70b", "--rate", "1", "--ttft", "2s", "--tpot", "1ms", "--gpu", "h100-sxm"]


def _run(*args: str, columns: int | None = None, code: int = 0) -> str:
    r = runner.invoke(app, list(args), env={"COLUMNS": None if columns is None else str(columns)})
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    return r.stdout


@pytest.fixture(scope="module")
def plan_response():
    return s.run_plan(s.PlanRequest.model_validate(PLAN_REQUEST))


def _fits(text: str, columns: int) -> list[str]:
    lines = text.splitlines()
    assert all(cell_len(line.rstrip()) <= columns for line in lines), max(lines, key=cell_len)
    return lines


# ------------------------------------------------------------------------------------------ widths

@pytest.mark.parametrize("columns", [80, 120])
def test_database_tables_fit_and_every_id_is_whole(columns):
    for command, ids in (("models", pc.list_models()), ("gpus", pc.list_gpus())):
        lines = _fits(_run(command, columns=columns), columns)
        for i in ids:  # the id column comes first: each row starts with its whole id
            assert any(line.startswith(i + " ") for line in lines), (command, i)


@pytest.mark.parametrize("columns", [80, 120])
def test_estimate_operator_rows_keep_whole_group_names(columns):
    lines = _fits(_run("estimate", "llama-3.1-70b", "h200-sxm", "--tp", "4", "--isl", "4000", "--osl", "500",
                       columns=columns), columns)
    e = pc.estimate("llama-3.1-70b", "h200-sxm", tp=4, isl=4000, osl=500)
    for row in e.rows:  # 'attention_proj' and 'attention' used to both read 'attent…'
        assert any(re.match(rf"^{row.phase}\s+{row.group}\s", line) for line in lines), (row.phase, row.group)


@pytest.mark.parametrize("columns", [80, 120])
def test_every_shown_candidate_is_one_line_with_its_whole_label(columns, plan_response):
    lines = _fits(_run(*PLAN, columns=columns), columns)
    for c in ranked(plan_response.plan)[:cli.SHOWN]:
        assert any(re.match(rf"^{re.escape(pool_label(c.deployment))}\s+{c.num_gpus}\s", line) for line in lines)


def _header(text: str) -> str:
    """The candidate table's header (it may wrap onto two lines above the rule)."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("───"))
    return " ".join(lines[rule - 2:rule])


def test_narrow_consoles_drop_the_least_important_columns_first():
    narrow, wide = _header(_run(*PLAN, columns=80)), _header(_run(*PLAN, columns=120))
    for header in ("deployment", "GPUs", "TTFT", "TPOT", "$/h"):
        assert header in narrow
    for header in ("tok/s/user", "tok/s/GPU", "$/1M tok", "util"):
        assert header in wide
    assert "tok/s/user" not in narrow and "binds" not in narrow and "binds" in _header(_run(*PLAN, columns=200))


def test_columns_80_into_a_pipe_keeps_each_candidate_on_one_line(plan_response):
    """The issue's acceptance: COLUMNS=80 pdplan plan … | cat (stdout is a pipe, not a terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDPLAN_")} | {"COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-c", "import sys; from calculator.cli import main; sys.exit(main())", *PLAN],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    lines = _fits(r.stdout, 80)
    rows = [line for line in lines if re.match(r"^(P: |h\d)", line)]
    labels = [pool_label(c.deployment) for c in ranked(plan_response.plan)[:cli.SHOWN]]
    assert [next(lab for lab in labels if row.startswith(lab + " ")) for row in rows] == labels


def test_a_pipe_without_columns_gets_wide_tables():
    assert max(map(cell_len, _run(*PLAN).splitlines())) > 120


# ------------------------------------------------------------------------------------------ plan

def test_plan_ranks_by_its_objective_and_says_how_many_are_shown(plan_response):
    text = _run(*PLAN, columns=160)
    n = len(plan_response.plan.candidates)
    assert f"12 of {n} candidates shown (--all shows every one;" in text
    assert "ranked by fewest GPUs, then lowest $/h" in text
    counts = [int(m.group(1)) for m in re.finditer(r"^(?:P: .+?|h\S+ tp\d.*?)\s{2,}(\d+)\s", text, re.MULTILINE)]
    assert counts == sorted(counts) and len(counts) == 12
    assert f"{n} of {n} candidates shown (" in _run(*PLAN, "--all", columns=160)
    cost = _run(*PLAN, "--objective", "cost", columns=160)
    assert "ranked by lowest $/h, then fewest GPUs" in cost


def test_plan_labels_pools_and_puts_units_on_every_target(plan_response):
    text = _run(*PLAN, columns=200)
    assert "SLO: TTFT p90 ≤ 2 s, TPOT p90 ≤ 50 ms" in text
    best = plan_response.plan.best
    assert f"Best: {best.mode} {pool_label(best.deployment)} — {best.num_gpus} GPUs" in text
    assert re.search(r"TTFT p90 \d+\.\d{3} s \(SLO 2 s\), TPOT p90 \d+\.\d\d ms \(SLO 50 ms\)", text)
    disaggregated = next(c for c in plan_response.plan.candidates if c.mode == "disaggregated")
    pre, dec = disaggregated.deployment.prefill, disaggregated.deployment.decode
    assert pool_label(disaggregated.deployment) == (f"P: {pre.gpu} tp{pre.tp} ×{pre.instances} | "
                                                    f"D: {dec.gpu} tp{dec.tp} ×{dec.instances}")


def test_a_requested_gpu_that_does_not_fit_is_explained():
    text = _run("plan", "llama-3.1-405b", "--rate", "2", "--isl", "2000", "--osl", "200", "--ttft", "3s", "--tpot",
                "100ms", "--gpu", "h200-sxm", "--gpu", "l4", columns=200)
    assert "l4: no candidate; llama-3.1-405b does not fit on any of l4 at tp up to 8" in text


def test_a_requested_gpu_that_misses_the_slo_is_explained():
    w, slo = pc.Workload(rate=4, isl=2000, osl=200), pc.SLO(ttft_s=2, tpot_s=0.012)
    alone = pc.plan("llama-3.1-70b", workload=w, slo=slo, gpus=["a100-sxm-80gb"], modes="mixed")
    both = pc.plan("llama-3.1-70b", workload=w, slo=slo, gpus=["h20", "a100-sxm-80gb"], modes="mixed")
    if alone.feasible or not both.feasible:
        pytest.skip("the case needs an A100 that misses this SLO next to an H20 that meets it")
    text = _run("plan", "llama-3.1-70b", "--rate", "4", "--isl", "2000", "--osl", "200", "--ttft", "2s", "--tpot",
                "12ms", "--mode", "mixed", "--gpu", "h20", "--gpu", "a100-sxm-80gb", columns=400)
    assert f"a100-sxm-80gb: no candidate; {alone.reason}" in text and "below the batch-1 decode floor" in alone.reason


@pytest.mark.parametrize("extra", [[], ["--json"], ["--csv", "-"]])
def test_an_infeasible_plan_exits_1_whatever_the_output(extra):
    out = _run(*INFEASIBLE, *extra, code=1)
    if extra == ["--json"]:
        assert json.loads(out)["plan"]["feasible"] is False
    elif extra:
        assert out.splitlines()[0].startswith("rank,mode,deployment,num_gpus") and len(out.splitlines()) == 1
    else:
        assert "decode floor" in out and "Nearest feasible SLO: TTFT 2 s, TPOT" in out


def test_plan_csv_rows_are_the_ranked_candidates(plan_response, tmp_path):
    rows = list(csv.DictReader(io.StringIO(_run(*PLAN, "--csv", "-"))))
    order = ranked(plan_response.plan)
    assert [r["deployment"] for r in rows] == [pool_label(c.deployment) for c in order]
    assert float(rows[0]["tpot_p_s"]) == pytest.approx(order[0].tpot_p_s, rel=1e-12)
    path = tmp_path / "plan.csv"
    text = _run(*PLAN, "--csv", str(path), columns=120)
    assert "candidates shown" in text and f"wrote {path}" in text
    assert path.read_text() == _run(*PLAN, "--csv", "-")


# ------------------------------------------------------------------------------------------ sweep, evaluate

def test_sweep_estimate_is_the_rest_sweep():
    body = json.loads(_run("sweep", "--vary", "batch", "--values", "1,8,64", "estimate", "llama-3.1-8b", "h100-sxm",
                           "--isl", "2000", "--osl", "200", "--json"))
    want = s.run_sweep(s.SweepRequest.model_validate({"target": "estimate", "vary": "batch", "values": [1, 8, 64],
        "estimate": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "isl": 2000, "osl": 200}}))
    assert body == want.model_dump(mode="json")
    text = _run("sweep", "--vary", "batch", "--values", "1,8,64", "estimate", "llama-3.1-8b", "h100-sxm", columns=80)
    _fits(text, 80)
    assert re.search(r"^64\s", text, re.MULTILINE)


def test_sweep_plan_needs_no_value_for_the_varied_input():
    text = _run("sweep", "--vary", "rate", "--values", "1,2", "plan", "llama-3.1-8b", "--ttft", "2s", "--tpot", "50ms",
                "--gpu", "h100-sxm", "--mode", "mixed", columns=120)
    assert "plan over rate" in text and "TTFT p90" in text and re.search(r"^2\s+\d", text, re.MULTILINE)


@pytest.mark.parametrize("args, message", [
    (["sweep", "--vary", "batch", "--values", "1", "kv", "llama-3.1-8b"], "target: sweep varies estimate or plan"),
    (["sweep", "--vary", "rate", "--values", "1", "estimate", "llama-3.1-8b", "h100-sxm"],
     "vary: 'rate' cannot be swept for target estimate"),
    (["sweep", "--vary", "batch", "--values", "1,x", "estimate", "llama-3.1-8b", "h100-sxm"],
     "values: cannot read '1,x' as numbers"),
    (["sweep", "--vary", "batch", "--values", "1", "estimate", "llama-3.1-8b", "h100-sxm", "--bogus"],
     "No such option: --bogus"),
    (["evaluate", "llama-3.1-8b", "--rate", "1", "--pool", "h100-sxm:tq2"], "pool: cannot read 'h100-sxm:tq2'"),
    (["evaluate", "deepseek-v3", "--rate", "1", "--pool", "h200-sxm:dp8:balance"],
     "pool: cannot read 'h200-sxm:dp8:balance' as GPU[:tpN][:ppN][:dpN][:epN][:cpN][:xN][:balanced]"),
    (["evaluate", "llama-3.1-8b", "--rate", "1", "--prefill", "h100-sxm"], "decode: a disaggregated deployment needs"),
    (["evaluate", "llama-3.1-8b", "--rate", "1"], "pool: give --pool"),
    (["evaluate", "llama-3.1-8b", "--rate", "1", "--pool", "h100-sxm", "--ttft", "2s"], "tpot: an SLO needs both"),
    (["evaluate", "llama-3.1-8b", "--rate", "1", "--pool", "h100-sxm:tp3"], "deployment.pool.tp: "),
    ([*INFEASIBLE, "--json", "--csv", "-"], "csv: --csv - and --json both print to stdout"),
    ([*INFEASIBLE, "--plot", "plan.jpg"], "plot: plan.jpg: cannot tell the format from '.jpg'"),
])
def test_input_errors_are_one_line_exit_2(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.output and r.stdout == "" and len(r.output.strip().splitlines()) == 1


def test_evaluate_is_the_rest_evaluate():
    from fastapi.testclient import TestClient

    from api import app as rest

    body = json.loads(_run(*EVALUATE, "--json"))
    assert body == TestClient(rest).post("/v1/evaluate", json=EVALUATE_BODY).json()
    text = _run(*EVALUATE, columns=80)
    _fits(text, 80)
    assert "disaggregated P: h100-sxm tp2 ×3 | D: h20 tp4 ×2 (14 GPUs) at 4 req/s" in text
    assert "TTFT (SLO 2 s)" in text and "TPOT (SLO 50 ms)" in text and re.search(r"^p90\s+\d\.\d{3} s\s", text, re.MULTILINE)
    rows = list(csv.DictReader(io.StringIO(_run(*EVALUATE, "--csv", "-"))))
    assert [int(r["percentile"]) for r in rows] == [50, 90, 95, 99]
    assert float(rows[1]["ttft_s"]) == pytest.approx(body["ttft_by_percentile_s"]["90"], rel=1e-12)


def test_evaluate_takes_the_itl_target_joint_attainment_and_the_scheduler():
    """``--itl``, ``--attainment joint`` and ``--scheduler``: the same figures as the library's evaluate with that SLO
    and deployment, the ITL row against its target, and the joint share printed."""
    args = ["evaluate", "llama-3.1-8b", "--rate", "1.5", "--isl", "8000", "--osl", "300", "--pool", "h100-sxm",
            "--ttft", "2s", "--tpot", "50ms", "--itl", "200ms", "--attainment", "joint"]
    slo = pc.SLO(ttft_s=2, tpot_s=0.05, itl_s=0.2, attainment="joint")
    w = pc.Workload(rate=1.5, isl=8000, osl=300)
    for scheduler in ("hybrid", "prefill_first"):
        body = json.loads(_run(*args, "--scheduler", scheduler, "--json"))
        e = pc.evaluate("llama-3.1-8b", {"mode": "mixed", "pool": {"gpu": "h100-sxm"}, "scheduler": scheduler}, w, slo)
        assert body["attainment"] == pytest.approx(e.attainment(), rel=1e-9)
        assert body["itl_by_percentile_s"]["99"] == pytest.approx(e.itl_s(99), rel=1e-9)
        text = _run(*args, "--scheduler", scheduler, columns=120)
        assert "ITL (SLO 200 ms)" in text
        assert re.search(rf"requests meeting TTFT and TPOT\s+{re.escape(f'{e.attainment():.1%}')}", text)
    # a prompt-only step stalls every decode for the whole prompt: a longer worst gap than the hybrid step's
    hybrid = json.loads(_run(*args, "--scheduler", "hybrid", "--json"))
    first = json.loads(_run(*args, "--scheduler", "prefill_first", "--json"))
    assert first["itl_by_percentile_s"]["99"] > hybrid["itl_by_percentile_s"]["99"] > 0
    _run(*args[:-2], "--attainment", "both", code=2)


def test_a_pool_takes_balanced_attention_dp_ranks():
    """``--pool h200-sxm:dp8:ep8:balanced``: the library's evaluate with ``dp_balance`` (the ranks' prompts taken
    together), whose decodes wait less than those of ranks on their own."""
    args = ["evaluate", "deepseek-v3", "--rate", "4", "--isl", "2000", "--osl", "200", "--weight-dtype", "fp8",
            "--kv-dtype", "fp8", "--json", "--pool"]
    w = pc.Workload(rate=4, isl=2000, osl=200)
    out = {}
    for text, balanced in (("h200-sxm:dp8:ep8:balanced", True), ("h200-sxm:dp8:ep8", False)):
        body = json.loads(_run(*args, text))
        e = pc.evaluate("deepseek-v3", {"mode": "mixed", "pool": {"gpu": "h200-sxm", "dp": 8, "ep": 8, "dp_balance": balanced,
                                                                  "weight_dtype": "fp8", "kv_dtype": "fp8"}}, w)
        assert body["tpot_by_percentile_s"]["50"] == pytest.approx(e.tpot_s(50), rel=1e-9)
        out[balanced] = e.tpot_s(50)
    assert out[False] > 1.3 * out[True]


def test_an_overloaded_deployment_exits_1():
    text = _run("evaluate", "llama-3.1-70b", "--rate", "40", "--isl", "4000", "--osl", "500", "--pool",
                "h200-sxm:tp4", columns=120, code=1)
    assert "Unstable at this rate" in text
    assert json.loads(_run("evaluate", "llama-3.1-70b", "--rate", "40", "--isl", "4000", "--osl", "500", "--pool",
                           "h200-sxm:tp4", "--json", code=1))["stable"] is False


# ------------------------------------------------------------------------------------------ files

@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<svg")])
def test_plots_are_written(tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    for args, name in ((PLAN, "plan"), (EVALUATE, "evaluate"),
                       (["sweep", "--vary", "batch", "--values", "1,8", "estimate", "llama-3.1-8b", "h100-sxm"], "sweep")):
        path = tmp_path / f"{name}{suffix}"
        assert f"wrote {path}" in _run(*args, "--plot", str(path), columns=120)
        assert magic in path.read_bytes()[:400], name


def test_plot_checks_come_before_the_computation(monkeypatch):
    def never(_req):
        raise AssertionError("computed before the --plot check")

    monkeypatch.setattr(s, "run_plan", never)
    assert "cannot tell the format" in runner.invoke(app, [*PLAN, "--plot", "x.pdf"]).output
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    r = runner.invoke(app, [*PLAN, "--plot", "x.png"])
    assert r.exit_code == 2 and "plot: drawing needs matplotlib: pip install matplotlib" in r.output


def test_an_unwritable_csv_exits_4(tmp_path):
    r = runner.invoke(app, [*INFEASIBLE, "--csv", str(tmp_path / "no" / "such" / "p.csv")])
    assert r.exit_code == cli.EXIT_OUTPUT
    assert r.stderr.startswith("error: csv: cannot write ") and len(r.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------------------ validate

def test_validate_gives_run_a_progress_callback(monkeypatch):
    import calculator.microbench as mb

    seen = []

    def fake(quick, device, out_dir, seed, progress, **options):
        progress(0, 10, "device ceilings")
        progress(4, 10, "sweep 1/2 of bench-llama-s")
        seen.append(progress)
        assert options == {"models": None, "cuda_graphs": True, "reference_gpu": None}  # the defaults, passed on
        raise mb.TorchMissingError("no torch here")

    monkeypatch.setattr(mb, "run", fake)
    r = runner.invoke(app, ["validate", "--quick"])
    assert r.exit_code == 2 and r.output == "error: no torch here\n" and seen  # no bar drawn into a pipe


def test_the_progress_bar_shows_the_step_and_the_time_left():
    buf = io.StringIO()
    with cli._ProgressBar(Console(file=buf, force_terminal=True, width=100)) as bar:
        bar(0, 10, "device ceilings")
        time.sleep(0.05)
        bar(4, 10, "sweep 1/2 of bench-llama-s")
        bar.progress.refresh()
        task = bar.progress.tasks[0]
        assert (task.completed, task.total, task.description) == (4, 10, "sweep 1/2 of bench-llama-s")
    assert "sweep 1/2 of bench-llama-s" in buf.getvalue() and "40%" in buf.getvalue()
