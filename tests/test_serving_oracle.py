"""The closed form against the simulation on the 36-case acceptance grid (``bench/serving_oracle.py``).

p50 and p90 TTFT and TPOT must be within 10% of the simulation at utilisation <= 0.8 and within 20% at 0.9,
except the known gaps below (documented on the validation page), which must stay within a factor 2.5, so they
cannot quietly get worse.

The reference is the record, docs/validation/serving-oracle.json (with the table on
docs/serving-validation.md): three seeds of 12,000 requests a case, and of 50,000 where the queues have a long
memory (``long_memory``), whose requests are pooled. A shorter run is not a reference there: three seeds of
12,000 requests put the KV-bound long-prompt p90 TTFT at 0.8 of capacity 15-32% above the same seeds run to
50,000, and 8,000-request windows of four 40,000-request runs of the disaggregated decode instance alone give
a p90 slot wait from 0.13 to 0.57 s. Here:

- the record's closed-form figures are this version's (so it cannot go stale: a change to the serving model
  must regenerate it), and this version's simulation reproduces its seed 0 exactly for a long-memory and a
  short-memory case;
- the record meets the bounds but for ``RECORD_GAPS``;
- a fast live run (seed 0, 1,500 requests) of the 24 cases with a short memory meets them but for
  ``LIVE_GAPS``: a regression pin that needs no record.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from serving_oracle import (  # noqa: E402
    METRICS,
    Case,
    cases,
    closed_figures,
    figures,
    long_memory,
    run,
    simulated_trace,
)

RECORD = ROOT / "docs" / "validation" / "serving-oracle.json"

# none: the last, the chunked long-prompt p50 TTFT at 0.9 (+20.4%), was mended by ``slot_free_prompt_rate`` (+15%)
RECORD_GAPS: set[tuple[str, str, float, str]] = set()
"""Figures of the record outside the bounds, and why."""

LIVE_GAPS = {
    # the prefill pool's bulk steps (step_chain): +12% against this one seed of 1,500 requests, +7% against the
    # record's three seeds of 12,000
    ("disaggregated", "chat", 0.3, "ttft90"),
}
LIVE_REQUESTS = 1500


def _case(row: dict) -> Case:
    return Case(row["mode"], row["workload"], row["utilisation"])


def _key(case: Case, metric: str) -> tuple[str, str, float, str]:
    return case.mode, case.workload, case.utilisation, metric


def _error(closed: dict, simulated: dict, metric: str) -> float:
    return closed[metric] / simulated[metric] - 1


def _check(rows: list[tuple[Case, dict, dict]], gaps) -> None:
    """Every figure within its bound, but for the known ``gaps``: those beyond it (a mended one comes off the
    list) and within a factor 2.5."""
    outside, worse, mended = [], [], []
    for case, closed, simulated in rows:
        bound = 0.1 if case.utilisation <= 0.8 else 0.2
        for k in METRICS:
            err = _error(closed, simulated, k)
            if _key(case, k) in gaps:
                if abs(math.log1p(err)) > math.log(2.5):
                    worse.append((_key(case, k), f"{err:+.0%}"))
                if abs(err) <= bound:
                    mended.append((_key(case, k), f"{err:+.0%}"))
            elif abs(err) > bound:
                outside.append((_key(case, k), f"{err:+.0%}"))
    assert not outside, outside
    assert not worse, worse
    assert not mended, mended


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8"))


def test_the_grid_has_36_cases_on_three_models_with_an_moe_and_a_sliding_window_model(record):
    import calculator as pc

    assert [_case(r) for r in record["rows"]] == cases()
    assert len(record["rows"]) == 36 and record["seeds"] == [0, 1, 2]
    assert {r["requests"] for r in record["rows"]} == {12_000, 50_000}
    assert all(r["requests"] == (50_000 if long_memory(_case(r)) else 12_000) for r in record["rows"])
    models = {pc.load_model(c.model) for c in cases()}
    assert len(models) == 3
    assert any(m.moe is not None for m in models) and any(m.num_sliding_layers for m in models)


def test_the_record_holds_this_versions_closed_form(record):
    """Every closed-form figure and rate of the record, recomputed (no simulation): a change to the serving
    model that moves them must regenerate the record (``bench/serving_oracle.py``, the module docstring)."""
    stale = []
    for row in record["rows"]:
        rate, closed = closed_figures(_case(row))
        if not math.isclose(rate, row["rate"], rel_tol=1e-6):
            stale.append((_key(_case(row), "rate"), rate, row["rate"]))
        stale += [(_key(_case(row), k), closed[k], row["closed"][k]) for k in METRICS
                  if not math.isclose(closed[k], row["closed"][k], rel_tol=1e-6)]
    assert not stale, stale


@pytest.mark.parametrize("case", [Case("disaggregated", "long prompt", 0.8), Case("chunked", "chat", 0.6)],
                         ids=lambda c: f"{c.mode}-{c.workload}-{c.utilisation}")
def test_this_versions_simulation_reproduces_the_record(record, case):
    """Seed 0 of a long-memory case (50,000 requests) and of a short-memory one (12,000), run again: the same
    figures as the record's seed 0 (the simulation is seeded; 1e-6 leaves room for another libm's last bits)."""
    row = next(r for r in record["rows"] if _case(r) == case)
    assert row["simulated_by_seed"], "the record is written with --seeds 3 (each seed's figures)"
    again = figures(simulated_trace(case, row["rate"], row["requests"], 0))
    for k in METRICS:
        assert again[k] == pytest.approx(row["simulated_by_seed"][0][k], rel=1e-6), k


def test_the_record_meets_the_acceptance_bounds_but_for_its_known_gaps(record):
    _check([(_case(r), r["closed"], r["simulated"]) for r in record["rows"]], RECORD_GAPS)


def test_most_of_the_record_is_within_ten_percent(record):
    errors = np.sort([abs(_error(r["closed"], r["simulated"], k)) for r in record["rows"] for k in METRICS])
    assert np.median(errors) < 0.05
    assert np.mean(errors <= 0.1) >= 0.8


def test_each_kv_bound_p90_ttft_is_the_simulated_p90_within_two_percentiles(record):
    """Where KV memory binds (long prompts at 0.8 and 0.9 of capacity) the p90 TTFT falls on the flat edge of the
    requests that wait for a slot, where a few percent of the requests move it by 10-20%: a bound on its value
    is loose there, so each one's rank is held too, between the simulated p88 and p92 (0.899-0.916 in the
    record)."""
    ranks = {_key(_case(r), "ttft90"): r["ttft90_rank"] for r in record["rows"]
             if r["workload"] == "long prompt" and r["utilisation"] >= 0.8}
    assert len(ranks) == 6
    assert all(0.88 <= v <= 0.92 for v in ranks.values()), ranks


@pytest.fixture(scope="module")
def live():
    return [run(c, LIVE_REQUESTS) for c in cases() if not long_memory(c)]


def test_a_short_live_run_meets_the_bounds_but_for_its_known_gaps(live):
    assert len(live) == 24
    _check([(r.case, r.closed, r.simulated) for r in live], LIVE_GAPS)
