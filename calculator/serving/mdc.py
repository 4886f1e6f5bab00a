"""The delay probability of the M/D/c queue against M/M/c's (Erlang C), for the queue for a batch slot.

Requests hold a batch slot for a time that a fixed output length makes nearly constant, and a constant hold
makes a request less likely to find every slot taken than an exponential one at the same load. The slots'
chain (``SlotQueue``) has exponential departures, so its P(all slots taken) is M/M/c's kind; this module
gives the factor that takes it to M/D/c's.

The M/D/c figure is exact (C. D. Crommelin, "Delay probability formulae when the holding times are
constant", P.O. Electr. Engr. J. 25 (1932) 41-50): looked at every hold D, the requests beyond the c in
service, X, follow X' = max(X + A - c, 0) with A the Poisson(a = lambda D) arrivals of one hold, and the
number present is N = X + A, so P(N >= c), by PASTA the delay probability, comes from the stationary X.
``delay_probability_ratio`` reads a table of these exact ratios (``RATIO_TABLE``, written by ``python -m
calculator.serving.mdc``; ``tests/test_serving_v2.py`` recomputes it) over the Halfin-Whitt spread beta = (1 -
rho) sqrt(c), on which the ratio mostly depends (0.95 at beta 0.5 for c = 8-22 servers, 1 at beta 0 and for
one server), and log2 c.
"""

from __future__ import annotations

import math

import numpy as np

TABLE_BETAS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
"""Halfin-Whitt spreads beta = (1 - rho) sqrt(c) of ``RATIO_TABLE``'s rows."""
TABLE_SERVERS = (1, 2, 4, 8, 16, 32, 64, 128)
"""Server counts c of ``RATIO_TABLE``'s columns (read in log2 c; beyond 128 the ratio is taken as at 128)."""
MIN_LOAD = 0.05
"""Loads below which a table entry is that of this load (a spread beta too wide for c servers: the delay
probability is below 0.005 there, so the ratio barely matters)."""


def erlang_c(a: float, c: int) -> float:
    """M/M/c's delay probability at offered load a = lambda / mu < c (Erlang's C formula)."""
    term, below = 1.0, 0.0
    for k in range(c):
        below += term
        term *= a / (k + 1)
    top = term * c / (c - a)
    return top / (below + top)


MAX_STATES = 6000
"""States of the embedded chain ``md_c_delay_probability`` solves at most (a dense system: 290 MB)."""


def md_c_delay_probability(a: float, c: int) -> float:
    """M/D/c's delay probability at offered load a = lambda D < c, exact (Crommelin's embedded chain, solved
    as a linear system over X = 0 ... a bound 20 / (1 - rho) states beyond c + a + 40 sqrt(a + 1) + 100, where the
    queue's geometric tail, decaying about as exp(-2 (1 - rho) x / rho), holds less than 1e-13)."""
    if not 0 <= a < c:
        raise ValueError(f"load a = {a} must be in [0, {c})")
    size = int(c + a + 40 * math.sqrt(a + 1) + 100 + 20 / (1 - a / c))
    if size > MAX_STATES:
        raise ValueError(f"load a = {a} is too close to c = {c} for the exact chain ({size} states; at most "
                         f"{MAX_STATES}): the ratio to Erlang C is within 0.01 of 1 there")
    k = np.arange(size)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, size)))])
    pmf = np.exp(k * math.log(a) - a - log_fact) if a > 0 else (k == 0).astype(float)
    # X' = max(X + A - c, 0): row x moves to x + j - c with probability pmf[j], clipped at 0 and at the bound
    to = np.clip(k[:, None] + k[None, :] - c, 0, size - 1)  # (x, j)
    P = np.zeros((size, size))
    np.add.at(P, (np.broadcast_to(k[:, None], to.shape), to), np.broadcast_to(pmf, to.shape))
    A = P.T - np.eye(size)
    A[-1, :] = 1.0  # replace one balance equation by the normalisation
    rhs = np.zeros(size)
    rhs[-1] = 1.0
    pi = np.linalg.solve(A, rhs)
    cdf = np.cumsum(pmf)
    below = float(sum(pi[j] * cdf[c - 1 - j] for j in range(c)))  # P(X + A <= c - 1)
    return 1.0 - below


