"""The closed form against the simulation on the 36-case acceptance grid (``bench/serving_oracle.py``).

p50 and p90 TTFT and TPOT must be within 10% of the simulation at utilisation <= 0.8 and within
20% at 0.9, except the known gaps listed below (documented in the README and the validation page),
which must stay within a factor 4 (at 0.9, where KV memory binds, the slot wait is up to 3.4x
conservative), so they cannot quietly get worse. The simulation is seeded,
so the figures are repeatable.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from serving_oracle import METRICS, cases, run  # noqa: E402

KNOWN_GAPS = {
    # a single long or short prompt at low load: the sum of the wait's and the length's quantiles
    ("mixed", "chat", 0.3, "ttft90"), ("chunked", "chat", 0.3, "ttft90"),
    # prefill pool batching at moderate load (TTFT p50 low, p90 conservative)
    ("disaggregated", "chat", 0.6, "ttft50"), ("disaggregated", "chat", 0.8, "ttft90"),
    ("disaggregated", "chat", 0.9, "ttft50"), ("disaggregated", "chat", 0.9, "ttft90"),
    # KV memory binds (about 14 sequences of 6,000 tokens): the slot wait (M/G/c with Hayward's
    # peakedness for lifetimes stretched together) is within ~20% at 0.8 and turns 2-3x conservative at 0.9
    ("mixed", "long prompt", 0.6, "ttft90"), ("mixed", "long prompt", 0.8, "ttft90"),
    ("mixed", "long prompt", 0.8, "tpot90"), ("chunked", "long prompt", 0.8, "ttft90"),
    ("chunked", "long prompt", 0.8, "tpot90"),
    ("mixed", "long prompt", 0.9, "ttft50"), ("mixed", "long prompt", 0.9, "ttft90"),
    ("mixed", "long prompt", 0.9, "tpot90"), ("chunked", "long prompt", 0.9, "ttft50"),
    ("chunked", "long prompt", 0.9, "ttft90"), ("chunked", "long prompt", 0.9, "tpot90"),
    ("disaggregated", "long prompt", 0.9, "ttft50"), ("disaggregated", "long prompt", 0.9, "ttft90"),
}


@pytest.fixture(scope="module")
def rows():
    return [run(c) for c in cases()]


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
                if abs(math.log1p(err)) > math.log(4.0):
                    gaps_worse.append((key, f"{err:+.0%}"))
            elif abs(err) > bound:
                outside.append((key, f"{err:+.0%}"))
    assert not outside, outside
    assert not gaps_worse, gaps_worse


def test_most_of_the_grid_is_within_ten_percent(rows):
    errors = sorted(abs(r.error(k)) for r in rows for k in METRICS)
    assert errors[len(errors) // 2] < 0.05  # the median
    assert sum(e <= 0.1 for e in errors) >= 0.8 * len(errors)
