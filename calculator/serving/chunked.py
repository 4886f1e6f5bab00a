"""Chunked prefill, Sarathi-style: each iteration carries every running decode plus up to C - B
tokens of waiting prompts (C the token budget, B the decodes running).

Per instance with arrival rate lambda: a prompt of n new tokens takes k = ceil(n / (C - B))
iterations whose total is S(B) (k - 1 full chunks t(B, C - B) and the remainder; the chunks re-read
the KV of the earlier ones). Those k iterations also emit decode tokens, so each prompt costs the
decodes only its extra time S - k t_d(B) over k plain decode iterations:
  rho_x = lambda (S - k t_d)                       (time share of the extra prefill work)
  TPOT  = t_d(B) / (1 - rho_x),  B = lambda osl TPOT  (Little's law; least root on a batch grid)
  TTFT  = W_q(M/G/1, lambda, S) + (1 - rho_x) t_d / 2 + S
The TPOT tail counts the prompts that land in one request's lifetime (Poisson, mean
m = lambda osl TPOT): TPOT_p = t_d + (S - k t_d)(m + z_p sqrt(m)) / osl. Compared with mixed
serving the stall per prompt shrinks from S_prefill to S - k t_d (the decodes ride along), and a
single inter-token gap never exceeds one full iteration t(B, C - B).
"""

from __future__ import annotations

import numpy as np

from hardware_db.schema import ModelSpec

from .base import (
    Deployment,
    GridLookup,
    ModeArrays,
    PoolModel,
    PrefillService,
    first_root,
    interp_rows,
    queue_wait,
    z_score,
)
from .workload import Workload


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float, pm: PoolModel | None = None) -> ModeArrays:
    pool = d.pool
    assert pool is not None
    pm = pm or PoolModel.build(model, pool, w)
    a = analyse_budgets(pm, w, np.asarray(total_rate, dtype=float).reshape(-1), p, np.array([float(d.chunk_tokens)]),
                        pool.instances)
    return ModeArrays(*(np.asarray(x)[0] for x in a.__dict__.values()))


def analyse_budgets(pm: PoolModel, w: Workload, total_rate: np.ndarray, p: float, chunks: np.ndarray,
                    instances: int) -> ModeArrays:
    """The chunked mode for several token budgets at once: arrays of (budgets x rates).

    ``total_rate`` is one array of rates for every budget, or one row of rates per budget.
    """
    lam = np.atleast_2d(np.asarray(total_rate, dtype=float) / instances)
    chunks = np.asarray(chunks, dtype=float)
    cached = w.isl.mean * w.prefix_hit
    isl_new = w.isl.mean - cached
    isl_q_new = w.isl.quantile(p) * (1 - w.prefix_hit)
    ctx = w.isl.mean + (w.osl.mean + 1) / 2
    grid_limit = pm.batch_limit(w)
    limits = np.minimum(grid_limit, chunks - 1.0)
    limit = limits[:, None]
    tab = pm.chunked_tables(ctx, grid_limit, limits, chunks, (isl_new, isl_q_new), cached)
    grid = tab["grid"]

    # TPOT(B) = t_d / (1 - lambda (S - k t_d)) on the grid, then the least root of B = lambda osl TPOT(B)
    lam3 = lam[..., None]
    extra = (tab["prefill_0"] - tab["iters_0"] * tab["decode_only"])[:, None, :]
    share = lam3 * extra
    tpot_grid = np.where(share < 1, tab["decode_only"][:, None, :] / np.maximum(1 - share, 1e-12), np.inf)
    batch = first_root(grid, grid[None, None, :] - lam3 * w.osl.mean * tpot_grid)

    at = GridLookup(grid, np.minimum(batch, limit))
    t_d, s_mean, k_mean, s_q = at(tab["decode_only"]), at(tab["prefill_0"]), at(tab["iters_0"]), at(tab["prefill_1"])
    rho_x = lam * (s_mean - k_mean * t_d)
    rho_prefill = lam * s_mean
    tpot = t_d / np.maximum(1 - rho_x, 1e-12)
    stable = np.isfinite(batch) & (batch <= limit) & (rho_prefill < 1) & (rho_x < 1)

    service = PrefillService(s_mean, s_mean**2 * (1 + w.isl.cv**2), s_q)  # type: ignore[arg-type]
    wq, wp = queue_wait(lam, service, 1, p)
    residual = (1 - rho_x) * t_d / 2
    ttft_mean = wq + residual + s_mean
    ttft_p = wp + residual + s_q
    stalls = lam * w.osl.mean * tpot
    tpot_p = t_d + (s_mean - k_mean * t_d) * (stalls + z_score(p) * np.sqrt(stalls)) / w.osl.mean
    b_cap = np.minimum(batch, limit)
    marginal = interp_rows(grid, tab["decode_only"], b_cap + 1) - t_d
    util = np.maximum(np.maximum(rho_prefill, rho_x + lam * w.osl.mean * marginal), batch / limit)
    binding = np.where(batch >= limit, "decode batch / KV",
                       np.where(rho_x > 0.5 * util, "prefill chunks", "decode"))
    inf = np.inf
    return ModeArrays(
        stable, util, np.where(stable, ttft_mean, inf), np.where(stable, ttft_p, inf), np.where(stable, tpot, inf),
        np.where(stable, tpot_p, inf), batch, np.zeros_like(batch), binding,
    )
