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

import functools
from dataclasses import dataclass

import numpy as np

from hardware_db.schema import ModelSpec

from .. import formulas as f
from .base import (
    ATTAINMENT_LEVELS,
    Deployment,
    GridLookup,
    ModeArrays,
    PoolModel,
    PoolRows,
    PrefillService,
    SlotQueue,
    batch_grid,
    coarse_first_root,
    decreasing_root,
    full_batch_tpot_quantile,
    gap_amplification,
    grid_take,
    interp_rows,
    mixture_quantile,
    seen,
    step_wait,
    tpot_tail,
    z_score,
)
from .disaggregated import hybrid_bulk_wait
from .workload import Length, Workload, running_context


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float, pm: PoolModel | None = None,
            joint: bool = False) -> ModeArrays:
    pool = d.pool
    assert pool is not None
    pm = pm or PoolModel.build(model, pool, w)
    a = analyse_budgets(pm, w, np.asarray(total_rate, dtype=float).reshape(-1), p, np.array([float(d.chunk_tokens)]),
                        pool.engines, joint=joint)
    return first_row(a)


def first_row(a: ModeArrays) -> ModeArrays:
    """The arrays of the first budget (row) of a (budgets x rates) result."""
    return ModeArrays(*(None if x is None else np.asarray(x)[0] for x in a.__dict__.values()))


def _tables(rows: PoolRows, ctx: float, grid_limit, limits, pieces, prompts_new, cached: float
            ) -> dict[str, np.ndarray]:
    """``PoolModel.chunked_tables`` of every row from its own pool: one grid where one pool owns them all,
    else a grid per row (rows x points) beside the tables."""
    if len(rows.pools) == 1:
        return rows.pools[0].chunked_tables(ctx, float(grid_limit[0]), limits, pieces, prompts_new, cached)
    parts = [(ix, pm.chunked_tables(ctx, float(grid_limit[ix[0]]), limits[ix], pieces[ix], prompts_new, cached))
             for pm, ix in rows.groups]
    out = {}
    for name in parts[0][1]:
        first = parts[0][1][name]
        table = np.empty((rows.owner.size, first.shape[-1]))
        for ix, t in parts:
            table[ix] = t[name]
        out[name] = table
    return out