def exact_ratio(beta: float, c: int) -> float:
    """M/D/c's delay probability over M/M/c's at spread beta = (1 - rho) sqrt(c) (the load at ``MIN_LOAD`` at
    least; 1 at beta 0, where both delay probabilities reach 1)."""
    if beta <= 0:
        return 1.0
    rho = max(1 - beta / math.sqrt(c), MIN_LOAD)
    a = rho * c
    return md_c_delay_probability(a, c) / erlang_c(a, c)


RATIO_TABLE = np.array([
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    [1.0, 0.9954, 0.9921, 0.9898, 0.9882, 0.9871, 0.9863, 0.9857],
    [1.0, 0.9885, 0.9806, 0.9751, 0.9714, 0.9689, 0.9671, 0.9659],
    [1.0, 0.9775, 0.9627, 0.953, 0.9467, 0.9424, 0.9395, 0.9375],
    [1.0, 0.9685, 0.9481, 0.9352, 0.9269, 0.9214, 0.9178, 0.9153],
    [1.0, 0.9648, 0.9389, 0.9231, 0.9132, 0.9067, 0.9024, 0.8995],
    [1.0, 0.9863, 0.9492, 0.9216, 0.9063, 0.897, 0.891, 0.887],
    [1.0, 0.9863, 0.9894, 0.9499, 0.9245, 0.91, 0.901, 0.8952],
    [1.0, 0.9863, 0.9894, 0.994, 0.976, 0.9566, 0.9439, 0.9355],
])
"""``exact_ratio`` at (``TABLE_BETAS`` rows, ``TABLE_SERVERS`` columns), to 4 decimals."""


def delay_probability_ratio(rho, c) -> np.ndarray:
    """M/D/c's delay probability over M/M/c's at load ``rho`` (< 1) and ``c`` servers (arrays; fractional c
    read between its neighbours): ``RATIO_TABLE`` read bilinearly in (beta, log2 c), clamped at its edges (from
    128 servers on, the ratio at 128: within 0.006 of the exact one at 256 and 512); 1 where rho or c is not a
    number."""
    c = np.maximum(np.asarray(c, dtype=float), 1.0)
    with np.errstate(invalid="ignore"):
        beta = (1 - np.asarray(rho, dtype=float)) * np.sqrt(c)
    beta = np.clip(np.where(np.isnan(beta), 0.0, beta), TABLE_BETAS[0], TABLE_BETAS[-1])  # not a number: 1
    col = np.clip(np.where(np.isnan(c), 0.0, np.log2(c)), 0.0, math.log2(TABLE_SERVERS[-1]))
    b_ix = np.arange(len(TABLE_BETAS), dtype=float)
    row = np.interp(beta, TABLE_BETAS, b_ix)
    r0 = np.floor(row).astype(int)
    r1 = np.minimum(r0 + 1, len(TABLE_BETAS) - 1)
    c0 = np.floor(col).astype(int)
    c1 = np.minimum(c0 + 1, len(TABLE_SERVERS) - 1)
    fr, fc = row - r0, col - c0
    t = RATIO_TABLE
    return ((1 - fr) * ((1 - fc) * t[r0, c0] + fc * t[r0, c1]) + fr * ((1 - fc) * t[r1, c0] + fc * t[r1, c1]))


def table_rows() -> list[list[float]]:
    """``RATIO_TABLE`` computed afresh (``exact_ratio`` at every entry, to 4 decimals)."""
    return [[round(exact_ratio(b, c), 4) for c in TABLE_SERVERS] for b in TABLE_BETAS]


if __name__ == "__main__":
    print("RATIO_TABLE = np.array([")
    for r in table_rows():
        print(f"    {r},")
    print("])")
