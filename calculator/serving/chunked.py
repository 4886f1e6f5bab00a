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
    ATTAINMENT_LEVELS,
    Deployment,
    GridLookup,
    ModeArrays,
    PoolModel,
    PrefillService,
    first_root,
    interp_rows,
    admission_wait,
    step_wait,
    tpot_tail,
    z_score,
)
from .workload import Workload


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float, pm: PoolModel | None = None,
            joint: bool = False) -> ModeArrays:
    pool = d.pool
    assert pool is not None
    pm = pm or PoolModel.build(model, pool, w)
    a = analyse_budgets(pm, w, np.asarray(total_rate, dtype=float).reshape(-1), p, np.array([float(d.chunk_tokens)]),
                        pool.instances, joint=joint)
    return first_row(a)


def first_row(a: ModeArrays) -> ModeArrays:
    """The arrays of the first budget (row) of a (budgets x rates) result."""
    return ModeArrays(*(None if x is None else np.asarray(x)[0] for x in a.__dict__.values()))


def analyse_budgets(pm: PoolModel, w: Workload, total_rate: np.ndarray, p: float, chunks: np.ndarray,
                    instances: int, whole_prompts: bool = False, joint: bool = False) -> ModeArrays:
    """Steps that carry every running decode plus prompt tokens, for several token budgets at once:
    arrays of (budgets x rates).

    Chunked (Sarathi): a prompt is cut into pieces of C - B tokens. With ``whole_prompts`` (the
    hybrid scheduler with chunking off) a prompt is one piece however long, so C only bounds how
    many prompts share a step. ``total_rate`` is one array of rates for every budget, or one row
    of rates per budget.
    """
    lam = np.atleast_2d(np.asarray(total_rate, dtype=float) / instances)
    chunks = np.asarray(chunks, dtype=float)
    cached = w.isl.mean * w.prefix_hit
    isl_new = w.isl.mean - cached
    isl_q_new = w.isl.quantile(p) * (1 - w.prefix_hit)
    ctx = w.isl.mean + (w.osl.mean + 1) / 2
    grid_limit = pm.batch_limit(w)
    if whole_prompts:
        pieces = np.full_like(chunks, max(isl_q_new, isl_new, w.isl.max) + grid_limit + 2)
        limits = np.full_like(chunks, grid_limit)
    else:
        pieces = chunks
        limits = np.minimum(grid_limit, chunks - 1.0)
    limit = limits[:, None]
    tab = pm.chunked_tables(ctx, grid_limit, limits, pieces, (isl_new, isl_q_new), cached)
    grid = tab["grid"]

    # TPOT(B) = t_d / (1 - lambda (S - k t_d)) on the grid, then the least root of B = lambda osl TPOT(B)
    lam3 = lam[..., None]
    extra = (tab["prefill_0"] - tab["iters_0"] * tab["decode_only"])[:, None, :]
    share = lam3 * extra
    tpot_grid = np.where(share < 1, tab["decode_only"][:, None, :] / np.maximum(1 - share, 1e-12), np.inf)
    batch = first_root(grid, grid[None, None, :] - lam3 * w.osl.mean * tpot_grid)
    b_cap = np.minimum(batch, limit)

    at = GridLookup(grid, b_cap)
    t_d, s_mean, k_mean, s_q = at(tab["decode_only"]), at(tab["prefill_0"]), at(tab["iters_0"]), at(tab["prefill_1"])
    x_mean = s_mean - k_mean * t_d  # what one prompt adds to every running decode's lifetime
    rho_x = lam * x_mean
    tpot = t_d / np.maximum(1 - rho_x, 1e-12)
    slope = interp_rows(grid, tab["decode_only"], b_cap + 1) - t_d
    room = np.maximum(pieces[:, None] - b_cap, 1.0)
    fits_whole = isl_new < room  # the prompt fits one step: steps batch whole prompts, as when chunking is off
    if whole_prompts:  # one step per prompt; prompts that queued share a step when the budget holds two
        piece_s, pieces, s_queued, s_queued_q, work_s = s_mean, np.ones_like(s_mean), s_mean, s_q, s_mean
        batched = np.broadcast_to((chunks >= 2 * w.isl.mean)[:, None], s_mean.shape)
    else:  # C - B tokens a step; a prompt that queued starts in its predecessor's last step (half a step on average)
        t_full = at(tab["full"])
        pieces = isl_new / room
        piece_s, batched = np.where(fits_whole, s_mean, t_full), fits_whole
        s_queued = np.where(fits_whole, s_mean, (pieces + 0.5) * t_full)
        s_queued_q = np.where(fits_whole, s_q, (isl_q_new / room + 0.5) * t_full)
        work_s = np.where(fits_whole, s_mean, pieces * t_full)
    return single_pool_arrays(pm, w, lam, p, batch, limit, t_d, tpot, rho_x, lam * work_s, x_mean, work_s, s_mean,
                              s_q, slope, piece_s=piece_s, queued_s=None if whole_prompts else (s_queued, s_queued_q),
                              shared_steps=np.broadcast_to(batched, s_mean.shape), stall_gap_share=lam * pieces * tpot, batched=batched,
                              interference="prefill interference" if whole_prompts else "prefill chunks", joint=joint,
                              prompt_s=lambda q: s_mean * _prefill_ratio(pm, w, q))