def analyse_budgets(pm: PoolModel | PoolRows, w: Workload, total_rate: np.ndarray, p: float, chunks: np.ndarray,
                    instances: int, whole_prompts: bool | np.ndarray = False, joint: bool = False) -> ModeArrays:
    """Steps that carry every running decode plus prompt tokens, for several token budgets at once:
    arrays of (budgets x rates). ``pm`` is one pool model, or several (``PoolRows``: one per budget row,
    each row as its pool alone would give it).

    Chunked (Sarathi): a prompt is cut into pieces of C - B tokens. With ``whole_prompts`` (the
    hybrid scheduler with chunking off) a prompt is one piece however long, so C only bounds how
    many prompts share a step; ``whole_prompts`` may be one flag per budget (a plan analyses the
    hybrid mixed mode and every chunk budget in one call). ``total_rate`` is one array of rates for
    every budget, or one row of rates per budget.
    """
    lam = np.atleast_2d(np.asarray(total_rate, dtype=float) / instances)
    chunks = np.asarray(chunks, dtype=float)
    pm = PoolRows.of(pm, chunks.size)
    cached = w.isl.mean * w.prefix_hit
    isl_new = w.isl.mean - cached
    isl_q_new = w.isl.quantile(p) * (1 - w.prefix_hit)
    ctx = running_context(w)
    grid_limit = pm.column(lambda m: m.batch_limit(w))[:, 0]
    ranks = pm.column(lambda m: float(m.pool.coupled_ranks))  # attention-DP ranks that wait for each other's prompts
    coupled = bool(np.any(ranks > 1))
    whole = np.broadcast_to(np.asarray(whole_prompts, dtype=bool), chunks.shape)
    pieces = np.where(whole, max(isl_q_new, isl_new, w.isl.max) + grid_limit + 2, chunks)
    limits = np.where(whole, grid_limit, np.minimum(grid_limit, chunks - 1.0))
    limit = limits[:, None]
    tab = _tables(pm, ctx, grid_limit, limits, pieces, (isl_new, isl_q_new), cached)
    grid = tab["grid"]

    # TPOT(B) on the grid (``busy_tpot``), then the least root of B = lambda osl TPOT(B)
    lam3 = lam[..., None]
    cv2 = w.isl.cv**2
    ca2 = w.arrival_cv**2
    seen_table = seen(grid, tab["decode_only"], 1 / ranks[:, 0])  # the step a decoding request sees: t_d(B + 1)
    row_ix = np.arange(chunks.size)[:, None, None]

    def excess(cols: np.ndarray) -> np.ndarray:
        """g(B) = B - lambda osl TPOT(B) at the grid columns ``cols`` ((W,) or budgets x rates x W)."""
        b = grid_take(grid, cols)
        t_d_g, s_g, k_g, full_g, seen_g = (t[row_ix, cols] for t in (
            tab["decode_only"], tab["prefill_0"], tab["iters_0"], tab["full"], seen_table))
        room_g = np.maximum(pieces[:, None, None] - b, 1.0)
        work_g, t_b_g = _busy_steps(whole[:, None, None], isl_new, room_g, s_g, full_g, k_g, lam3)
        x_g = s_g - k_g * t_d_g
        holds_g = _whole_prompts_a_step(whole[:, None, None], chunks[:, None, None], b, isl_new)
        lam_start, own_g = lam3, s_g
        tpot_g = busy_tpot(lam3, b, seen_g, lam3 * x_g, work_g, t_b_g, cv2, ca2)
        if coupled:  # the rows whose ranks wait for each other's prompts, alone (the others are as computed)
            shape = np.broadcast_shapes(np.shape(tpot_g), np.shape(lam3), np.shape(s_g))
            tpot_g, lam_start, own_g = (np.array(np.broadcast_to(a, shape)) for a in (tpot_g, lam3, s_g))
            ranks_dp = np.broadcast_to((ranks > 1)[..., None], shape)

            def sub(a: np.ndarray) -> np.ndarray:
                return np.broadcast_to(a, shape)[ranks_dp]

            n_g = sub(ranks[..., None])
            dps_g = DPSteps.of(sub(lam3 * work_g), sub(seen_g), sub(t_b_g), n_g, sub(holds_g))
            tpot_g[ranks_dp] = busy_tpot(sub(lam3), sub(b), sub(seen_g), sub(lam3 * x_g), sub(work_g), sub(t_b_g), cv2,
                                         ca2, ranks=n_g, holds=sub(holds_g), dps=dps_g)
            # the prompts of every rank queue behind a request's own step, which lasts as the busiest rank's
            lam_start[ranks_dp] = sub(lam3) * dps_g.stall_factor
            own_g[ranks_dp] = sub(s_g) + np.maximum(dps_g.busy_step_s - dps_g.t_b, 0.0)
        one_step_g = whole[:, None, None] | (2 * isl_new <= room_g)  # a prompt runs in one step
        # only the rows where some prompt runs in one step have a start stall (it is 0 elsewhere)
        some = one_step_g.any(axis=(1, 2))
        if some.all():
            tpot_g = tpot_g + _bulk_start(one_step_g, lam_start, x_g, own_g, tpot_g, w, variance=False)[0]
        elif some.any():
            tpot_g = np.array(tpot_g)
            tpot_g[some] = tpot_g[some] + _bulk_start(*(np.broadcast_to(a, (chunks.size, *a.shape[1:]))[some] for a in (
                one_step_g, lam_start, x_g, own_g, tpot_g)), w, variance=False)[0]
        return b - lam3 * w.osl.mean * tpot_g

    batch = coarse_first_root(grid, excess, upper=limit)
    b_cap = np.minimum(batch, limit)

    at = GridLookup(grid, b_cap)
    t_d, s_mean, k_mean, s_q = at(tab["decode_only"]), at(tab["prefill_0"]), at(tab["iters_0"]), at(tab["prefill_1"])
    t_full = at(tab["full"])
    x_mean = s_mean - k_mean * t_d  # what one prompt adds to every running decode's lifetime
    # a full batch's prompt runs beside the L - 1 other slots' decodes
    at_full = GridLookup(grid, np.broadcast_to(np.maximum(np.floor(limit) - 1, 1.0), b_cap.shape))
    x_full = at_full(tab["prefill_0"]) - at_full(tab["iters_0"]) * at_full(tab["decode_only"])
    rho_x = lam * x_mean
    room = np.maximum(pieces[:, None] - b_cap, 1.0)
    wh = whole[:, None]
    work_s, t_b = _busy_steps(wh, isl_new, room, s_mean, t_full, k_mean, lam)
    slope = interp_rows(grid, tab["decode_only"], b_cap + 1) - t_d
    holds = _whole_prompts_a_step(wh, chunks[:, None], b_cap, isl_new)
    # the step a decoding request sees: one sequence more, a rank's share of it where the ranks step together
    seen_s = t_d + slope if not coupled else interp_rows(grid, tab["decode_only"], b_cap + 1 / ranks)
    dp = DPSteps.of(np.where(ranks > 1, lam * work_s, 0.0), seen_s, t_b, ranks, holds) if coupled else None
    tpot = busy_tpot(lam, b_cap, seen_s, rho_x, work_s, t_b, cv2, ca2, ranks=ranks, holds=holds, dps=dp)
    gap_tpot = tpot  # the mean gap between steps; a request's TPOT adds its start behind its own step
    fits = wh | (2 * isl_new <= room)  # a prompt runs in one step (two fit a step: they batch like whole ones)
    lam_start, own_start = lam, s_mean
    if dp is not None:  # every rank's prompts queue behind a request's own step, which lasts as the busiest rank's
        lam_start = np.where(ranks > 1, lam * dp.stall_factor, lam)
        own_start = s_mean + np.where(ranks > 1, np.maximum(dp.busy_step_s - dp.t_b, 0.0), 0.0)
    start_stall, start_var = _bulk_start(fits, lam_start, x_mean, own_start, tpot, w, cv2)
    tpot = tpot + start_stall
    # whole prompts: one step each, queued ones share a step when the budget holds two; chunked: C - B
    # tokens a step (two prompts that fit a step batch like whole ones), and a prompt that queued
    # starts in its predecessor's last step (half a step on average)
    pieces = np.where(wh, 1.0, isl_new / room)
    # a step that carries a piece is a full chunk's (the part-filled last chunks count in the busy time, not here:
    # the full chunks' gaps alone exceed 1 - p where a p-quantile ITL is a chunk's step)
    piece_s = np.where(fits, s_mean, t_full)
    batched = np.where(wh, (chunks >= 2 * w.isl.mean)[:, None], fits)
    s_queued = np.where(fits, s_mean, (pieces + 0.5) * t_full)
    s_queued_q = np.where(fits, s_q, (isl_q_new / room + 0.5) * t_full)
    # a full batch's prompts run alone beside its decodes (one starts per departure): a chunked one takes
    # ceil(n / room) steps at the full batch's room, averaged over the prompt lengths
    vals, weights = w.isl.points()
    room_full = np.maximum(chunks - np.maximum(np.floor(limits) - 1, 0.0), 1.0)  # beside the L - 1 others' decodes
    steps_full = _mean_pieces(vals * (1 - w.prefix_hit), weights, room_full)
    own_steps = np.where(wh, 1.0, np.maximum(steps_full, 1.0)[:, None])
    return single_pool_arrays(pm, w, lam, p, batch, limit, t_d, tpot, rho_x, lam * work_s, x_mean, work_s, s_mean,
                              s_q, slope, piece_s=piece_s, own_steps=own_steps, queued_s=(s_queued, s_queued_q),
                              shared_steps=np.broadcast_to(batched, s_mean.shape),
                              per_step=np.floor(np.maximum(chunks[:, None] - b_cap, 1.0) / max(isl_new, 1.0)),
                              stall_gap_share=lam * pieces * gap_tpot, batched=batched,
                              interference=np.where(wh, "prefill interference", "prefill chunks"), joint=joint,
                              prompt_s=lambda q: s_mean * pm.column(lambda m: _prefill_ratio(m, w, q)), x_full=x_full,
                              start_variance=start_var, dp=dp, ranks=ranks)


