"""Fleet planning (``pc.plan_many``, ``pdplan batch``): scenario files, one row per scenario, errors
kept per scenario, the process pool and Ray giving the same rows, and a killed run resumed."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import calculator as pc
from calculator.errors import InputError
from calculator.fleet import COLUMNS, plan_many, read_scenarios

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from batch_speed import LocalRay, scenarios

SLO = {"ttft_s": 1.0, "tpot_s": 0.05}
PDPLAN = [sys.executable, "-c", "import sys; from calculator.cli import main; sys.exit(main())"]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def test_yaml_defaults_and_csv_columns(tmp_path: Path) -> None:
    y = tmp_path / "s.yaml"
    y.write_text("defaults:\n  slo: {ttft_s: 1.0, tpot_s: 0.05}\n  gpus: [l4]\n"
                 "scenarios:\n  - {id: a, model: llama-3.1-8b, workload: {rate: 5, isl: 1000, osl: 200}}\n"
                 "  - {model: qwen2.5-7b, workload: {rate: 2, isl: 500, osl: 100}, slo: {tpot_s: 0.1}}\n")
    (a, ra), (b, rb) = read_scenarios(y)
    assert (a, b) == ("a", "2")  # a missing id is the scenario's position
    assert ra["slo"] == SLO and ra["gpus"] == ["l4"]
    assert rb["slo"] == {"ttft_s": 1.0, "tpot_s": 0.1}  # merged over the defaults, key by key
    c = tmp_path / "s.csv"
    c.write_text("id,model,workload.rate,workload.isl,workload.osl,workload.isl_cv,slo.ttft_s,slo.tpot_s,gpus,tps\n"
                 "x,llama-3.1-8b,5,1000,200,,1,0.05,l4;h100-sxm,1;2\n")
    [(_, rx)] = read_scenarios(c)
    ids = tmp_path / "ids.csv"
    ids.write_text("id,model\n007,m\n7,m\n")
    assert [sid for sid, _ in read_scenarios(ids)] == ["007", "7"]  # ids stay text, so these two differ
    assert rx == {"model": "llama-3.1-8b", "workload": {"rate": 5, "isl": 1000, "osl": 200},
                  "slo": {"ttft_s": 1, "tpot_s": 0.05}, "gpus": ["l4", "h100-sxm"], "tps": [1, 2]}


@pytest.mark.parametrize(("text", "suffix", "match"), [
    ("- {id: a, model: m}\n- {id: a, model: m}\n", ".yaml", r"id: .*scenario 2: id 'a' is also .*scenario 1"),
    ("[]\n", ".yaml", "no scenarios"),
    ("{scenarios: [], other: 1}\n", ".yaml", "takes 'defaults' and 'scenarios', not other"),
    ("- 3\n", ".yaml", "scenario 1 is not a mapping"),
    ("id,model\na,m,extra\n", ".csv", "line 2: more cells than the header"),
    ("id,workload,workload.rate\na,x,3\n", ".csv", "conflicts"),
])
def test_bad_scenario_files_name_the_place(tmp_path: Path, text: str, suffix: str, match: str) -> None:
    p = tmp_path / f"s{suffix}"
    p.write_text(text)
    with pytest.raises(InputError, match=match):
        read_scenarios(p)


def test_rows_match_plan_and_keep_errors_per_scenario() -> None:
    items = [("ok", {"model": "llama-3.1-8b", "workload": {"rate": 20, "isl": 2000, "osl": 200}, "slo": SLO,
                     "gpus": ["h100-sxm"]}),
             ("neg", {"model": "llama-3.1-8b", "workload": {"rate": -1, "isl": 2000, "osl": 200}, "slo": SLO}),
             ("gpu", {"model": "llama-3.1-8b", "workload": {"rate": 1, "isl": 200, "osl": 20}, "slo": SLO,
                      "gpus": ["h100-nope"]}),
             ("tight", {"model": "llama-3.1-8b", "workload": {"rate": 1, "isl": 200, "osl": 20},
                        "slo": {"ttft_s": 1.0, "tpot_s": 0.0005}, "gpus": ["l4"]})]
    ok, neg, gpu, tight = plan_many(items, workers=1)
    best = pc.plan("llama-3.1-8b", workload=pc.Workload(rate=20, isl=2000, osl=200), slo=pc.SLO(**SLO),
                   gpus=["h100-sxm"]).best
    assert ok.status == "feasible" and (ok.num_gpus, ok.mode, ok.ttft_p_s) == (best.num_gpus, best.mode, best.ttft_p_s)
    assert ok.layout.startswith(f"{best.mode} {best.deployment.pools[0].instances}x h100-sxm")
    assert neg.status == "error" and neg.message.startswith("workload.rate: ")
    assert gpu.status == "error" and gpu.message.startswith("gpus") and "h100-nope" in gpu.message
    assert tight.status == "infeasible" and "decode floor" in tight.message and tight.num_gpus is None


def test_process_pool_gives_the_rows_of_one_process() -> None:
    items = scenarios(24, seed=3)
    assert plan_many(items, workers=2, chunk=2) == plan_many(items, workers=1)


def test_output_is_written_in_scenario_order_and_parquet_matches_csv(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    items = scenarios(12, seed=5)
    rows = plan_many(items, workers=2, chunk=1, out=tmp_path / "r.csv")
    assert [r["id"] for r in _rows(tmp_path / "r.csv")] == [sid for sid, _ in items] == [r.id for r in rows]
    plan_many(items, workers=1, out=tmp_path / "r.parquet")
    table = pq.read_table(tmp_path / "r.parquet").to_pylist()
    assert table == [r.model_dump() for r in rows]
    assert not (tmp_path / "r.parquet.partial.csv").exists()


def test_resume_keeps_unchanged_rows_and_replans_changed_and_missing(tmp_path: Path) -> None:
    items = scenarios(10, seed=7)
    out = tmp_path / "r.csv"
    plan_many(items, workers=1, out=out)
    full = out.read_text()
    # a killed run: the header, four rows and half of the fifth
    lines = full.splitlines(keepends=True)
    out.write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])
    changed = [(sid, raw) if sid != items[1][0] else (sid, {**raw, "slo": {"ttft_s": 3.0, "tpot_s": 0.1}})
               for sid, raw in items]
    seen = []
    plan_many(changed, workers=1, out=out, progress=lambda done, total: seen.append(done))
    assert seen[0] == 3  # rows 1, 3 and 4 kept; row 2's request changed and row 5 was half written
    fresh = tmp_path / "fresh.csv"
    plan_many(changed, workers=1, out=fresh)
    assert out.read_text() == fresh.read_text()
    assert out.read_text() != full
    with pytest.raises(InputError, match="ids not among the scenarios"):
        plan_many(items[:3], workers=1, out=out)
    assert len(plan_many(items[:3], workers=1, out=out, resume=False)) == 3


def test_a_killed_batch_continues_where_it_stopped(tmp_path: Path) -> None:
    """SIGKILL ``pdplan batch`` mid-run, run it again: the rows equal an uninterrupted run's, none lost,
    none twice."""
    import yaml

    items = scenarios(40, seed=11)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump([{"id": sid, **raw} for sid, raw in items]))
    out = tmp_path / "r.csv"
    cmd = [*PDPLAN, "batch", str(spec), "--out", str(out), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") > 10:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = _rows(out)
    assert 5 < len(partial) < len(items), "the run was not stopped mid-way"
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    resumed = _rows(out)
    assert [r["id"] for r in resumed] == [sid for sid, _ in items]
    fresh = tmp_path / "fresh.csv"
    plan_many(items, workers=1, out=fresh)
    assert out.read_text() == fresh.read_text()
    assert tuple(_rows(fresh)[0]) == COLUMNS


def test_cli_batch(tmp_path: Path) -> None:
    spec = tmp_path / "s.csv"
    spec.write_text("id,model,workload.rate,workload.isl,workload.osl,slo.ttft_s,slo.tpot_s,gpus\n"
                    "a,llama-3.1-8b,5,1000,200,1,0.05,l4\nb,llama-3.1-8b,x,1000,200,1,0.05,l4\n")
    r = subprocess.run([*PDPLAN, "batch", str(spec), "--out", str(tmp_path / "r.csv")],
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "errors      1" in r.stdout.replace("│", " ") or "errors" in r.stdout
    a, b = _rows(tmp_path / "r.csv")
    assert a["status"] == "feasible" and b["status"] == "error" and b["message"].startswith("workload.rate")
    bad = subprocess.run([*PDPLAN, "batch", str(spec), "--out", str(tmp_path / "r.txt")],
                         check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 4 and "write .csv or .parquet" in bad.stderr


def test_an_unreachable_ray_address_fails_at_once_and_writes_nothing(tmp_path: Path) -> None:
    import socket

    pytest.importorskip("ray")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(InputError, match=r"ray: cannot reach a Ray cluster at 127\.0\.0\.1"):
        plan_many(scenarios(3), ray_address=f"127.0.0.1:{port}", out=tmp_path / "r.csv")
    assert time.monotonic() - t < 10 and not (tmp_path / "r.csv").exists()


def test_ray_cluster_gives_the_process_pools_rows() -> None:
    """A Ray head on 127.0.0.1 (``ray start``), a few hundred plans through it: the same rows as the
    process pool, bit for bit. CI sets PDPLAN_REQUIRE_RAY=1 so a missing Ray fails there."""
    if os.environ.get("PDPLAN_REQUIRE_RAY") != "1":
        pytest.importorskip("ray")
    items = scenarios(200, seed=1)
    pool = plan_many(items, workers=2)
    with LocalRay(cpus=2) as ray:
        on_ray = plan_many(items, ray_address=ray.address)
    assert on_ray == pool
    assert {r.status for r in pool} == {"feasible", "infeasible", "error"}


def test_yaml_aliases_are_refused_in_every_user_file(tmp_path: Path) -> None:
    """Seven lines of nested aliases name ten million list items: scenario files, calibration files and
    schedule profiles refuse aliases with the line, instead of expanding them."""
    from calculator.calibration import load_calibration

    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdef", "bcdefg", strict=True))
    for name, load in (("s.yaml", read_scenarios), ("cal.yaml", load_calibration)):
        p = tmp_path / name
        p.write_text(bomb)
        with pytest.raises(InputError, match=r"line 2, column \d+: YAML aliases \(\*name\) are not read"):
            load(p)
    profile = tmp_path / "day.yaml"
    profile.write_text("- &w {label: a, duration_s: 3600, workload: {rate: 1, isl: 100, osl: 10}}\n- *w\n")
    r = subprocess.run([*PDPLAN, "schedule", str(profile), "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                        "--ttft", "1s", "--tpot", "50ms"], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "line 2, column 3: YAML aliases" in r.stderr, r.stderr