def _prefill_ratio(pm: PoolModel, w: Workload, q: float) -> float:
    """Prefill time of the q-quantile prompt over the mean prefill time (batch-1 roofline)."""
    return PrefillService.of(pm, w, q).quantile_s / PrefillService.of(pm, w, q).mean_s


def single_pool_arrays(pm: PoolModel, w: Workload, lam, p: float, batch, limit, t_d, tpot, rho_x, rho_prefill, x_mean,
                       work_s, s_mean, s_q, slope, piece_s, stall_gap_share, batched, interference: str, joint: bool,
                       prompt_s, queued_s=None, shared_steps=None) -> ModeArrays:
    """Tails, waits, utilisation and the binding resource of one instance that runs prompts and decodes.

    ``x_mean``: time one prompt adds to every running decode; ``work_s``: the time a prompt holds the
    prompt queue (its share of the steps); ``s_mean`` / ``s_q``: a prompt's own time from its first
    step to its first token (mean, p-quantile); ``piece_s``: the duration of a step that carries a
    prompt piece; ``stall_gap_share``: the share of decode gaps that contain one; ``batched``: whether
    queued prompts share a step; ``queued_s``: (mean, p-quantile) of a prompt's own time when it
    queued, where that differs (chunked: it starts in its predecessor's last step); ``shared_steps``
    (bool array): whole prompts ride in the decodes' steps, so a prompt waits only for the step in
    progress and then runs in the next one with every prompt that arrived meanwhile (``_step_ttft``).
    """
    stable_decode = np.isfinite(batch) & (batch < limit) & (rho_prefill < 1) & (rho_x < 1)
    b_cap = np.minimum(batch, limit)
    cv2 = w.isl.cv**2
    tpot_var, tpot_p = tpot_tail(tpot, rho_x, lam, x_mean, cv2, w, slope, b_cap, p)

    # TTFT: the prompt queue (M/G/1, a prompt's whole time as service), the residual of the step in
    # progress, a batch slot (KV memory / batch cap) and the prompt's own time
    life = w.osl.mean * tpot
    service = PrefillService(work_s, work_s**2 * (1 + cv2), s_q)  # type: ignore[arg-type]
    busy = None if queued_s is None else s_mean
    wq, wp = step_wait(lam, service, t_d, p, batched, busy)
    aq, ap = admission_wait(lam, batch, limit, life + s_mean, w.osl.cv**2, p)
    own_mean, own_p = s_mean, s_q
    if queued_s is not None:
        pw = np.clip(lam * s_mean, 0.0, 1.0)
        own_mean = (1 - pw) * s_mean + pw * queued_s[0]
        own_p = np.where(pw > 1 - p, np.maximum(s_q, queued_s[1]), s_q)
    ttft_mean = wq + aq + own_mean
    ttft_p = wp + ap + own_p
    if shared_steps is not None:  # the step model where prompts are short next to a decode step
        shared_steps = shared_steps & (x_mean < t_d)
        step_mean, step_p = _step_ttft(lam, t_d, tpot, x_mean, cv2, rho_x, p, x_q=x_mean * _scale(pm, w, p))
        ttft_mean = np.where(shared_steps, step_mean + aq, ttft_mean)
        ttft_p = np.where(shared_steps, step_p + ap, ttft_p)
    levels = None
    if joint:
        rows = []
        for q in ATTAINMENT_LEVELS:
            _, wq_q = step_wait(lam, service, t_d, float(q), batched, busy)
            _, ap_q = admission_wait(lam, batch, limit, life + s_mean, w.osl.cv**2, float(q))
            row = wq_q + ap_q + prompt_s(float(q))
            if shared_steps is not None:
                step_q = _step_ttft(lam, t_d, tpot, x_mean, cv2, rho_x, float(q), x_mean * _scale(pm, w, float(q)))[1]
                row = np.where(shared_steps, step_q + ap_q, row)
            rows.append(row)
        levels = np.stack(rows, axis=-2)

    # ITL: a gap is a plain decode step (its batch Poisson) unless a prompt piece rides in it
    q_stall = 1 - (1 - p) / np.maximum(stall_gap_share, 1e-12)
    plain = t_d + z_score(p) * np.sqrt(np.maximum(b_cap, 0)) * slope
    itl_p = np.where(stall_gap_share > 1 - p, piece_s * np.maximum(1.0, _scale(pm, w, q_stall)), plain)

    # utilisation: the share of each resource in use; the largest binds
    kv_limit = pm.kv_limit(w)
    # without a batch root: the slots the arrivals would hold (the stalls' inflation only while they fit)
    demand = lam * w.osl.mean * t_d / np.where(rho_x < 1, np.maximum(1 - rho_x, 1e-3), 1.0)
    occupancy = np.where(np.isfinite(batch), batch, demand) / limit
    # decode bandwidth: the marginal sequence's step time over the time the prompts leave to the decodes
    decode_load = lam * w.osl.mean * slope / np.where(rho_x < 1, np.maximum(1 - rho_x, 1e-3), 1.0)
    names = np.array([interference, "decode bandwidth",
                      "batch cap" if pm.pool.max_batch <= kv_limit else "KV memory"])
    stacked = np.stack(np.broadcast_arrays(rho_x, decode_load, occupancy))
    stacked = np.where(np.isfinite(stacked), stacked, 1e9)
    util = stacked.max(axis=0)
    binding = names[np.argmax(stacked, axis=0)]
    stable = stable_decode & (util < 1)
    inf = np.inf
    return ModeArrays(
        stable, util, np.where(stable, ttft_mean, inf), np.where(stable, ttft_p, inf), np.where(stable, tpot, inf),
        np.where(stable, tpot_p, inf), batch, np.zeros_like(batch), binding, np.where(stable, tpot_var, inf),
        np.where(stable, itl_p, inf), None if levels is None else np.where(stable, levels, inf),
    )


