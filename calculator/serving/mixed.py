"""Mixed (colocated) serving: one pool runs prompts and decodes, under one of two scheduler policies.

``hybrid`` (the default; vLLM V1, SGLang, TensorRT-LLM, llama.cpp's server): every step carries all
running decodes plus whole waiting prompts up to the step's token budget. A prompt of n tokens
makes its step last S(B, n) instead of t_d(B); the decodes still emit their token in it, so each
prompt stalls them by X = S - t_d. This is the chunked model with one piece per prompt
(``chunked.analyse_budgets(whole_prompts=True)``).

``prefill_first`` (vLLM V0, early TGI): waiting prompts run in a step of their own and every
decode waits it out, so a prompt stalls the decodes by its whole prefill time s_p. Per instance,
with arrival rate lambda:
  rho_p = lambda E[s_p]                                  (time share of prefills)
  TPOT  = t_d(B) / (1 - rho_p),  B = lambda osl TPOT     (Little's law; least fixed point)
as a time average; a request sees more, because the batch runs higher while prompts queue
(``chunked.busy_tpot``: ``token_weighted_tpot`` with ``busy_batch_rise``; both policies).
  TTFT  = W_q(M/G/1, lambda, s_p) + W_slot + (1 - rho_p) t_d / 2 + s_p
Both policies take their TPOT tail from ``base.tpot_tail`` (compound-Poisson stalls in a request's
lifetime, amplified by 1 / (1 - rho), and the batch's spread), and their ITL from the share of
gaps that contain a prompt.
"""

from __future__ import annotations

import numpy as np

from hardware_db.schema import ModelSpec

from .. import formulas as f
from .base import Deployment, ModeArrays, PoolModel, PrefillService, decode_step_at, first_root, seen
from .chunked import DPSteps, analyse_budgets, busy_tpot, first_row, single_pool_arrays
from .workload import Workload, running_context


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float, pm: PoolModel | None = None,
            joint: bool = False) -> ModeArrays:
    pool = d.pool
    assert pool is not None
    pm = pm or PoolModel.build(model, pool, w)
    rates = np.asarray(total_rate, dtype=float).reshape(-1)
    if d.scheduler == "hybrid":
        return first_row(analyse_budgets(pm, w, rates, p, np.array([float(d.max_batched_tokens)]), pool.engines,
                                         whole_prompts=True, joint=joint))
    return prefill_first(pm, w, rates, p, pool.engines, d.max_batched_tokens, joint)


def prefill_first(pm: PoolModel, w: Workload, total_rate: np.ndarray, p: float, instances: int,
                  max_batched_tokens: int, joint: bool = False) -> ModeArrays:
    lam = np.asarray(total_rate, dtype=float) / instances
    sp_ = PrefillService.of(pm, w, p)
    rho_p = lam * sp_.mean_s
    ctx = running_context(w)
    limit = pm.batch_limit(w)
    # prompt steps emit no decode tokens (t_b = inf): TPOT(B) = busy_tpot on the decode table
    grid, table = pm.decode_table(ctx, limit)
    cv2 = sp_.cs2
    lam2 = lam[:, None]
    ranks = float(pm.pool.coupled_ranks)  # attention-DP ranks that wait for each other's prompt steps
    holds = max(1.0, float(max_batched_tokens // max(w.isl.mean * (1 - w.prefix_hit), 1.0)))  # prompts a step takes
    # where the ranks step together, one rank's prompt step runs beside the others' decodes, as long as a step
    # that carries the prompt (its rank's alone) and the decodes, and a decoding request adds 1 / ranks to the
    # batch the step is timed at
    new_tokens, cached = w.isl.mean * (1 - w.prefix_hit), w.isl.mean * w.prefix_hit
    own_grid = np.asarray(pm.step_s(grid, ctx, new_tokens, cached))[None, :] if ranks > 1 else sp_.mean_s
    tpot_grid = busy_tpot(lam2, grid[None, :], seen(grid, table, 1 / ranks)[None, :], lam2 * own_grid, own_grid,
                          np.inf, cv2, w.arrival_cv**2, ranks=ranks, prompt_step_s=own_grid, holds=holds)
    batch = first_root(grid, grid[None, :] - lam2 * w.osl.mean * tpot_grid)
    b_cap = np.minimum(batch, limit)
    t_d = decode_step_at(pm, ctx, limit, b_cap)
    slope = decode_step_at(pm, ctx, limit, b_cap + 1) - t_d
    seen_s = t_d + slope if ranks == 1 else decode_step_at(pm, ctx, limit, b_cap + 1 / ranks)
    # a prompt's own step: its prefill alone, or beside the other ranks' decodes where the ranks step together
    own_s = np.full(lam.shape, sp_.mean_s) if ranks == 1 else np.asarray(pm.step_s(b_cap, ctx, new_tokens, cached))
    scale = own_s / sp_.mean_s
    rho_p = lam * own_s
    tpot = busy_tpot(lam, b_cap, seen_s, rho_p, own_s, np.inf, cv2, w.arrival_cv**2, ranks=ranks,
                     prompt_step_s=own_s, holds=holds)
    dp = DPSteps.of(rho_p, seen_s, own_s, ranks, holds) if ranks > 1 else None
    a = single_pool_arrays(
        pm, w, lam[None], p, batch[None], np.array([[limit]]), t_d[None], tpot[None], rho_p[None], rho_p[None],
        own_s[None], own_s[None], own_s[None], (sp_.quantile_s * scale)[None], slope[None], piece_s=own_s[None] + t_d[None],
        stall_gap_share=(lam * tpot)[None], batched=np.full((1, lam.size), max_batched_tokens >= 2 * w.isl.mean),
        interference="prefill interference", joint=joint, own_steps=0.0,
        prompt_s=lambda q: own_s * PrefillService.of(pm, w, q).quantile_s / PrefillService.of(pm, w, q).mean_s,
        dp=None if dp is None else DPSteps(*(np.asarray(x)[None] for x in dp.__dict__.values())), ranks=ranks)
    return first_row(a)


def tpot_formula() -> str:
    return f.mixed_tpot.latex
