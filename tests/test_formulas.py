"""The sympy formulas: brute-force checks, limits, LaTeX, and vectorised evaluation."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculator import formulas as f


@given(st.integers(1, 300), st.integers(0, 300), st.integers(1, 400))
def test_window_pairs_equal_brute_force(S, P, W):
    brute = sum(min(j, W) for j in range(P + 1, P + S + 1))
    assert f.causal_pairs_window(S=S, P=P, W=W) == brute
    assert f.causal_pairs_full(S=S, P=P) == sum(range(P + 1, P + S + 1))


def test_expected_experts_limits():
    assert f.expected_experts_touched(E=256, k=8, T=1) == pytest.approx(8)
    assert f.expected_experts_touched(E=256, k=8, T=100_000) == pytest.approx(256)
    # 2 tokens: 8 + 8*(1 - 8/256) distinct on average
    assert f.expected_experts_touched(E=256, k=8, T=2) == pytest.approx(8 + 8 * (1 - 8 / 256))


def test_expected_experts_against_sampling():
    rng = np.random.default_rng(0)
    E, k, T = 64, 4, 10
    draws = [len({e for _ in range(T) for e in rng.choice(E, k, replace=False)}) for _ in range(4000)]
    assert f.expected_experts_touched(E=E, k=k, T=T) == pytest.approx(np.mean(draws), rel=0.02)


def test_ring_allreduce_by_hand():
    # 4 GPUs, 64 MB, 450 GB/s at 0.8, 10 us: 2*3/4*64e6/360e9 + 10e-6
    t = f.ring_allreduce_time(n_coll=1, tp=4, M=64e6, beta_link=450e9, eta_l=0.8, alpha=10e-6)
    assert t == pytest.approx(1.5 * 64e6 / 360e9 + 10e-6)
    assert f.ring_allreduce_time(n_coll=1, tp=1, M=64e6, beta_link=450e9, eta_l=0.8, alpha=10e-6) == 0


def test_roofline_takes_the_slower_ceiling():
    kw = {"pi": 1e15, "eta_c": 0.5, "beta_hbm": 1e12, "eta_m": 0.5, "n_k": 0, "tau_k": 0}
    assert f.roofline_time(F=1e12, Q=1e6, **kw) == pytest.approx(2e-3)  # compute: 1e12 / 5e14
    assert f.roofline_time(F=1e6, Q=1e9, **kw) == pytest.approx(2e-3)  # memory: 1e9 / 5e11


def test_every_formula_renders_and_documents_its_symbols():
    assert len(f.FORMULAS) >= 30
    for formula in f.FORMULAS.values():
        assert formula.latex and formula.doc and formula.unit
        assert all(meaning for _, meaning, _ in formula.symbols)


def test_formulas_broadcast_over_arrays():
    S = np.array([1, 10, 100])
    out = f.causal_pairs_full(S=S, P=np.array([[0], [5]]))
    assert out.shape == (2, 3)
    assert out[1, 2] == 100 * 5 + 100 * 101 / 2


def test_missing_argument_is_a_clear_error():
    with pytest.raises(TypeError, match="needs 'P'"):
        f.causal_pairs_full(S=3)


def test_formulas_stay_quiet_inside_and_outside_a_quiet_block():
    """A formula quiets numpy's divide and invalid warnings itself, or, inside ``quiet()`` (``plan`` and
    ``evaluate`` run in one), relies on the block's; either way the same values and no warning, and the
    block leaves numpy's settings as it found them."""
    import warnings

    import numpy as np

    from calculator import formulas as fm
    from calculator.formula import quiet

    x = np.array([0.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alone = fm.token_weighted_tpot(B=x, Delta_B=x, rho_b=x, t_b=x, t_d=x)  # 0 / 0 in the first cell
        with quiet():
            inside = fm.token_weighted_tpot(B=x, Delta_B=x, rho_b=x, t_b=x, t_d=x)
        np.testing.assert_array_equal(alone, inside)
        assert np.isnan(alone[0]) and alone[1] == 1.0
        try:
            np.array([1.0]) / np.array([0.0])
        except RuntimeWarning:
            pass
        else:
            raise AssertionError("quiet() left numpy's divide warning off")