def _step_ttft(lam, t_d, tpot, x_mean, x_cv2: float, rho_x, p: float, x_q) -> tuple[np.ndarray, np.ndarray]:
    """(mean, p-quantile) of TTFT when whole prompts join the decodes' steps.

    Steps follow one another: a step lasts t_d plus x for each prompt in it, and holds the prompts
    that arrived during the step before, so its mean is TPOT = t_d / (1 - rho_x) and its variance
    lambda TPOT E[x^2] / (1 - rho_x^2). A prompt arrives in a length-biased step T (mean
    E[T^2] / E[T]), waits out a uniform share U of it, then runs in the next step with the rho_x T
    of prompts that arrived meanwhile: TTFT = (U + rho_x) T + t_d + x. The quantile takes U and T at
    the percentile together (conservative).
    """
    var = np.where(rho_x < 1, lam * tpot * x_mean**2 * (1 + x_cv2) / np.maximum(1 - rho_x**2, 1e-9), np.inf)
    lb_mean = tpot + var / np.maximum(tpot, 1e-12)
    lb_q = lb_mean + z_score(p) * np.sqrt(var)
    return lb_mean * (0.5 + rho_x) + t_d + x_mean, lb_q * (p + rho_x) + t_d + x_q


def _scale(pm: PoolModel, w: Workload, q) -> np.ndarray:
    """Prompt-length quantile over the mean prompt at levels ``q`` (clipped to 0.5 ... 0.999)."""
    qs = np.clip(np.asarray(q, dtype=float), 0.5, 0.999)
    if w.isl.cv == 0 and w.isl.samples is None:
        return np.ones_like(qs)
    grid = np.linspace(0.5, 0.999, 24)
    ratios = np.array([w.isl.quantile(float(g)) / w.isl.mean for g in grid])
    return np.interp(qs, grid, ratios)