SAMPLE_BLOCK = 1 << 16
"""Elements per block of a (rows x length samples) table: 20,000 samples over the 576 configurations of the largest
allowed plan would be ~92 MB a temporary (several at once); blocks of 64 Ki elements bound that to 0.5 MB each. The
result is the same row by row (each row's sum is taken alone either way)."""


def _mean_pieces(new_tokens: np.ndarray, weights: np.ndarray, room: np.ndarray) -> np.ndarray:
    """E[ceil(n / room)] per row of ``room``, over prompt lengths ``new_tokens`` with probabilities ``weights``: the
    steps a prompt takes in pieces of ``room`` tokens (in row blocks of ``SAMPLE_BLOCK`` elements)."""
    rows = max(1, SAMPLE_BLOCK // max(new_tokens.size, 1))
    return np.concatenate([(weights * np.ceil(new_tokens / room[i:i + rows, None] - 1e-9)).sum(axis=1)
                           for i in range(0, room.size, rows)]) if room.size else np.zeros(0)


def _whole_prompts_a_step(whole, budget, batch, new_tokens: float) -> np.ndarray:
    """Whole prompts a step takes beside ``batch`` decodes within its token ``budget`` (at least the first one),
    where prompts run whole; 0 where they run in chunked pieces (``DPSteps.of``'s ``holds``)."""
    return np.where(whole, np.maximum(np.floor((budget - batch) / max(new_tokens, 1.0)), 1.0), 0.0)


def _bulk_start(one_step, lam, x, own_s, tpot, w: Workload, x_cv2: float = 0.0, variance: bool = True
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """(mean, variance) that prompts run whole in the decodes' steps add to a request's TPOT because it
    starts decoding right after its own prompt's step (``bulk_start_stall``, ``bulk_start_variance``): the
    prompts that arrived during that step run in the next one. ``one_step``: where a prompt runs in one
    step (whole prompts; chunks with room for two prompts); ``x``: what one prompt adds to every running
    decode; ``own_s``: the step that carries the request's prompt. Zero where prompts span several chunks;
    the variance None unless asked for."""
    rho = lam * x
    ok = one_step & np.isfinite(tpot) & (rho < 1)
    rho = np.where(ok, rho, 0.0)
    own = np.where(ok, np.maximum(own_s, tpot), 0.0)
    mean = f.bulk_start_stall(TPOT=np.where(ok, tpot, 0.0), b_n=gap_amplification(w, rho), rho_p=rho, t_own=own)
    if not variance:
        return np.where(ok, mean, 0.0), None
    var = f.bulk_start_variance(**{"E_X2": x**2 * (1 + x_cv2), "b_n2": gap_amplification(w, rho, 2), "lambda": lam,
                                   "t_own": own})
    return np.where(ok, mean, 0.0), np.where(ok, var, 0.0)


def _prefill_ratio(pm: PoolModel, w: Workload, q: float) -> float:
    """Prefill time of the q-quantile prompt over the mean prefill time (batch-1 roofline)."""
    return PrefillService.of(pm, w, q).quantile_s / PrefillService.of(pm, w, q).mean_s


def _busy_steps(whole, isl_new: float, room, s, t_full, steps, lam) -> tuple[np.ndarray, np.ndarray]:
    """(time one prompt keeps the prompt queue busy, duration of a busy step), s. Whole prompts (or
    chunked prompts short enough that two share a step) take their own step S; longer chunked prompts
    take their k = ``steps`` steps S, of which the part-filled last is shared with the next prompt where
    one waits: n / (C - B) full steps of ``t_full`` when prompts queue back to back
    (``chunked_last_step_shared``, ``chunked_prompt_busy``, ``chunked_prompt_steps``)."""
    fits = whole | (2 * isl_new <= room)
    if np.all(fits):  # (a chat plan's grids: no prompt spans chunks)
        return s, s
    args = {"S_k": s, "lambda": lam, "n_c": isl_new / room, "t_C": t_full, "k_it": steps}
    args["P_sh"] = f.chunked_last_step_shared(args)
    work = f.chunked_prompt_busy(args)
    return np.where(fits, s, work), np.where(fits, s, work / np.maximum(f.chunked_prompt_steps(args), 1e-12))


def busy_tpot(lam, batch, t_d, rho_x, work_s, t_b, cv2: float, ca2: float = 1.0, ranks=1.0,
              prompt_step_s=None, holds=0.0, dps: DPSteps | None = None) -> np.ndarray:
    """Mean TPOT as requests see it (``token_weighted_tpot``): the prompt queue is busy a share
    rho_b = lambda S_w of the time, and while it is the batch runs ``busy_batch_rise`` higher (more so
    for bursty arrivals, ``ca2`` > 1); inf where the prompts or their stalls saturate the instance.

    ``ranks`` > 1: attention data-parallel ranks that step together, each with its own prompts (``DPSteps``):
    the rank's decodes wait for every rank's prompt steps; ``holds``: the whole prompts a step takes (0 for
    chunked pieces). ``prompt_step_s``: where the steps that carry prompts emit no decode token (``t_b``
    infinite: prompt-only steps), their duration. ``dps``: the ranks' steps where the caller has them."""
    rho_b = lam * work_s
    ok = (rho_b < 1) & (rho_x < 1)
    rho_b = np.where(ok, rho_b, 0.0)
    rise = f.busy_batch_rise(**{"lambda": lam, "S_w": work_s, "c_s2": cv2, "rho_b": rho_b, "c_a2": ca2})
    rise = np.minimum(np.where(ok, rise, 0.0), batch)
    b = np.maximum(batch, 1e-9)
    tpot = f.token_weighted_tpot(B=b, Delta_B=rise, rho_b=rho_b, t_b=t_b, t_d=t_d)
    ranks = np.asarray(ranks, dtype=float)
    if np.any(ranks > 1):  # the rank's own figure times what the other ranks' prompt steps add to a token's time
        alone = f.token_weighted_tpot(B=b, Delta_B=0.0, rho_b=rho_b, t_b=t_b, t_d=t_d)
        if dps is None:
            dps = DPSteps.of(rho_b, t_d, t_b if prompt_step_s is None else prompt_step_s, ranks, holds)
        coupled = dps.mean_step_s if prompt_step_s is None else dps.mean_step_s / np.maximum(1 - dps.own, 1e-12)
        tpot = np.where(ranks > 1, tpot * np.where(alone > 0, coupled / np.maximum(alone, 1e-300), 1.0), tpot)
    return np.where(ok, tpot, np.inf)


@dataclass(frozen=True)
class DPSteps:
    """The steps of one of n attention data-parallel ranks that step together and admit their own prompts
    (``Pool.coupled_ranks``): a step lasts as long as the slowest rank's, so the rank's decodes wait for
    every rank's prompt work (``dp_busy_steps``, ``dp_busiest_exceeds``, ``dp_mean_step``).
    ``own``: the share of its steps that carry its own prompt work, ``own_work`` its prompt work per step (in
    steps of one prompt's); ``any``: the share of steps that carry some rank's; ``busiest``: the busiest rank's
    prompt work per step (``any`` for chunked pieces, which a step's budget bounds; for whole prompts the mean
    count of the rank that took the most); ``mean_step_s``: the rank's mean step; ``t_b``: a step with one
    prompt's work."""

    own: np.ndarray
    own_work: np.ndarray
    any: np.ndarray
    busiest: np.ndarray
    mean_step_s: np.ndarray
    t_d: np.ndarray
    t_b: np.ndarray

    @classmethod
    def of(cls, rho_b, t_d, t_b, ranks, holds=0.0) -> DPSteps:
        """``rho_b``: the share of time the rank alone would spend in steps of ``t_b`` carrying its prompts
        (lambda S_w). ``holds``: where prompts run whole, how many a step takes (its token budget's worth, at
        least 1); 0 where they run in chunked pieces, a step's budget at most per rank. The mean step T solves
        T = t_d + (t_b - t_d) E(lambda T), E the busiest rank's prompt work per step (``dp_mean_step``)."""
        rho_b, t_d, t_b, ranks, holds = np.broadcast_arrays(
            *(np.asarray(a, dtype=float) for a in (rho_b, t_d, t_b, ranks, holds)))
        t_b = np.where(np.isfinite(t_b), np.maximum(t_b, t_d), t_d)
        per_s = np.clip(rho_b, 0.0, 1.0) / np.maximum(t_b, 1e-300)  # own prompt steps per second of steps
        whole = holds > 0
        cap = np.where(whole, np.maximum(np.floor(holds), 1.0), 1.0)

        some = bool(whole.any())
        ranks_w, cap_w = ranks[whole], cap[whole]

        def busiest_at(T) -> tuple[np.ndarray, np.ndarray]:
            mu = per_s * T
            q_any = f.dp_busy_steps(q_own=np.clip(mu, 0.0, 1.0), n_dp=ranks)  # chunked pieces
            if not some:
                return q_any, q_any
            top, any_ = np.array(q_any), np.array(q_any)
            top[whole], any_[whole] = _busiest_poisson(mu[whole], ranks_w, cap_w)  # whole prompts, on their cells
            return top, any_

        full = t_d + (t_b - t_d) * cap  # every rank takes a full step's prompts
        mean = decreasing_root(lambda T: f.dp_mean_step(t_d=t_d, q_any=busiest_at(T)[0], t_b=t_b) - T, t_d, full)
        busiest, q_any = busiest_at(mean)
        mu = per_s * mean
        own = np.where(whole, -np.expm1(-mu), np.clip(mu, 0.0, 1.0))
        return cls(own, np.where(whole, mu, own), q_any, busiest, mean, t_d, t_b)

    @property
    def busy_step_s(self) -> np.ndarray:
        """Mean duration of a step that carries some rank's prompt work (the busiest rank's)."""
        return np.where(self.any > 0, self.t_d + (self.t_b - self.t_d) * self.busiest / np.maximum(self.any, 1e-300),
                        self.t_b)

    @property
    def stall_factor(self) -> np.ndarray:
        """Prompt work the rank's decodes wait for per unit of its own (>= 1)."""
        return np.where(self.own_work > 0, np.maximum(self.busiest / np.maximum(self.own_work, 1e-300), 1.0), 1.0)

    @property
    def other_share(self) -> np.ndarray:
        """Share of the time without the rank's own prompt work spent in other ranks' prompt steps (of
        ``busy_step_s``; the rest in plain decode steps): what a prompt that finds its own queue empty may meet
        (``step_wait``'s ``other``)."""
        other = np.clip(self.any - self.own, 0.0, 1.0) * self.busy_step_s
        plain = np.clip(1 - self.any, 0.0, 1.0) * self.t_d
        return np.where(other + plain > 0, other / np.maximum(other + plain, 1e-300), 0.0)


def _busiest_poisson(mu, ranks, cap) -> tuple[np.ndarray, np.ndarray]:
    """(E[max_r min(K_r, m)], P(max_r K_r >= 1)) for n = ``ranks`` independent K_r ~ Poisson(``mu``), m = ``cap``:
    the sum over k < m of ``dp_busiest_exceeds`` with F_k the Poisson CDF (its terms past the mean's far tail,
    where F_k = 1 to double precision, add nothing)."""
    mu = np.asarray(mu, dtype=float)
    mu = np.where(np.isfinite(mu), np.maximum(mu, 0.0), 0.0)  # (cells with no finite step: their rows are unstable)
    cap = np.where(np.isfinite(cap), cap, 1.0)
    most = float(np.max(np.minimum(cap, np.ceil(mu + 12 * np.sqrt(mu) + 12)))) if mu.size else 0.0
    pmf = np.exp(-mu)
    cdf = pmf.copy()
    total = np.zeros_like(mu)
    for k in range(int(most)):
        term = np.where(k < cap, f.dp_busiest_exceeds(F_k=np.minimum(cdf, 1.0), n_dp=ranks), 0.0)
        total = total + term
        if k >= 1 and not np.any(term > 1e-16 * total):  # the rest of the tail adds nothing in double precision
            break
        pmf = pmf * mu / (k + 1)
        cdf = cdf + pmf
    return total, f.dp_busiest_exceeds(F_k=np.exp(-mu), n_dp=ranks)


def single_pool_arrays(pm: PoolModel | PoolRows, w: Workload, lam, p: float, batch, limit, t_d, tpot, rho_x, rho_prefill, x_mean,
                       work_s, s_mean, s_q, slope, piece_s, stall_gap_share, batched, interference, joint: bool,
                       prompt_s, own_steps, queued_s=None, shared_steps=None, per_step=None, x_full=None,
                       start_variance=None, dp: DPSteps | None = None, ranks=1.0) -> ModeArrays:
    """Tails, waits, utilisation and the binding resource of one instance that runs prompts and decodes.

    ``x_mean``: time one prompt adds to every running decode; ``work_s``: the time a prompt holds the
    prompt queue (its share of the steps); ``s_mean`` / ``s_q``: a prompt's own time from its first
    step to its first token (mean, p-quantile); ``piece_s``: the duration of a step that carries a
    prompt piece; ``own_steps``: how many steps that carry the decodes a prompt's own prefill takes (1 for a
    whole prompt, its pieces when chunked, 0 for a prompt step of its own); ``stall_gap_share``: the share
    of decode gaps that contain one; ``batched``: whether
    queued prompts share a step; ``queued_s``: (mean, p-quantile) of a prompt's own time when it
    queued, where that differs (chunked: it starts in its predecessor's last step); ``shared_steps``
    (bool array): whole prompts ride in the decodes' steps, up to ``per_step`` a step (the token
    budget's worth). Where a step holds two or more, a prompt's wait is bulk service for Poisson
    arrivals (``hybrid_bulk_wait``): it covers both the light load, where a prompt waits only for the
    step in progress, and the backlog near capacity, so the wait grows continuously with the rate. For
    bursty arrivals a prompt waits for the step in progress (``_step_ttft``) while a prompt step's
    arrivals fill at most half the budget's prompts and a prompt adds at most two decode steps' time,
    and queues FIFO (M/G/1 with Kingman's wait) beyond. ``start_variance``: what whole prompts queued
    behind a request's own step add to the variance of its TPOT (``_bulk_start``). ``dp`` (with ``ranks`` > 1
    where its rows' attention data-parallel ranks wait for each other's prompts, ``DPSteps``): the decodes'
    stalls (their time share, the gaps that hold one, their rate in the TPOT tail, the full batch's) count every
    rank's prompts, and a prompt that finds its own rank's queue empty waits out the step in progress, which
    may be another rank's prompt step; its own queue stays its rank's.
    """
    pools = PoolRows.of(pm, 1)  # several pool models: each row's own (``analyse_budgets``)
    other = None
    cv2 = w.isl.cv**2
    if dp is not None:
        coupled = np.asarray(ranks) > 1
        m = np.where(coupled, dp.stall_factor, 1.0)
        rho_x = rho_x * m
        stall_gap_share = np.minimum(stall_gap_share * m, 1.0)
        x_full = (x_mean if x_full is None else x_full) * m
        other = (np.where(coupled, dp.other_share, 0.0), dp.busy_step_s)
        # the step that carries a whole prompt lasts as long as the rank that took the most
        longer = np.where(coupled, np.maximum(dp.busy_step_s - dp.t_b, 0.0), 0.0)
        s_mean, s_q = s_mean + longer, s_q + longer
        # the TPOT tail: the rank's own stalls amplified by the share of every rank's (rho_x above); counting the
        # other ranks' stalls as a compound Poisson of their own as well overshot the lock-step simulation's p90 by
        # 10-25% (DeepSeek-V3 dp8 on H200, 2,000 / 200 and 2,000 / 500 tokens, docs/concepts/parallelism.md)
    stable_decode = np.isfinite(batch) & (batch < limit) & (rho_prefill < 1) & (rho_x < 1)
    b_cap = np.minimum(batch, limit)
    tpot_var, _ = tpot_tail(tpot, rho_x, lam, x_mean, cv2, w, slope, b_cap, p, extra_variance=start_variance)
    tpot_full = np.broadcast_to(full_batch_tpot(pools, w, limit, x_mean if x_full is None else x_full, own_steps),
                                np.shape(tpot))

    # TTFT: the prompt queue (M/G/1, a prompt's whole time as service), the residual of the step in
    # progress, a batch slot (KV memory / batch cap) and the prompt's own time
    life = w.osl.mean * tpot
    service = PrefillService(work_s, work_s**2 * (1 + cv2), s_q)  # type: ignore[arg-type]
    busy = None if queued_s is None else s_mean
    own_mean, own_p, shift = s_mean, s_q, None
    if queued_s is not None:
        pw = np.clip(lam * s_mean, 0.0, 1.0)
        own_mean = (1 - pw) * s_mean + pw * queued_s[0]
        # a prompt that queued starts in its predecessor's last step, wherever its room ends (a step's width,
        # ``piece_s``), so its own steps take longer; that goes with its wait (``step_wait``'s ``shift``), and
        # the p-quantile moves smoothly as more prompts queue (taking the queued own time from P_w > 1 - p on
        # made the chunked p50 jump by half: Llama-3.1-8B on an H200, 1,500 new tokens a prompt, 53.7 -> 83.2
        # ms between 10.8485 and 10.8702 req/s)
        extra = np.maximum(queued_s[0] - s_mean, 0.0)
        shift = (extra, np.where(extra > 0, np.broadcast_to(piece_s, np.shape(extra)), 0.0))
    hold = life + own_mean  # a slot is held from the prompt's first step to its last token
    life_cv2 = np.where(np.isfinite(tpot_var) & (tpot > 0), tpot_var / np.maximum(tpot, 1e-12) ** 2, 0.0)
    # the prompts stall the decodes a share rho_x of the time: the slots see the prompts of one stall busy period
    # (x / (1 - rho_x) long) arrive together where that is short beside a hold (``stall_batch_share``). That
    # carries what the stalls add to the batch's spread; a hold slope stretched by 1 / (1 - rho_x) as well counts
    # it twice (Llama-3.1-8B on an H100, 500 / 1,000 tokens at 10.6 req/s: the simulated batch's variance is 6.7x
    # its mean, the chain's 5.6x with the batches alone and 11.6x with both)
    stall = np.where(rho_x < 1, rho_x, 0.0)
    slots = SlotQueue.of(lam, batch, limit, hold, w.osl.cv**2 + life_cv2, w.osl.mean * slope,
                         full_batch_hold(pools, w, own_steps, x_mean if x_full is None else x_full, limit),
                         ca2=w.arrival_cv**2,
                         stall_share=f.stall_batch_share(rho_x=stall, x_st=x_mean, H=np.maximum(hold, 1e-12)))
    aq, ap = slots.mean_s, slots.quantile_s(p)
    # the requests that waited for a slot decode beside a full batch (``full_batch_tpot_quantile``)
    full_share = np.where(np.isfinite(slots.mean_s), slots.wait_probability, 1.0)
    tpot_p = full_batch_tpot_quantile(tpot, tpot_var, tpot_full, full_share, p)
    bulk = None
    if shared_steps is not None:
        # Poisson arrivals: bulk service wherever two prompts or more share a step. The chain counts a step's
        # arrivals as Poisson; bursty ones (Gamma gaps) queue beyond the next step, where the FIFO form with
        # Kingman's wait holds (bulk was 22% short at the p50, cv 2)
        poisson = abs(w.arrival_cv**2 - 1.0) < 1e-12
        bulk_cells = np.broadcast_to(shared_steps & stable_decode & (per_step >= 2) & poisson, np.shape(lam * t_d))
        prompt_step = t_d + x_mean * (1 + lam * tpot)
        shared_steps = (shared_steps & ~bulk_cells & (lam * prompt_step <= per_step / 2) & (x_mean <= 2 * t_d)
                        & ~poisson)
    if shared_steps is not None and bulk_cells.any():
        # the step's line in its prompts, T(k) = T0 + tau k, through one and two prompts at the running batch:
        # the decodes' weight reads hide under a compute-bound prompt, so tau exceeds x (Llama-3.1-8B on H100, a
        # 1,000-token prompt beside 21 decodes: x 22 ms, tau 26 ms)
        def two_at(m: PoolModel, lim, b) -> np.ndarray:
            grid, two = _two_prompt_table(m, w, float(np.max(np.where(np.isfinite(lim), lim, 1.0))))
            return np.interp(b, grid, two)

        tau = np.maximum(pools.map(two_at, limit, np.where(bulk_cells, b_cap, 1.0)) - s_mean, 1e-12)
        t0 = np.maximum(s_mean - tau, 0.0)
        # (a prompt that finds a slot free queues behind the starts in free time: ``SlotQueue.free_prompt_rate``)
        pw_b, theta_b, cv2_b = hybrid_bulk_wait(np.where(bulk_cells, slots.free_prompt_rate(lam), 0.0), t0, tau,
                                                per_step, w, None if len(pools.pools) == 1 else pools.owner[:, None])
        bulk = (bulk_cells, pw_b, theta_b, cv2_b, tau, per_step)
    # a prompt waits for its step or, where the slots are taken, for a slot (``with_slot_wait``)
    wq, wp = _prompt_wait(lam, service, t_d, p, batched, busy, w, slots, bulk, shift, other)
    ttft_mean = (1 - slots.wait_probability) * wq + aq + (s_mean if shift is not None else own_mean)
    ttft_p = _with_own(wq, wp, own_mean, own_p, bulk)
    if shared_steps is not None and shared_steps.any():
        step_mean, step_p = _step_ttft(lam, t_d, tpot, x_mean, cv2, rho_x, p, x_q=x_mean * _scale(pm, w, p))
        ttft_mean = np.where(shared_steps, step_mean + aq, ttft_mean)
        ttft_p = np.where(shared_steps, step_p + ap, ttft_p)
    levels = None
    if joint:
        rows = []
        for q in ATTAINMENT_LEVELS:
            _, wq_q = _prompt_wait(lam, service, t_d, float(q), batched, busy, w, slots, bulk, shift, other)
            ap_q = slots.quantile_s(float(q))
            row = _with_own(wq, wq_q, s_mean, prompt_s(float(q)), bulk)
            if shared_steps is not None and shared_steps.any():
                step_q = _step_ttft(lam, t_d, tpot, x_mean, cv2, rho_x, float(q), x_mean * _scale(pm, w, float(q)))[1]
                row = np.where(shared_steps, step_q + ap_q, row)
            rows.append(row)
        levels = np.stack(rows, axis=-2)

    # ITL: a gap is a plain decode step (its batch Poisson) unless a prompt piece rides in it
    q_stall = 1 - (1 - p) / np.maximum(stall_gap_share, 1e-12)
    plain = t_d + z_score(p) * np.sqrt(np.maximum(b_cap, 0)) * slope
    itl_p = np.where(stall_gap_share > 1 - p, piece_s * np.maximum(1.0, _scale(pm, w, q_stall)), plain)

    # utilisation: the share of each resource in use; the largest binds
    # without a batch root (the batch outgrows its slots): the slots the arrivals would hold at the TPOT of
    # a batch at the limit (no root below it: more than the limit), or where that TPOT is not finite, at
    # the plain step with the stalls' inflation while they fit
    demand = np.where(np.isfinite(tpot), lam * w.osl.mean * tpot,
                      lam * w.osl.mean * t_d / np.where(rho_x < 1, np.maximum(1 - rho_x, 1e-3), 1.0))
    occupancy = slots.occupancy(np.where(np.isfinite(batch), batch, demand) / limit)
    # decode bandwidth: the marginal sequence's step time over the time the prompts leave to the decodes
    decode_load = lam * w.osl.mean * slope / np.where(rho_x < 1, np.maximum(1 - rho_x, 1e-3), 1.0)
    # the prompts: the time share their extra work takes from the decodes (rho_x), and the prompt queue's own
    # load (rho_prefill: lambda x the steps' time a prompt holds it, decode share included), stable below 1
    stacked = np.stack(np.broadcast_arrays(rho_x, decode_load, occupancy, rho_prefill))
    stacked = np.where(np.isfinite(stacked), stacked, 1e9)
    util = stacked.max(axis=0)
    which = np.argmax(stacked, axis=0)
    binding = np.where((which == 0) | (which == 3), np.broadcast_to(interference, which.shape).astype(object),
                       np.where(which == 1, "decode bandwidth",
                                _slot_resource(pools, w)))
    stable = stable_decode & (util < 1)
    inf = np.inf
    return ModeArrays(
        stable, util, np.where(stable, ttft_mean, inf), np.where(stable, ttft_p, inf), np.where(stable, tpot, inf),
        np.where(stable, tpot_p, inf), batch, np.zeros_like(batch), binding, np.where(stable, tpot_var, inf),
        np.where(stable, itl_p, inf), None if levels is None else np.where(stable[..., None, :], levels, inf),
        np.where(stable, tpot_full, inf), np.where(stable, full_share, 1.0),
    )


def _slot_resource(rows: PoolRows, w: Workload):
    """What limits the batch: "batch cap" where the engine's cap is at or below the KV memory's limit, else
    "KV memory" (a string for one pool model, a (rows, 1) column for several)."""
    def name(m: PoolModel) -> str:
        return "batch cap" if m.batch_cap <= m.kv_limit(w) else "KV memory"

    if len(rows.pools) == 1:
        return name(rows.pools[0])
    return np.array([name(m) for m in rows.pools], dtype=object)[rows.owner][:, None]


def _two_prompt_table(pm: PoolModel, w: Workload, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """(batch grid, s): a step that carries two whole mean prompts beside B running decodes, over the batch
    grid up to ``limit`` (``PoolModel.two_prompt_table``)."""
    cached = w.isl.mean * w.prefix_hit
    return pm.two_prompt_table(running_context(w), w.isl.mean - cached, cached, limit)


def _with_own(wait_mean, wait_q, own_mean, own_q, bulk) -> np.ndarray:
    """A quantile of a prompt's wait plus its own time, s: ``wait_plus_own_quantile`` where the wait is bulk
    service (``bulk``'s cells), the sum of the quantiles elsewhere (the FIFO forms' own-time quantile is their
    service's). Against the simulation (Llama-3.1-8B, H100 unless shown), p90 / p99 TTFT:

    ==============================================  =================  ===========  ===========  =============
    case                                            sum of quantiles   quadrature   halfway      simulated
    ==============================================  =================  ===========  ===========  =============
    grid chat, prompts cv 0.5, mixed, 17.6 req/s    62.9 ms            55.6         59.3         58.1
    grid chat, 23.4 req/s                           81.3               73.2         77.3         77.4
    prompts 1,000 cv 0.8, 2 instances, 30 req/s     134.8 / 302        116.4 / 240  125.6 / 271  126 / 272
    A100 chunked, prompts 300 cv 0.6, osl 50        120.4              107.4        113.9        115.8
    ==============================================  =================  ===========  ===========  =============

    (simulated: the grid's 3 seeds of 12,000 requests; 3 of 12,000 for the third; 3 of 8,000 for the last.)"""
    plain = wait_q + own_q
    if bulk is None:
        return plain
    both = f.wait_plus_own_quantile(w_mean=wait_mean, w_p=wait_q, s_mean=own_mean, s_p=own_q)
    return np.where(bulk[0], both, plain)


def _prompt_wait(lam, service, t_d, p: float, batched, busy, w: Workload, slots, bulk, shift=None, other=None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, p-quantile) of a prompt's wait for its step (``step_wait``): bulk service where whole prompts
    share the decodes' steps (``bulk``, Poisson arrivals, two prompts a step or more), else the FIFO queue
    (M/G/1 stretched by 1 + rho for the prompts that join a queued one's step).

    Against the simulation (Llama-3.1-8B on one H100, the median of 3 seeds of 8,000 requests), bulk service
    is within -11% ... +9% at the p90 up to 0.96 of capacity with two to six prompts a step
    (docs/serving-validation.md, "Regime switches"), where the FIFO form, which counts each prompt as a
    whole step, read 9 times the simulated p90 near capacity (800-token prompts at 26 req/s: 1.78 s against
    0.20 s) and the step-in-progress form was up to 24% short. (A blend of the two from three prompts a
    step jumped from 0.11 s to 3.6 s between two rates 0.001 req/s apart.)"""
    # each form where it is taken: the FIFO one on every cell, or on those that are not bulk service
    fifo_q = None if bulk is not None and np.all(bulk[0]) else step_wait(
        lam, service, t_d, p, batched, busy, ca2=w.arrival_cv**2, slots=slots, shift=shift,
        cells=None if bulk is None else ~np.asarray(bulk[0], dtype=bool), other=other)
    if bulk is None:
        return fifo_q  # type: ignore[return-value]
    bulk_q = step_wait(lam, service, t_d, p, batched, busy, ca2=w.arrival_cv**2, slots=slots, bulk=bulk,
                       cells=None if fifo_q is None else np.asarray(bulk[0], dtype=bool), other=other)
    if fifo_q is None:
        return bulk_q
    return tuple(np.where(bulk[0], b, a) for a, b in zip(fifo_q, bulk_q))  # type: ignore[return-value]


def full_batch_tpot(pm: PoolModel | PoolRows, w: Workload, limit, x_full, own_steps=1.0) -> np.ndarray:
    """The largest TPOT a request can see when the batch is capped (KV memory or max_batch): the batch held
    full at L = floor(limit) sequences through its lifetime (``formulas.full_batch_tpot``). A prompt then starts
    only when a sequence leaves, so about (L - 1) / osl prompts land per output token, each adding ``x_full``
    (in ``own_steps`` pieces where it spans several steps: then at most every step carries one). t_d(L) is
    read from the step curve as ``full_batch_hold`` reads it (the tangent at the mean batch overshot it on a
    concave MoE curve: 22.0 ms from B = 1 against 18.3 ms, so the ceiling fell as the load rose). It bounds the
    lognormal tail, which has no ceiling."""
    full = np.maximum(np.floor(limit), 1.0)
    t_full = PoolRows.of(pm, 1).decode_steps(running_context(w), w, full)  # several pools: each row's own
    return f.full_batch_tpot(t_d=t_full, L_full=full, x_f=x_full, k_own=own_steps, n_out=w.osl.mean)


def full_batch_hold(pm: PoolModel | PoolRows, w: Workload, own_steps, x_full, limit) -> np.ndarray:
    """How long a request holds its slot while the batch runs full (s): ``formulas.full_batch_hold`` at
    L = floor(limit) slots, ``own_steps`` prefill steps that carry the decodes and a stall ``x_full`` per
    prompt, with the decode step linear about the full batch (t_d(L), t_d(L) - t_d(L - 1))."""
    full = np.maximum(np.floor(limit), 1.0)
    steps, ctx = PoolRows.of(pm, 1), running_context(w)  # several pools: each row's own step curve
    t_full = steps.decode_steps(ctx, w, full)
    slope_full = t_full - steps.decode_steps(ctx, w, np.maximum(full - 1, 0.5))
    return f.full_batch_hold(k_own=own_steps, n_out=w.osl.mean, t_d=t_full, t_slope=slope_full, L_full=full, B=full,
                             x_f=x_full)


def _step_ttft(lam, t_d, tpot, x_mean, x_cv2: float, rho_x, p: float, x_q) -> tuple[np.ndarray, np.ndarray]:
    """(mean, p-quantile) of TTFT when whole prompts join the decodes' steps (bulk service).

    A step lasts t_d plus x per prompt in it and takes every prompt that arrived during the step
    before, so there is no queue beyond one step: steps just lengthen (mean TPOT = t_d / (1 - rho_x)).
    A prompt step holds K = 1 + lambda TPOT prompts on average and lasts T_p = t_d + x K; prompt
    steps take the share pi = lambda T_p / K of the time. An arrival finds a decode step (prob.
    1 - pi) and waits a uniform part of t_d, or a prompt step and waits its length-biased residual
    (taken as exponential). Its own step then holds every prompt that arrived during the step it
    found: t_d + x (1 + lambda T), T = t_d or the length-biased T_lb (the prompts that arrived in it
    before this one shift both branches by their pi-weighted mean; those after it stretch the
    exponential residual).
    """
    k = 1 + lam * tpot
    t_p = t_d + x_mean * k
    var_p = x_mean**2 * (lam * tpot * (1 + x_cv2) + x_cv2)
    t_lb = t_p + var_p / np.maximum(t_p, 1e-12)
    pi = np.clip(lam * t_p / k, 0.0, 0.999)
    theta = t_lb / 2 * (1 + lam * x_mean)
    ok = rho_x < 1
    own = t_d + lam * x_mean * ((1 - pi) * t_d + pi * t_lb / 2)
    mean = (1 - pi) * t_d / 2 + pi * theta + own + x_mean
    # the rest of a prompt step: near uniform when its length varies little (``residual_cv2``)
    shape = f.residual_cv2(c_s2=var_p / np.maximum(t_p, 1e-12) ** 2)
    q = mixture_quantile(pi, theta, t_d, p, shape) + own + x_q
    return np.where(ok, mean, np.inf), np.where(ok, q, np.inf)


def _scale(pm: PoolModel, w: Workload, q) -> np.ndarray:
    """Prompt-length quantile over the mean prompt at levels ``q`` (clipped to 0.5 ... 0.999)."""
    qs = np.clip(np.asarray(q, dtype=float), 0.5, 0.999)
    if w.isl.cv == 0 and w.isl.samples is None:
        return np.ones_like(qs)
    return np.interp(qs, SCALE_LEVELS, _quantile_ratios(w.isl))


SCALE_LEVELS = np.linspace(0.5, 0.999, 24)


@functools.lru_cache(maxsize=256)
def _quantile_ratios(length: Length) -> np.ndarray:
    """A length's quantiles at SCALE_LEVELS over its mean (a plan reads them for every configuration)."""
    if length.samples is not None:
        return np.quantile(np.asarray(length.samples, dtype=float), SCALE_LEVELS) / length.mean
    return np.array([length.quantile(float(g)) for g in SCALE_LEVELS]) / length.mean
