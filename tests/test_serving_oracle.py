"""The closed form against the simulation on the 36-case acceptance grid (``bench/serving_oracle.py``).

p50 and p90 TTFT and TPOT must be within 10% of the simulation at utilisation <= 0.8 and within
20% at 0.9, except the known gaps listed below (documented in the README and the validation page),
which must stay within a factor 2.5, so they cannot quietly get worse. The simulation is seeded, so
the figures are repeatable. This run (seed 0; 1,500 requests a case, 12,000 where KV memory binds
near capacity) is a regression pin, not the record: the record, three seeds of 12,000 requests, is
``bench/serving_oracle.py --requests 12000 --seeds 3``, kept in docs/serving-validation.md.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from serving_oracle import METRICS, cases, run  # noqa: E402

KNOWN_GAPS = {
    # the prefill pool's bulk steps (step_chain): the record (three seeds of 12,000 requests) is -2% at 0.8
    # (median), +6% at 0.3 (p90); this one seed of 1,500 requests is a short run of a queue with a long
    # memory: +10% at 0.3 (p90), +14% at 0.8 (median). At 0.9 it runs 12,000 requests: -6% (median)
    ("disaggregated", "chat", 0.3, "ttft90"), ("disaggregated", "chat", 0.8, "ttft50"),
    # KV memory binds (13 sequences of 6,000 tokens). The TTFT quantile is that of the whole wait (a prompt
    # waits for its step or for a slot; on a decode instance the slot wait follows the prefill:
    # base.with_slot_wait). The probability of a slot wait follows the simulation now that the stalls batch the
    # arrivals the slots see (base._batched_slot_wait_probability: the share waiting more than 0.2 s at 0.8,
    # 0.191 / 0.238 against 0.188 / 0.243 simulated, mixed / chunked); the wait given a wait, Cosmetatos' M/D/c
    # mean at the full batch's rate, is 6-14% short at 0.8 (0.77 / 0.87 s against 0.89 / 0.92 s), so the p90
    # is -14% (mixed), -12% (chunked) and -16% (disaggregated, whose slot probability was right already) at 0.8
    ("mixed", "long prompt", 0.8, "ttft90"), ("chunked", "long prompt", 0.8, "ttft90"),
    ("disaggregated", "long prompt", 0.8, "ttft90"),
    # where half the requests wait for a slot the median sits at the edge of that mass: mixed at 0.9, 52% wait in
    # the closed form against ~48% simulated, p50 TTFT +28% in the record (+25% in this run; -5% before the
    # stalls' batches, when too few waited)
    ("mixed", "long prompt", 0.9, "ttft50"),
}
LONG_RUN_REQUESTS = 12_000
"""Requests simulated where the queues have a long memory: KV memory binding near capacity (long prompts at
0.8 and 0.9), where a run of 1,500 requests has not reached its steady state (its p90 TTFT is half the
long-run one), and every case at 0.9, where the decode batch relaxes in a lifetime / (1 - rho_d) (~20 s
for the disaggregated chat case, whose 1,500 requests span 27 s: its p90 TPOT was then +23%, and -9%
over 12,000). Elsewhere the closed form, which describes the steady state, would be compared with a
transient."""


def _requests(case) -> int:
    long_memory = case.utilisation >= 0.9 or (case.workload == "long prompt" and case.utilisation >= 0.8)
    return LONG_RUN_REQUESTS if long_memory else 1500


@pytest.fixture(scope="module")
def rows():
    return [run(c, _requests(c)) for c in cases()]


def test_the_grid_has_36_cases_on_three_models_with_an_moe_and_a_sliding_window_model(rows):
    import calculator as pc

    assert len(rows) == 36
    models = {pc.load_model(r.case.model) for r in rows}
    assert len(models) == 3
    assert any(m.moe is not None for m in models) and any(m.num_sliding_layers for m in models)


def test_closed_form_agrees_with_the_simulation(rows):
    outside, gaps_worse = [], []
    for r in rows:
        bound = 0.1 if r.case.utilisation <= 0.8 else 0.2
        for k in METRICS:
            key = (r.case.mode, r.case.workload, r.case.utilisation, k)
            err = r.error(k)
            if key in KNOWN_GAPS:
                if abs(math.log1p(err)) > math.log(2.5):
                    gaps_worse.append((key, f"{err:+.0%}"))
            elif abs(err) > bound:
                outside.append((key, f"{err:+.0%}"))
    assert not outside, outside
    assert not gaps_worse, gaps_worse


def test_most_of_the_grid_is_within_ten_percent(rows):
    errors = sorted(abs(r.error(k)) for r in rows for k in METRICS)
    assert errors[len(errors) // 2] < 0.05  # the median
    assert sum(e <= 0.1 for e in errors) >= 0.8 * len(errors)
