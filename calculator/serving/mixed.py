"""Mixed (colocated) serving, vLLM-style: continuous batching with prefills prioritised.

A prefill runs as its own step and stalls every decode in flight. Per instance, with arrival rate
lambda, prefill time s_p and decode step t_d(B):
  rho_p = lambda E[s_p]                                  (time share of prefills)
  TPOT  = t_d(B) / (1 - rho_p),  B = lambda osl TPOT     (Little's law; least fixed point)
  TTFT  = W_q(M/G/1, lambda, s_p) + (1 - rho_p) t_d / 2 + s_p   (queue + residual decode step + own prefill)
The TPOT tail counts the prefills that land in one request's lifetime: Poisson with mean
m = lambda osl TPOT, so TPOT_p = t_d + E[s_p] (m + z_p sqrt(m)) / osl.
"""

from __future__ import annotations

import numpy as np

from hardware_db.schema import ModelSpec

from .. import formulas as f
from .base import (
    Deployment,
    ModeArrays,
    PoolModel,
    PrefillService,
    decode_fixed_point,
    decode_step_at,
    queue_wait,
    z_score,
)
from .workload import Workload


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float, pm: PoolModel | None = None) -> ModeArrays:
    pool = d.pool
    assert pool is not None
    pm = pm or PoolModel.build(model, pool, w)
    lam = np.asarray(total_rate, dtype=float) / pool.instances
    sp_ = PrefillService.of(pm, w, p)
    rho_p = lam * sp_.mean_s
    ctx = w.isl.mean + (w.osl.mean + 1) / 2
    limit = pm.batch_limit(w)
    inflation = np.where(rho_p < 1, 1.0 / np.maximum(1e-12, 1 - rho_p), np.inf)
    batch, tpot = decode_fixed_point(pm, ctx, lam, w.osl.mean, inflation, limit)
    t_d = tpot * (1 - rho_p)
    wq, wp = queue_wait(lam, sp_, 1, p)
    residual = (1 - rho_p) * t_d / 2
    ttft_mean = wq + residual + sp_.mean_s
    ttft_p = wp + residual + sp_.quantile_s
    stalls = lam * w.osl.mean * tpot
    tpot_p = t_d + sp_.mean_s * (stalls + z_score(p) * np.sqrt(stalls)) / w.osl.mean
    b_cap = np.minimum(batch, limit)
    marginal = decode_step_at(pm, ctx, limit, b_cap + 1) - decode_step_at(pm, ctx, limit, b_cap)
    util = rho_p + lam * w.osl.mean * marginal
    stable = np.isfinite(tpot) & (rho_p < 1) & (util < 1)
    binding = np.where(rho_p > 0.5 * util, "prefill interference", np.where(batch >= limit, "KV memory", "decode"))
    inf = np.inf
    return ModeArrays(stable, util, np.where(stable, ttft_mean, inf), np.where(stable, ttft_p, inf),
                      np.where(stable, tpot, inf), np.where(stable, tpot_p, inf), batch, np.zeros_like(lam), binding)


def tpot_formula() -> str:
    return f.mixed_tpot.latex
