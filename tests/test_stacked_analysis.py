"""A plan analyses every (GPU, tp) configuration's chunk budgets in one call (``PoolRows``): each row must
be what its pool gives alone, whatever the other pools beside it (their batch grids, limits and slot counts
differ)."""

from __future__ import annotations

import numpy as np
import pytest

import calculator as pc
from calculator import optimizer as o
from calculator.serving import chunked
from calculator.serving.base import GridLookup, PoolRows, PrefillService, batch_grid, rate_grid

BUDGETS = np.array([8192.0, 512.0, 2048.0, 8192.0])
WHOLE = np.array([True, False, False, False])


def _singles(model: str, w: pc.Workload, gpus: list[str], dtype: str = "bf16"):
    m = pc.load_model(model)
    return o._singles(m, [pc.load_gpu(g) for g in gpus], o.TP_CHOICES, w, dtype, "bf16", o.DPS, o.CPS)


CASES = {
    "llama-70b long prompts": ("llama-3.1-70b", pc.Workload(rate=12.0, isl=4000, osl=500),
                               ["h100-sxm", "h20", "a100-sxm-80gb"], "bf16", 0.9, False),
    "llama-8b joint, bursty": ("llama-3.1-8b", pc.Workload(rate=20, isl={"mean": 1500, "cv": 0.8}, osl=300,
                                                           arrival_cv=2.0), ["h100-sxm", "l4"], "bf16", 0.99, True),
    "moe fp8": ("qwen3-30b-a3b", pc.Workload(rate=12.0, isl=2000, osl=500), ["h100-sxm", "h200-sxm"], "fp8", 0.9,
                False),
    "sliding window": ("gemma-3-27b", pc.Workload(rate=2.0, isl=20000, osl=300), ["h100-sxm", "h200-sxm"], "bf16",
                       0.9, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stacked_rows_equal_each_pool_alone(case: str) -> None:
    model, w, gpus, dtype, p, joint = CASES[case]
    singles = _singles(model, w, gpus, dtype)
    assert len({s.pm.batch_limit(w) for s in singles}) > 1  # pools of different limits side by side
    rates = [np.broadcast_to(rate_grid(1 / PrefillService.of(s.pm, w, p).mean_s, 12), (BUDGETS.size, 12))
             for s in singles]
    with np.errstate(all="ignore"):
        alone = [chunked.analyse_budgets(s.pm, w, r, p, BUDGETS, 1, WHOLE, joint) for s, r in zip(singles, rates)]
        rows = PoolRows(tuple(s.pm for s in singles), np.repeat(np.arange(len(singles)), BUDGETS.size))
        stacked = chunked.analyse_budgets(rows, w, np.concatenate(rates), p, np.tile(BUDGETS, len(singles)), 1,
                                          np.tile(WHOLE, len(singles)), joint)
    stable = 0
    for i, a in enumerate(alone):
        for name, mine in a.__dict__.items():
            theirs = getattr(stacked, name)
            if mine is None:
                assert theirs is None, name
                continue
            part = np.asarray(theirs)[i * BUDGETS.size:(i + 1) * BUDGETS.size]
            if np.asarray(mine).dtype.kind in "OUb":
                assert (part == mine).all(), (name, i)
            else:  # the slot chain's overflow guard may round in the last bits; nothing else differs
                np.testing.assert_allclose(part, mine, rtol=1e-8, atol=0, err_msg=f"{name}, pool {i}")
        stable += int(np.asarray(a.stable).sum())
    assert stable > 0.3 * stacked.stable.size  # the rows compared are mostly finite


def test_grid_lookup_with_a_grid_per_row() -> None:
    """Row r of a (rows x points) grid looks up as that row's grid alone (the one-call searchsorted)."""
    grids = np.stack([batch_grid(4.0), batch_grid(111.0), batch_grid(512.0)])
    tables = np.stack([np.sqrt(g) + 3 for g in grids])
    x = np.array([[0.1, 0.5, 2.2, 5.0, np.inf], [1.0, 7.3, 50.0, 111.9, 300.0], [0.7, 12.0, 400.0, 513.0, 1e6]])
    got = GridLookup(grids, x)(tables)
    for r in range(3):
        want = GridLookup(grids[r], x[r:r + 1])(tables[r:r + 1])[0]
        np.testing.assert_allclose(got[r], want, rtol=1e-14)
    # hand values: sqrt on the grid, linear between points, clamped at the ends, inf stays inf
    assert got[0, 0] == pytest.approx(np.sqrt(0.5) + 3)
    assert got[0, 4] == np.inf
    assert got[2, 4] == pytest.approx(np.sqrt(513.0) + 3)
    assert got[1, 2] == pytest.approx(np.sqrt(50.0) + 3, rel=1e-3)
