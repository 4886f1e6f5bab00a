"""The batch root searches of the serving model: ``coarse_first_root`` (what chunked and hybrid serving use,
~40 of the grid's 128 columns a cell) against ``first_root`` over the whole grid."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from calculator.serving.base import COARSE_ROOT_STRIDE, batch_grid, coarse_first_root, first_root


def _excess(grid: np.ndarray, g: np.ndarray):
    """``excess(cols)`` over a table g (cells x grid), as analyse_budgets builds it."""
    cells = np.arange(g.shape[0])

    def excess(cols):
        cols = np.asarray(cols)
        return g[cells[:, None], cols] if cols.ndim == 2 else g[:, cols]

    return excess


@settings(max_examples=200, deadline=None)
@given(st.floats(0.5, 2000), st.floats(0.0, 2.0), st.floats(0.0, 3.0), st.floats(1e-4, 0.2),
       st.floats(0.0, 5e-4), st.floats(1.0, 4.0))
def test_coarse_root_is_the_whole_grid_root_for_a_convex_step_curve(limit, t0, slope, k, curve, power):
    """B = k T(B) with T increasing and convex (a decode step with a queueing stretch): the least root
    over the grid is the same with ~40 columns as with all 128 (or both are unstable)."""
    grid = batch_grid(limit)
    rates = np.geomspace(0.05, 20, 41)
    table = t0 + slope * grid / grid[-1] + curve * grid**power
    g = grid[None, :] - (k * rates)[:, None] * table[None, :] * grid[-1]
    full = first_root(grid, g)
    coarse = coarse_first_root(grid, _excess(grid, g))
    assert np.array_equal(np.isfinite(full), np.isfinite(coarse))
    ok = np.isfinite(full)
    np.testing.assert_allclose(coarse[ok], full[ok], rtol=1e-12)


def test_a_pair_of_roots_between_coarse_points_is_found_at_the_peak():
    """Just below the load where the least root vanishes, g(B) = B - F(B) crosses zero and back within a
    coarse interval; the fine window around g's largest coarse value finds the first crossing."""
    grid = batch_grid(100.0)
    peak = 61  # between the coarse columns 60 and 64
    g = -np.abs(np.arange(grid.size) - peak).astype(float) + 0.5  # >= 0 at column 61 only
    g = g[None, :]
    full = first_root(grid, g)
    coarse = coarse_first_root(grid, _excess(grid, g))
    assert peak % COARSE_ROOT_STRIDE != 0 and np.isfinite(full[0])
    np.testing.assert_allclose(coarse, full, rtol=1e-12)
    # past a batch limit (``upper``) a rising g does not draw the window away from the peak
    tail = g.copy()
    tail[0, 100:] = np.linspace(-5.0, -0.1, grid.size - 100)  # rises again past the limit, stays negative
    assert np.isfinite(coarse_first_root(grid, _excess(grid, tail), upper=grid[90])[0])


def test_no_root_and_a_root_below_the_grid():
    grid = batch_grid(50.0)
    never = (-1.0 - grid)[None, :]  # F(B) = 2B + 1: the batch outgrows any grid
    assert np.isinf(coarse_first_root(grid, _excess(grid, never))[0])
    flat = (grid - 0.2)[None, :]  # F = 0.2 < grid[0]: the root lies below the grid, at F itself
    np.testing.assert_allclose(coarse_first_root(grid, _excess(grid, flat)), first_root(grid, flat))
    np.testing.assert_allclose(coarse_first_root(grid, _excess(grid, flat)), [0.2])


def test_the_bulk_wait_quantile_for_prompts_of_one_length_is_the_bisection_without_its_error():
    """A prefill pool's arrival-to-prefill-end under bulk service, for prompts of one length: a point mass at
    T(1) (the pool was idle) and a gamma (it was busy). ``_point_and_gamma_quantile`` inverts it in closed form;
    the bisection it replaces agrees to 6e-4 off the point mass and lands within one final bracket (bracket /
    2^14) above it on it, where the closed form is exactly T(1)."""
    from calculator import formulas as f
    from calculator.serving.base import BISECTION_STEPS, decreasing_root
    from calculator.serving.disaggregated import _gamma_cdf_wh, _point_and_gamma_quantile

    rng = np.random.default_rng(0)
    n = 4000
    p_busy = rng.uniform(0, 1, n)
    p_busy[:100], p_busy[100:200] = 0.0, 1.0
    t1 = 0.37
    k, theta = rng.uniform(0.3, 50, n), rng.uniform(0.001, 0.5, n)
    levels = rng.choice([0.5, 0.6, 0.9, 0.99, 0.999], n)

    def cdf(x):
        return (1 - p_busy) * np.where(x >= t1, 1.0, 0.0) + p_busy * _gamma_cdf_wh(x, k, theta)

    hi = t1 + np.asarray(f.gamma_quantile_wh(k_g=k, theta_g=theta, z=4.0)) * 2
    bisected = decreasing_root(lambda x: levels - cdf(x), np.zeros(n), hi.copy(), BISECTION_STEPS + 4)
    closed = _point_and_gamma_quantile(levels, p_busy, t1, k, theta)
    on_mass = closed == t1
    assert 0.2 < on_mass.mean() < 0.9
    assert np.all(on_mass[:100])  # an idle pool: every quantile is the prompt's own step
    np.testing.assert_allclose(closed[~on_mass], bisected[~on_mass], rtol=6e-4)
    assert np.all(np.abs(bisected[on_mass] - t1) <= hi[on_mass] / 2 ** (BISECTION_STEPS + 4))
    # the closed form is the level's quantile of the mixture
    inside = ~on_mass & (closed > 0)
    mix = (1 - p_busy) * (closed >= t1) + p_busy * _gamma_cdf_wh(closed, k, theta)
    np.testing.assert_allclose(mix[inside], levels[inside], atol=1e-6)
