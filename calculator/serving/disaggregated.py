"""Prefill/decode disaggregation (DistServe / Splitwise / Mooncake style), xPyD pools.

Prefill pool: N_p instances share one queue; a free instance runs every waiting prompt up to the
token budget in one step (``prefill_batch``), which shares the weight reads: bulk service, a queue
one step deep, where the budget holds many prompts, and a FIFO M/G/c queue where it holds few
(``prefill_wait``).
KV transfer: the request's whole cache (isl tokens, all layers) crosses min(tp_p, tp_d) parallel
links of the chosen kind (scale-out NIC between nodes, or the scale-up link inside one); with
layer-wise overlap only what outlasts the prefill (and at least one layer's share) is visible.
  TTFT = prefill (wait + step) + t_kv + W_slot + t_d / 2 (the decode instance takes it at its next step)
Decode pool: each instance sees lambda / N_d; B = lambda_d osl t_d(B) (least fixed point); a request
waits for a batch slot (KV memory or the batch cap: ``base.SlotQueue``);
TPOT = t_d(B), its tail from the spread of the batch over a lifetime (``base.tpot_tail``), at most
the step of a full batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from statistics import NormalDist

import numpy as np

from hardware_db.schema import ModelSpec

from .. import budget
from .. import formulas as f
from ..kv_cache import kv_cache_bytes
from ..phases import pair_link_bytes_per_s
from .base import (
    ATTAINMENT_LEVELS,
    BISECTION_STEPS,
    Deployment,
    ModeArrays,
    PoolModel,
    PoolRows,
    PrefillService,
    SlotQueue,
    _erf,
    decode_fixed_batches,
    decode_fixed_point,
    decode_load,
    decreasing_root,
    erlang_c,
    excess_sum,
    first_root,
    full_batch_tpot_quantile,
    gamma_arrival_wait_probability,
    interp_rows,
    product_form_step_moments,
    quantile_table_tail,
    queue_wait,
    tpot_tail,
    with_slot_wait,
    z_score,
)
from .workload import Workload, running_context


def kv_transfer_s(model: ModelSpec, d: Deployment, w: Workload, pre: PoolModel, dec: PoolModel, prefill_s: float) -> float:
    """Visible KV move time of a mean request from the prefill to the decode pool."""
    assert d.prefill is not None and d.decode is not None
    kv_bytes = float(kv_cache_bytes(model, w.isl.mean, d.decode.kv_dtype, tp=d.decode.tp))
    return kv_move_s(model, kv_bytes, pre, dec, d.kv_link, d.layerwise_kv_overlap, prefill_s)


def kv_move_s(model: ModelSpec, kv_bytes: float, pre: PoolModel, dec: PoolModel, kv_link: str, layerwise: bool,
              prefill_s: float) -> float:
    """``kv_bytes`` (what the decode instance's GPUs hold together: every tensor-parallel rank needs
    its own copy of an MLA latent, or of a KV head when tp exceeds the KV heads) over min(tp_p, tp_d) parallel links (NIC or scale-up) with the link efficiency and
    one collective latency; with layer-wise overlap, only what outlasts the prefill (>= one layer)."""
    links = min(pre.pool.tp * pre.pool.cp, dec.pool.tp * dec.pool.cp)
    if kv_link == "scaleup":  # GPU to GPU: one pair's link (a full mesh's direct link)
        per_link = min(pair_link_bytes_per_s(pre.gpu), pair_link_bytes_per_s(dec.gpu))
    else:
        per_link = min(pre.gpu.scaleout_bytes_per_s, dec.gpu.scaleout_bytes_per_s)
    eff = pre.gpu.efficiency
    t = float(f.kv_transfer_time(Q=kv_bytes, beta_link=per_link * links, eta_l=eff.link,
                                 alpha=eff.collective_latency_us * 1e-6))
    if layerwise:
        per_layer = t / model.num_layers
        return max(per_layer, t - prefill_s * (model.num_layers - 1) / model.num_layers)
    return t


def step_table(pre: PoolModel | PoolRows, w: Workload, budget_tokens: int) -> tuple[float, np.ndarray, np.ndarray]:
    """(most prompts a step holds, batch grid, prefill step time s over it) for the mean prompt:
    piecewise linear in the batch, on a geometric grid from 1 to the token budget's worth. Cached. For several
    pool models (``PoolRows``) a table per row (rows x grid); the grid is the budget's alone."""
    if isinstance(pre, PoolRows):
        parts = [step_table(m, w, budget_tokens) for m in pre.pools]
        if len(parts) == 1:
            return parts[0]
        return parts[0][0], parts[0][1], np.stack([t for _, _, t in parts])[pre.owner]
    most = max(1.0, math.floor(budget_tokens / w.isl.mean))
    cached = w.isl.mean * w.prefix_hit
    return most, *pre.prefill_batch_table(w.isl.mean - cached, cached, most)


def prefill_batch(pre: PoolModel | PoolRows, w: Workload, lam_server, budget_tokens: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(mean prompts per prefill step, that step's time) at each per-instance arrival rate.

    A step takes every prompt that arrived while the step before it ran, or, when none did, the one
    that then arrives to the idle instance: with N ~ Poisson(lambda T(b)) arrivals per step the mean
    batch is E[max(N, 1)] = lambda T(b) + exp(-lambda T(b)) (``prefill_step_batch``), a fixed point
    in b (T grows with b), up to the token budget. Batching shares the weight reads, so a queue
    builds more slowly than at batch 1."""
    most, grid, table = step_table(pre, w, budget_tokens)
    lam = np.asarray(lam_server, dtype=float)
    if table.ndim == 2:  # a table per row (``PoolRows``): ``lam`` is (rows, ...)
        arrivals = lam[..., None] * table.reshape(table.shape[0], *([1] * (lam.ndim - 1)), grid.size)
        b = first_root(grid, grid - np.asarray(f.prefill_step_batch(N_a=arrivals), dtype=float))
        b = np.clip(np.where(np.isfinite(b), b, most), 1.0, most)
        return b, interp_rows(grid, table, b.reshape(table.shape[0], -1)).reshape(b.shape)
    arrivals = lam.reshape(-1)[:, None] * table[None, :]
    gap = grid[None, :] - np.asarray(f.prefill_step_batch(N_a=arrivals), dtype=float)
    b = first_root(grid, gap)
    b = np.clip(np.where(np.isfinite(b), b, most), 1.0, most).reshape(lam.shape)
    return b, np.interp(b, grid, table)


def prefill_capacity(pre: PoolModel, w: Workload, budget_tokens: int) -> float:
    """Prompts per second one prefill instance can take: full steps of the token budget's worth of
    mean prompts (one prompt a step when two do not fit), b / T(b)."""
    _, grid, table = step_table(pre, w, budget_tokens)
    return float(grid[-1] / table[-1]) if budget_tokens >= 2 * w.isl.mean else float(1 / table[0])


def prefill_wait(pre: PoolModel | PoolRows, w: Workload, lam_total, servers, budget_tokens: int, levels
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Arrival to the end of its prefill in a pool of ``servers`` instances whose steps batch prompts:
    (mean, quantiles at ``levels`` (last axis), the pool's busy share, the mean step time), seconds.

    Steps are bulk service: a step takes every prompt that arrived during the step before
    (``prefill_batch``), so a queue is never more than one step deep until the token budget binds.
    On an instance of rate lambda with steps T(b) = T_0 + tau b (b prompts), a prompt that finds it
    idle runs at once, in T(1); one that finds a step of length t running waits its rest U t and then
    runs with everyone that arrived during it. So TTFT - T(1) = U t + tau S, S the N ~ Poisson(lambda t) prompts that join it (mean t (U + m),
    m = lambda tau). The step in progress t is length-biased; its moments come from the Markov chain of
    the steps' batches (``step_chain``) and the wait given a busy pool is a gamma of the exact mean and
    variance (``_bulk_wait``). Where the
    budget holds few prompts the batch is capped and a queue forms: a FIFO M/G/c queue of prompts
    served T(b) / b each, blended in by ``_bulk_share``. Several instances share one queue: an arrival
    waits when all are busy (``erlang_c`` at the busy share lambda E[T] / E[b]); instances then free up
    c times as often, so the rest it waits and the prompts that join it both shrink by c:
    TTFT - T(1) = (U t + tau S) / c. The quantile is the mixture's, by bisection, the gamma by Wilson-Hilferty.
    """
    lam_total = np.asarray(lam_total, dtype=float)
    c = np.asarray(servers, dtype=float)
    lam = lam_total / c
    levels = np.asarray(levels, dtype=float)
    b, step = prefill_batch(pre, w, lam, budget_tokens)
    busy = lam * step / b
    bulk_share = _bulk_share(w, budget_tokens)
    one = PrefillService.of(pre, w, float(levels[0]))
    per_prompt = step / b
    service = PrefillService(per_prompt, one.second_moment_s2 * (per_prompt / one.mean_s) ** 2, one.quantile_s)  # type: ignore[arg-type]
    fifo_wq, fifo_wp = queue_wait(lam_total, service, c, levels, ca2=w.arrival_cv**2)
    fifo_mean = fifo_wq + step
    fifo_q = fifo_wp + step[..., None]
    if bulk_share == 0:
        return fifo_mean, fifo_q, busy, step
    bulk_mean, bulk_q = _bulk_wait(pre, w, lam, c, budget_tokens, levels, busy)
    if bulk_share == 1:
        return bulk_mean, bulk_q, busy, step
    with np.errstate(invalid="ignore"):  # inf stays inf
        return (bulk_share * bulk_mean + (1 - bulk_share) * fifo_mean,
                bulk_share * bulk_q + (1 - bulk_share) * fifo_q, busy, step)


def _bulk_share(w: Workload, budget_tokens: int) -> float:
    """Weight of bulk service in ``prefill_wait``: a FIFO queue of prompts served T(b) / b each
    (M/G/c) where the budget holds few prompts (the batch is capped and a queue forms), bulk service
    where it holds six or more; linear in between."""
    most = max(1.0, math.floor(budget_tokens / w.isl.mean))  # as ``step_table``, without building it
    return min(max((most - 2) / 4, 0.0), 1.0)


def _step_line(pre: PoolModel | PoolRows, w: Workload, budget_tokens: int) -> tuple[float, float, float]:
    """(most prompts a step holds, T(1) s, tau s): the prefill step time as T(b) = T_0 + tau b over
    ``step_table``'s end points, tau at most T(1)."""
    most, grid, table = step_table(pre, w, budget_tokens)
    if table.ndim == 2:  # several pool models: (rows, 1) columns
        t1_rows = table[:, :1]
        tau_rows = (table[:, -1:] - t1_rows) / (grid[-1] - 1) if grid[-1] > 1 else t1_rows
        return most, t1_rows, np.minimum(tau_rows, t1_rows)  # type: ignore[return-value]
    t1 = float(table[0])
    tau = float((table[-1] - t1) / (grid[-1] - 1)) if grid[-1] > 1 else t1
    return most, t1, min(tau, t1)


TAIL_LEVELS = np.array([0.1, 0.3, 0.5, 0.7, 0.9, 0.97, 0.999])
"""Levels at which a decode instance's time before its slot wait is tabulated, for the quantile of
the two together."""

CHAIN_STATES = 64
"""Most states of ``step_chain``: batches 1 ... most prompts on a grid of at most this many points."""

BACKLOG_STATES = 64
"""Prompts followed beyond a step's budget in ``step_chain`` (at least the budget's worth): the backlog an arrival
waits behind near capacity (``_backlog_steps``); more is lumped at the last state."""

ARRIVAL_COUNTS = 256
"""Arrival counts per step that ``step_chain`` weighs one by one; a step whose arrivals reach beyond
(a queue of more than this many short prompts) takes them as a normal of the same mean and variance,
so that the work is bounded whatever the budget's worth of prompts."""


def _onto_grid(states: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lower neighbour's index, share of the upper one) of values ``x`` on the increasing grid
    ``states``, clipped to its ends: the split between neighbours that keeps the mean."""
    k = states.size
    hi = np.clip(np.searchsorted(states, x), 1, k - 1)
    share = np.clip((x - states[hi - 1]) / (states[hi] - states[hi - 1]), 0.0, 1.0)
    return hi - 1, share


def _normal_onto_grid(states: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Expected split of X ~ N(mean, sd^2), clipped to the grid's ends, between the grid's points
    (last axis): point j gets D_{j-1} - D_j with D_j = (R(s_j) - R(s_{j+1})) / (s_{j+1} - s_j),
    R(a) = E[(X - a)^+], D_{-1} = 1 and D_{k-1} = 0 (the split is piecewise linear in X)."""
    z = (states - mean[..., None]) / sd[..., None]
    tail = 0.5 * (1 - _erf(z / math.sqrt(2)))
    ramp = sd[..., None] * np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi) - z * sd[..., None] * tail
    slope = -np.diff(ramp, axis=-1) / np.diff(states)
    edges = np.concatenate([np.ones_like(ramp[..., :1]), slope, np.zeros_like(ramp[..., :1])], axis=-1)
    return np.clip(edges[..., :-1] - edges[..., 1:], 0.0, None)


@functools.lru_cache(maxsize=64)
def _arrival_split_cached(states: tuple[float, ...], full: float, counts: int) -> np.ndarray:
    grid = np.asarray(states)
    k = grid.size
    nxt = np.clip(grid[:, None] - np.minimum(grid, full)[:, None] + np.arange(counts + 1.0)[None, :], 1.0, grid[-1])
    lower, share = _onto_grid(grid, nxt)
    split = np.zeros((k, counts + 1, k))
    rows, cols = np.indices(nxt.shape)
    np.add.at(split, (rows, cols, lower), 1 - share)
    np.add.at(split, (rows, cols, np.minimum(lower + 1, k - 1)), share)
    split.flags.writeable = False
    return split


def _arrival_split(states: np.ndarray, batch: np.ndarray, counts: int) -> np.ndarray:
    """(from state, arrivals, to state): where a step from each state with n = 0 ... ``counts`` arrivals
    leaves the queue (the prompts left over plus the arrivals, at least the next arrival), split
    between the neighbouring states. It depends on the grid alone, so it is cached."""
    return _arrival_split_cached(tuple(states.tolist()), float(batch.max()), counts)


def _arrival_pmf(mu: np.ndarray, mix: np.ndarray, cv2: float, counts: int) -> np.ndarray:
    """P(N = 0 ... counts) (last axis; the rest lumped at ``counts``) of the arrivals during a step: Poisson
    of mean ``mu`` mixed by a gamma of variance ``mix`` (negative binomial), for 1-d arrays of cells. A cell
    without spread (``mix`` 0: a step whose length does not grow with its prompts) is Poisson, and one without
    arrivals (``mu`` 0) has none (both had put all the mass at ``counts``: E[b] 4 and 2 where 1 is right)."""
    n = np.arange(counts + 1, dtype=float)
    log_fact = _log_factorials(counts)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        log_pmf = np.multiply.outer(np.log(mu), n)  # Poisson: n log mu - mu - log n!
        log_pmf[:, 0] = 0.0  # n log mu is 0 at n = 0, mu 0 included
        log_pmf -= mu[:, None]
        log_pmf -= log_fact
        if cv2 > 0:
            mu, mix = mu[:, None], mix[:, None]
            r = mu**2 / mix  # the gamma's shape: where it is not a positive float the mix is Poisson to rounding
            p = mu / (mu + r)
            # log Gamma(n + r) - log Gamma(r) = sum_{i < n} log(r + i)
            rising = np.concatenate([np.zeros_like(r), np.cumsum(np.log(r + n[None, :-1]), axis=-1)], axis=-1)
            mixed = rising - log_fact + r * np.log1p(-p) + np.where(n == 0, 0.0, n * np.log(p))
            ok = (mix > 0) & (mu > 0) & np.isfinite(r) & (r > 0)
            log_pmf = np.where(ok & np.isfinite(mixed).all(axis=-1, keepdims=True), mixed, log_pmf)
        pmf = np.exp(log_pmf, out=log_pmf)
    if not np.isfinite(pmf).all():  # a NaN rate weighs nothing here (its mass goes to ``counts``)
        pmf[np.isnan(pmf)] = 0.0
    pmf[:, -1] += np.maximum(1 - pmf.sum(axis=-1), 0.0)
    return pmf


@functools.lru_cache(maxsize=16)
def _log_factorials(counts: int) -> np.ndarray:
    """log n! for n = 0 ... ``counts`` (read-only: cached)."""
    out = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, counts + 1)))])
    out.flags.writeable = False
    return out


def step_chain(pre: PoolModel | PoolRows, w: Workload, lam, budget_tokens: int, backlog: bool = False
               ) -> tuple[np.ndarray, ...]:
    """Moments of the prefill steps of one instance under bulk service, from the Markov chain of their batches:
    (E[b], E[T], E[T^2], E[T^3]) at each per-instance rate ``lam``, T in seconds.

    A step of b prompts lasts T = T_0 + tau X, X the sum of their lengths in mean prompts (mean b, variance
    b cv^2); the next step takes the N prompts that arrived meanwhile, or the next arrival when none did:
    b' = min(q', most) of the q' = q - b + N prompts then waiting (the next arrival when none are). Given b, N is Poisson of mean lambda T with T spread by the prompt lengths, a
    gamma-mixed Poisson (negative binomial; Poisson for prompts of one length). The stationary distribution
    of q gives the moments: the steps' spread comes from the chain itself, not from a fitted shape. A queue
    is followed ``BACKLOG_SPAN`` load / (1 - load) budgets' worth beyond the budget (a power of two of them, at least
    one, at most ``BACKLOG_STATES`` prompts) and lumped there; more than
    ``CHAIN_STATES`` queue lengths are kept on a grid, each count split between its two neighbours. Arrivals are weighed count by count up to ``ARRIVAL_COUNTS``; a step expecting more
    takes them as a normal (its negative binomial's shape is then large)."""
    most, t1, tau = _step_line(pre, w, budget_tokens)
    groups = None
    if isinstance(pre, PoolRows) and (len(pre.pools) > 1 or pre.chains is not None):
        # each pool's chain (or each row's, ``PoolRows.chains``) with the states it has alone
        labels = pre.owner if pre.chains is None else pre.chains
        groups = labels.reshape(-1, *([1] * (np.ndim(lam) - 1)))
    return chain_moments(lam, t1 - tau, tau, most, w.isl.cv**2, backlog=backlog, groups=groups)


def chain_moments(lam, t0, tau, most: float, cv2: float, backlog: bool = False, groups=None) -> tuple[np.ndarray, ...]:
    """``step_chain`` for steps T(b) = ``t0`` + ``tau`` b of at most ``most`` prompts, prompt lengths of squared cv
    ``cv2``; ``t0`` and ``tau`` may vary with ``lam`` (arrays that broadcast to it: an instance whose steps also
    carry its running decodes, ``hybrid_bulk_wait``). With ``backlog``, also (E[K], E[K^2]) of the full steps an
    arrival waits beyond the next one (``_backlog_steps``). ``groups`` (ints that broadcast to ``lam``): cells of
    different pool models in one call (``PoolRows``), each group's chain sized as alone (a chain's states and
    arrival counts come from the reach of all its cells: sized together, a pool's waits moved by up to 2.5e-6
    relative, which changed a plan whose SLO sat within 1e-9 of a TTFT)."""
    lam = np.asarray(lam, dtype=float)
    if lam.size == 0:
        return tuple(np.zeros(lam.shape) for _ in range(6 if backlog else 4))
    flat = lam.reshape(-1)
    t0 = np.broadcast_to(np.asarray(t0, dtype=float), lam.shape).reshape(-1)[:, None]
    tau = np.broadcast_to(np.asarray(tau, dtype=float), lam.shape).reshape(-1)[:, None]
    full = int(most)
    # prompts waiting at a step's start: the budget's worth and a backlog beyond it, BACKLOG_SPAN load / (1 -
    # load) budgets' worth (load: a full step's arrivals over the budget), rounded up to a power of two (rows of
    # one depth solve together), from one budget to BACKLOG_STATES prompts (or one budget, if that is more)
    load = flat * (t0[:, 0] + tau[:, 0] * full) / full
    budgets = np.where(load < 1, BACKLOG_SPAN * load / np.maximum(1 - load, 1e-9), np.inf)
    extra = np.minimum(full * 2.0 ** np.ceil(np.log2(np.maximum(budgets, 1.0))), max(full, BACKLOG_STATES))
    out = [np.zeros(flat.size) for _ in range(6 if backlog else 4)]
    label = np.zeros(flat.size, dtype=int) if groups is None else np.broadcast_to(groups, lam.shape).reshape(-1)
    # each (depth, group) pair's chain as alone: its states (``_closed_tops``) and arrival counts (``_chain_counts``)
    # from its own cells; pairs that come to the same solve together (a cell's figures depend on those two and its
    # own rates alone, not on the depth that sized them)
    _, pair = np.unique(extra.astype(np.int64) * (int(label.max()) + 1) + label, return_inverse=True)
    pair = pair.reshape(-1)
    first = np.zeros(pair.max() + 1, dtype=int)
    first[pair[::-1]] = np.arange(pair.size)[::-1]  # a cell of each pair
    tops = _closed_tops(flat, t0, tau, pair, full + extra[first].astype(int), full, cv2)
    counts = _chain_counts(flat, t0, tau, pair, tops, full, cv2)
    chains: dict[tuple[int, int], list[int]] = {}
    for j, key in enumerate(zip(tops.tolist(), counts.tolist())):
        chains.setdefault(key, []).append(j)
    for (top, count), members in chains.items():
        # the cells of those pairs in slices of at most CHAIN_CELLS_STATES cells x states x counts: each cell's
        # chain solves alone, so slicing changes its figures by rounding at most, and bigger arrays run slower
        cells = np.flatnonzero(np.isin(pair, members))
        per = max(1, CHAIN_CELLS_STATES // (_chain_states(top, CHAIN_STATES).size * (count + 1)))
        for start in range(0, cells.size, per):
            budget.check()  # a stop point per solve: a plan of many large chains answers its deadline on time
            batch = cells[start:start + per]
            for o, x in zip(out, _chain(flat[batch], t0[batch], tau[batch], full, cv2, top, backlog, count)):
                o[batch] = x
    return tuple(x.reshape(lam.shape) for x in out)


CHAIN_CELLS_STATES = 1_000_000
"""Most cells x states x arrival counts of chains that ``chain_moments`` solves in one call, and so the work between
its deadline checks. Bigger calls ran slower per cell (a plan at 10^6 req/s of 1-token prompts over every GPU: its
pools' chains in one call took 2.7 times their time alone); between 10^6 and 4 x 10^6 the time of such plans is
the same within this VM's noise, and one call takes at most ~0.25 s on it (a 2-core AVX2 EPYC)."""


BACKLOG_SPAN = 2.0
"""Backlog that ``chain_moments`` follows beyond a budget's worth of waiting prompts, in budgets' worth times
(1 - load) / load. The chain once followed one budget's worth below a load of 0.85 and 64 prompts above it:
at two whole 4,000-token prompts a step (Llama-3.1-8B on an H100, osl 64, Poisson) the p90 wait then jumped
by 56% at that load, and below it was 21% short of the simulation at 0.8 of capacity (624 against 790 ms).
At 2, no p50, p90 or p99 moves by 5% between rates 0.1% apart (``tests/test_serving_continuity.py``), and
the waits are within 2% of following 64 prompts at every load."""


def _arrival_reach(mu, sd):
    """The most arrivals a step's chain weighs, mean + 8 sd + 1: those beyond are negligible."""
    return mu + 8 * sd + 1


def _closed_top(flat, t0, tau, full: int, cv2: float, top: int) -> int:
    """The fewest queue lengths ``_chain`` must follow: the least power of two T >= 2 with T <= ``full`` below
    ``top`` such that no step that starts with T prompts waiting has more arrivals than T (mean + 8 sd + 1, the
    reach ``_chain`` weighs them to). A step from any q <= T takes every waiting prompt, so the next queue is
    its arrivals (or the next arrival), at most T but for the arrivals' tail past that reach, which the chain
    on 1 ... T lumps at T, as ``_chain`` lumps a tail past its counts: the same chain but for that tail (a
    review's worst case, a step all prompt work at cv^2 1, moved E[T^3] by 2.3e-6 relative; lengths beyond 64
    are then on a finer grid than before). At light load that is two or four states instead of 64 (a plan at
    1-token prompts over the 17 catalog GPUs solved 766 chains of 64 states, 1.7 of its 2.4 s, most of them at
    well under one arrival a step). ``top`` where there is no such T."""
    return int(_closed_tops(flat, t0, tau, np.zeros(flat.size, dtype=int), np.array([top]), full, cv2)[0])


def _closed_tops(flat, t0, tau, pair, limits, full: int, cv2: float) -> np.ndarray:
    """``_closed_top`` of several chains at once: cell i (of ``flat``, ``t0``, ``tau``) belongs to chain ``pair[i]``,
    whose top is at most ``limits[pair[i]]``; each chain's top from its own cells."""
    tops = np.asarray(limits, dtype=int).copy()
    searching = np.ones(tops.size, dtype=bool)
    base = t0[:, 0] + tau[:, 0]
    t = 2
    while True:
        searching &= (t <= full) & (t < tops)
        if not searching.any():
            return tops
        cells = searching[pair]
        # the step's line is linear in its batch, so the most arrivals from any q <= t are at q = 1 or q = t
        lam = flat[cells]
        mu = lam * np.maximum(base[cells], t0[cells, 0] + tau[cells, 0] * t)
        sd = np.sqrt(np.maximum(mu + (lam * tau[cells, 0]) ** 2 * t * cv2, 0.0))
        most = np.full(tops.size, -np.inf)
        with np.errstate(invalid="ignore"):  # NaN propagates: every length is followed
            np.maximum.at(most, pair[cells], _arrival_reach(mu, sd))
        done = searching & (most <= t)
        tops[done] = t
        searching &= ~done
        t *= 2


def _chain_counts(flat, t0, tau, pair, tops, full: int, cv2: float) -> np.ndarray:
    """The arrival counts ``_chain`` weighs one by one for each chain of ``_closed_tops``, from its own cells: as
    many as its narrow cells reach (a power of two, for the cache), at most ``ARRIVAL_COUNTS`` and its top (the
    wide cells' arrivals are a normal)."""
    counts = np.minimum(tops, ARRIVAL_COUNTS)
    for top in np.unique(tops).tolist():
        chains = tops == top
        cells = chains[pair]
        *_, reach, wide = _chain_reach(flat[cells], t0[cells], tau[cells], full, cv2, top)
        narrow = np.where(wide, -np.inf, reach).max(axis=1)  # NaN propagates
        most = np.full(tops.size, -np.inf)
        with np.errstate(invalid="ignore"):
            np.maximum.at(most, pair[cells], narrow)
        for j in np.flatnonzero(chains & (most > -np.inf) | chains & np.isnan(most)).tolist():
            counts[j] = min(counts[j], 2 ** math.ceil(math.log2(max(float(most[j]), 2.0))))
    return counts


@functools.lru_cache(maxsize=256)
def _chain_states(top: int, most: int) -> np.ndarray:
    """Queue lengths ``_chain`` follows: 1 ... ``top``, or ``most`` (``CHAIN_STATES``) of them on a geometric grid."""
    states = np.arange(1.0, top + 1) if top <= most else np.unique(np.round(np.geomspace(1, top, most)))
    states.flags.writeable = False
    return states


def _chain_reach(flat, t0, tau, full: int, cv2: float, top: int) -> tuple:
    """(states, their batches, step means, mean arrivals, their variance from the lengths, their sd, the most
    arrivals weighed (``_arrival_reach``), cells too wide to weigh count by count) of ``_chain``'s cells."""
    states = _chain_states(top, CHAIN_STATES)
    batch = np.minimum(states, full)
    counts = min(top, ARRIVAL_COUNTS)
    m1 = t0 + tau * batch[None, :]  # (rate, state): the step of b prompts
    mu = flat[:, None] * m1  # mean arrivals during it
    mix = (flat[:, None] * tau) ** 2 * batch[None, :] * cv2  # their variance from the lengths
    sd = np.sqrt(mu + mix)
    reach = _arrival_reach(mu, sd)
    wide = (reach > counts) & (top > counts)  # arrivals beyond the counts weighed one by one
    return states, batch, m1, mu, mix, sd, reach, wide


def _chain(flat, t0, tau, full: int, cv2: float, top: int, backlog: bool, counts: int) -> tuple[np.ndarray, ...]:
    """``chain_moments`` for 1-d rates ``flat`` (t0, tau: columns) with queue states 1 ... ``top`` (``_closed_tops``:
    no fewer than the queue can reach), weighing ``counts`` arrivals one by one (``_chain_counts``)."""
    states, batch, m1, mu, mix, sd, _, wide = _chain_reach(flat, t0, tau, full, cv2, top)
    k = states.size
    pmf = np.zeros((*mu.shape, counts + 1))
    pmf[~wide] = _arrival_pmf(mu[~wide], mix[~wide], cv2, counts)
    # prompts waiting at the next step's start: those left over plus the arrivals, or the next arrival when
    # none wait; onto the states (split between neighbours, which keeps the mean)
    if k > 1:
        split = _arrival_split(states, batch, counts)
        q = np.swapaxes(np.matmul(np.swapaxes(pmf, 0, 1), split), 0, 1)  # (rate, from, to)
        if wide.any():
            leftover = np.broadcast_to(states - batch, mu.shape)
            q[wide] = _normal_onto_grid(states, leftover[wide] + mu[wide], np.maximum(sd[wide], 1e-9))
    else:
        q = np.ones((flat.size, 1, 1))
    a = np.swapaxes(q, 1, 2) - np.eye(k)
    a[:, -1, :] = 1.0  # the probabilities sum to 1
    rhs = np.zeros((flat.size, k, 1))
    rhs[:, -1, 0] = 1.0
    pi = np.clip(np.linalg.solve(a, rhs)[..., 0], 0.0, None)
    pi /= pi.sum(axis=-1, keepdims=True)
    v = tau**2 * batch * cv2
    skew = tau**3 * batch * 2 * cv2**2  # third central moment of the lengths' sum, gamma-like
    moments = (pi @ batch, (pi * m1).sum(-1), (pi * (m1**2 + v)).sum(-1), (pi * (m1**3 + 3 * m1 * v + skew)).sum(-1))
    if backlog:
        moments = (*moments, *_backlog_steps(pi, m1, mu, pmf, wide, states, batch, full))
    return moments




BACKLOG_POINTS = 64
"""Points of the uniform position within the step in progress where a step's arrivals are too many to weigh
one by one (``_backlog_steps``)."""


def _backlog_steps(pi, m1, mu, pmf, wide, states, batch, full: int) -> tuple[np.ndarray, np.ndarray]:
    """(E[K], E[K^2]) per rate of the full steps a prompt waits beyond the next one, from the chain's stationary
    law ``pi`` of the prompts waiting at a step's start (rates x states).

    A prompt arrives during a step in progress (length-biased: pi(q) T(q)), which started with q prompts waiting
    and took b = min(q, ``full``) of them: L = q - b are left over, and A arrived before this one during the
    step. The next step takes ``full`` of the L + A + 1 then waiting, so this one waits K = floor((L + A) /
    full) full steps more. A given the step is Poisson of mean lambda U T, U uniform: P(A = a) = P(N > a) /
    E[N], N the step's arrivals (``pmf``); where those are too many to weigh one by one (``wide``), A = E[N] U."""
    wlen = pi * m1
    wlen = wlen / np.maximum(wlen.sum(-1, keepdims=True), 1e-300)
    left = states - batch
    a = np.arange(pmf.shape[-1], dtype=float)
    p_a = np.cumsum(pmf, axis=-1)  # then P(N > a) / E[N], in place
    np.subtract(1.0, p_a, out=p_a)
    np.maximum(p_a, 0.0, out=p_a)
    p_a /= np.maximum(mu, 1e-300)[..., None]
    k = np.floor((left[:, None] + a[None, :]) / full)  # (state, arrivals before it)
    # sums over a of P(A = a) k and k^2, one matrix product per state: (state, cell, 2)
    sums = np.matmul(np.swapaxes(p_a, 0, 1), np.stack([k, k**2], axis=-1))
    k1, k2 = sums[..., 0].T, sums[..., 1].T  # (cell, state)
    if wide.any():
        u = (np.arange(BACKLOG_POINTS) + 0.5) / BACKLOG_POINTS
        kw = np.floor((np.broadcast_to(left, mu.shape)[wide][:, None] + mu[wide][:, None] * u[None, :]) / full)
        k1[wide], k2[wide] = kw.mean(-1), (kw**2).mean(-1)
    return (wlen * k1).sum(-1), (wlen * k2).sum(-1)


def hybrid_bulk_wait(lam, t0, tau, most, w: Workload, groups=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A whole prompt's wait for its step on an instance whose steps carry its running decodes and every prompt
    that arrived during the step before, up to ``most`` a step: (P_w, the mean and squared cv of the wait given
    it is positive), per cell of the arrays ``lam``, ``t0`` and ``tau`` (a step of k prompts lasts t0 + tau k,
    the running decodes included) and ``most``.

    The prompt steps are ``_bulk_wait``'s bulk service (``chain_moments``): an arrival finds one running with
    probability P_w = lambda E[T] / E[b] (else a decode step, whose rest it waits out) and then waits
    U t + tau S (``bulk_wait_mean``, ``bulk_wait_variance``): the rest of that step, and the prompts that
    arrived during it and share its own step (``groups``: the cells' pool models, ``chain_moments``). Where a
    step holds six prompts or more this replaces M/G/1's
    wait stretched by 1 + rho (blended in from three: ``chunked._prompt_wait``), which had the p90 TTFT 34% and
    284% long against the simulation where eight 1,000-token prompts share a step (Llama-3.1-8B on one H100 at
    20 and 27 req/s; now -3% and +1%). Poisson arrivals (the chain counts a step's arrivals as Poisson)."""
    lam, t0, tau, most = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (lam, t0, tau, most)))
    label = None if groups is None else np.broadcast_to(groups, lam.shape)
    x, t_d = tau, t0
    pw, mean, cv2 = np.zeros(lam.shape), np.zeros(lam.shape), np.ones(lam.shape)
    ok = np.isfinite(t_d) & np.isfinite(x) & (lam > 0) & (x > 0)
    cv2_l = w.isl.cv**2
    for n in np.unique(np.maximum(most[ok], 1.0)):
        cell = ok & (np.maximum(most, 1.0) == n)
        lc, tc, xc = lam[cell], t_d[cell], x[cell]
        e_b, e_t, e_t2, e_t3, k1, k2 = chain_moments(lc, tc, xc, float(n), cv2_l, backlog=True,
                                                     groups=None if label is None else label[cell])
        e1, e2 = e_t2 / e_t, e_t3 / e_t
        busy = np.minimum(lc * e_t / e_b, 1 - 1e-9)
        m = np.minimum(lc * xc, 0.99)
        backlog = {"k_1": k1, "k_2": k2, "T_full": tc + xc * n}
        wm = np.asarray(f.bulk_wait_mean(e_1=e1, m=m, c_srv=1.0, **backlog), dtype=float)
        wv = np.maximum(np.asarray(f.bulk_wait_variance(e_1=e1, e_2=e2, m=m, tau_p=xc, cv2_isl=cv2_l, c_srv=1.0,
                                                        **backlog), dtype=float), 1e-30)
        pw[cell], mean[cell], cv2[cell] = busy, wm, wv / np.maximum(wm, 1e-30) ** 2
    return pw, mean, cv2


def _bulk_wait(pre: PoolModel | PoolRows, w: Workload, lam, c, budget_tokens: int, levels, busy
               ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, quantiles) of arrival to end of prefill under bulk service (``prefill_wait``).

    A prompt that finds an instance idle runs at once: T(l), normal about T(1) with its length's spread.
    One that finds all busy (probability ``erlang_c`` at the chain's busy share lambda E[T] / E[b]) ends
    after T(1) + (U t + tau S) / c: U t the rest of the step in progress t (length-biased: its moments
    E[T^2] / E[T] and E[T^3] / E[T] from ``step_chain``), S the prompts that arrived during it
    (``bulk_wait_mean``, ``bulk_wait_variance``), taken as a gamma of that mean and variance. Against the
    simulation (4 seeds of 40,000 prompts, Llama-3.1-8B on H100, prompts of 600 tokens, cv 0.5) the p50
    and p90 are within 5% up to 0.8 of capacity. Nearer capacity a prompt often finds more than a step's
    worth of prompts ahead of it and waits K whole steps more (``_backlog_steps``, in ``bulk_wait_mean``
    and ``bulk_wait_variance``): at 0.95 of capacity p50 / p90 246 / 516 ms against 254 / 693 ms simulated
    (189 / 375 ms without K)."""
    most, t1, tau = _step_line(pre, w, budget_tokens)
    m = np.minimum(lam * tau, 0.99)
    stable = busy < 1
    e_b, e_t, e_t2, e_t3, k1, k2 = step_chain(pre, w, lam, budget_tokens, backlog=True)
    e1, e2 = e_t2 / e_t, e_t3 / e_t
    p_busy = np.where(stable, erlang_c(np.minimum(lam * c * e_t / e_b, c * (1 - 1e-9)), c), 1.0)
    ca2 = w.arrival_cv**2
    if abs(ca2 - 1.0) > 1e-12 and ca2 > 0:
        # bursty arrivals find the pool busy more often (GI/M/1's P_w, relative to Poisson's), and more of
        # them queue behind it (Allen-Cunneen's (c_a^2 + 1) / 2 on the prompts that join a step)
        rho_c = np.minimum(busy, 1 - 1e-9)
        p_busy = np.minimum(p_busy * gamma_arrival_wait_probability(rho_c, ca2) / np.maximum(rho_c, 1e-12), 1.0)
        m = m * (ca2 + 1) / 2
    cv2 = w.isl.cv**2
    own_var = tau**2 * cv2
    backlog = {"k_1": k1, "k_2": k2, "T_full": t1 + tau * (most - 1)}
    wait_mean = np.asarray(f.bulk_wait_mean(e_1=e1, m=m, c_srv=c, **backlog), dtype=float)
    wait_var = np.maximum(np.asarray(f.bulk_wait_variance(e_1=e1, e_2=e2, m=m, tau_p=tau, cv2_isl=cv2, c_srv=c,
                                                          **backlog), dtype=float), 1e-30) + own_var
    busy_mean = t1 + wait_mean
    kg, thg = busy_mean**2 / wait_var, wait_var / busy_mean
    mean = t1 + p_busy * wait_mean
    sd_own = np.sqrt(own_var)  # a float, or a (rows, 1) column for several pool models
    lv = np.broadcast_to(levels, (*np.shape(lam), len(levels)))
    pb, kk, th = (np.broadcast_to(np.asarray(a, dtype=float)[..., None], lv.shape) for a in (p_busy, kg, thg))
    t1_l, sd_l = (np.expand_dims(a, -1) if np.ndim(a) else a for a in (t1, sd_own))  # on the levels' axis
    point = sd_l == 0  # prompts of one length

    def cdf(x):
        idle = np.where(point, np.where(x >= t1_l, 1.0, 0.0),
                        0.5 * (1 + _erf((x - t1_l) / (np.where(point, 1.0, sd_l) * math.sqrt(2)))))
        return (1 - pb) * idle + pb * _gamma_cdf_wh(x, kk, th)

    q = None
    if np.any(point):  # a point mass at T(1) and the gamma, inverted in closed form
        q = _point_and_gamma_quantile(lv, pb, t1_l, kk, th)
    if not np.all(point):
        lo = np.zeros(lv.shape)
        hi = np.broadcast_to((t1 + 4 * sd_own + np.asarray(f.gamma_quantile_wh(k_g=kg, theta_g=thg, z=4.0),
                                                           dtype=float) * 2)[..., None], lv.shape).copy()
        bisected = decreasing_root(lambda x: lv - cdf(x), lo, hi, BISECTION_STEPS + 4)
        q = bisected if q is None else np.where(point, q, bisected)
    return np.where(stable, mean, np.inf), np.where(stable[..., None], q, np.inf)


_NORMAL_QUANTILE = np.vectorize(NormalDist().inv_cdf, otypes=[float])


def _point_and_gamma_quantile(levels, p_busy, t1, k, theta) -> np.ndarray:
    """Quantiles at ``levels`` of the mixture (1 - P_b) at t1 exactly + P_b gamma(k, theta) (Wilson and
    Hilferty's, ``gamma_quantile_wh``): below the gamma's mass under t1 the gamma's own quantile at
    level / P_b, then t1 while the point mass lasts, then the gamma's at (level - (1 - P_b)) / P_b. What the
    bisection of ``_bulk_wait`` finds for prompts of one length, without the 15 evaluations."""
    p_busy = np.asarray(p_busy, dtype=float)
    unknown = np.isnan(p_busy)  # stays NaN
    busy = (p_busy > 0) & ~unknown
    pb = np.where(busy, p_busy, 1.0)
    under = np.where(busy, p_busy * _gamma_cdf_wh(np.broadcast_to(np.asarray(t1, dtype=float), np.shape(levels)),
                                                  k, theta), 0.0)
    u = np.where(levels <= under, levels / pb, (levels - (1 - pb)) / pb)
    z = _NORMAL_QUANTILE(np.clip(u, 1e-12, 1 - 1e-12))
    x = np.asarray(f.gamma_quantile_wh(k_g=k, theta_g=theta, z=z), dtype=float)
    q = np.where(busy & (levels <= under), x, np.where(~busy | (levels <= under + 1 - pb), t1, x))
    return np.where(unknown, np.nan, q)


def prefill_time(pre: PoolModel | PoolRows, w: Workload, lam_total, servers, budget_tokens: int, levels
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival to the end of prefill: (mean, quantiles at ``levels`` (last axis), busy share).
    ``prefill_wait``, with the prompt's own length: its excess over the mean prompt adds in
    quadrature to the wait's (a long wait and a long prompt rarely coincide)."""
    lam_total, servers, levels = (np.asarray(a, dtype=float) for a in (lam_total, servers, levels))
    cache = None if isinstance(pre, PoolRows) else pre._cache  # several pool models (rows): not cached
    key = ("prefill_time", lam_total.tobytes(), lam_total.shape, servers.tobytes(), servers.shape, budget_tokens,
           levels.tobytes(), w.isl, w.prefix_hit)
    hit = None if cache is None else cache.get(key)  # a plan pairs one prefill pool with many decode pools
    if hit is not None:
        return hit
    mean, q, busy, _ = prefill_wait(pre, w, lam_total, servers, budget_tokens, levels)
    # bulk steps already carry the prompts' spread in their length; a FIFO prompt's own length adds
    own = (1 - _bulk_share(w, budget_tokens)) * PrefillService.excess_s(pre, w, levels)
    finite = np.isfinite(q)
    with np.errstate(invalid="ignore"):
        q = np.where(finite, mean[..., None] + excess_sum(np.where(finite, q - mean[..., None], 0.0), own), np.inf)
    if cache is not None and len(cache) < 4096:
        cache[key] = (mean, q, busy)
    return mean, q, busy


def _gamma_cdf_wh(x, k, theta) -> np.ndarray:
    """P(X <= x) for X ~ gamma(k, theta), by Wilson and Hilferty: (X / k theta)^(1/3) is normal with
    mean 1 - 1 / 9k and variance 1 / 9k (0 for x <= 0)."""
    v = 1 / (9 * k)
    z = (np.cbrt(np.maximum(x, 0.0) / (k * theta)) - (1 - v)) / np.sqrt(v)
    return np.where(x > 0, 0.5 * (1 + _erf(z / math.sqrt(2))), 0.0)


def _decode_side(dec: PoolModel | PoolRows, w: Workload, lam_d: np.ndarray, p: float) -> tuple[np.ndarray, ...]:
    """The decode instance at per-instance rates ``lam_d``: (B, B capped, t_d, slope, TPOT mean, its
    variance and p-quantile, lifetime, slot wait mean and p-quantile, the slot queue, and the fixed point
    B' = lambda osl t(B' + 1) that decides stability, as in the other modes: a batch that would outgrow its
    slots, then the full batch's TPOT and the share of requests that wait for a slot and decode beside it:
    ``full_batch_tpot_quantile``). Cached on the pool model: a plan pairs one decode pool with many prefill
    pools. For several pool models (``PoolRows``: ``lam_d`` (rows, rates)) each row's from its own, not cached."""
    rows = dec if isinstance(dec, PoolRows) else None
    key = ("decode_side", lam_d.tobytes(), lam_d.shape, float(p), w.isl, w.osl)
    hit = None if rows is not None else dec._cache.get(key)  # type: ignore[union-attr]
    if hit is not None:
        return hit
    pools = PoolRows.of(dec, 1)
    ctx = running_context(w)
    limit = pools.per_row(lambda m: m.batch_limit(w))

    def step_at(batch) -> np.ndarray:  # each row's decode step at ``batch``
        return pools.decode_steps(ctx, w, batch)

    # B = lambda osl t(B + 1): where to look
    if len(pools.pools) == 1:
        fixed = decode_fixed_point(pools.pools[0], ctx, lam_d, w.osl.mean, 1.0, limit)[0]
    else:
        fixed = decode_fixed_batches(pools, ctx, lam_d, w.osl.mean, w)
    slope0 = step_at(np.minimum(fixed, limit) + 1) - step_at(np.minimum(fixed, limit))
    # no prompts stretch the lifetimes here: the step a request sees, t(N + 1), over the product form of the
    # batch on the step curve, with the queue for a slot beyond the limit (``product_form_step_moments``): its
    # mean is the TPOT (below t(B + 1) where the curve is concave: an MoE at a small batch) and by Little's law
    # B = lambda osl TPOT sequences decode
    tpot, step_var = product_form_step_moments(pools.pools[0] if len(pools.pools) == 1 else pools, ctx, lam_d,
                                               w.osl.mean, limit, fixed, decode_load(lam_d, w, slope0))
    batch = lam_d * w.osl.mean * tpot
    b_cap = np.minimum(batch, limit)
    # a full decode batch of L = floor(limit) sequences steps at t_d(L) (no prompts stall it): the
    # largest TPOT, which bounds the tail, and the hold of a slot while requests queue for one
    t_d, t_up = step_at(b_cap), step_at(b_cap + 1)
    tpot_full = step_at(np.broadcast_to(np.maximum(np.floor(limit), 1.0), b_cap.shape))
    slope = t_up - t_d
    zero = np.zeros_like(lam_d)
    tpot_var, _ = tpot_tail(tpot, zero, lam_d, zero, 0.0, w, slope, b_cap, p, step_var)
    tpot_full = np.maximum(tpot_full, tpot)
    life = w.osl.mean * tpot
    # the decode pool's arrivals are the prefill pool's departures, no burstier than the arrivals (taken as
    # bursty as them: an upper bound)
    slots = SlotQueue.of(lam_d, batch, limit, life, w.osl.cv**2, w.osl.mean * slope, w.osl.mean * tpot_full,
                         ca2=w.arrival_cv**2)
    aq, ap = slots.mean_s, slots.quantile_s(p)
    # the requests that waited for a slot decode beside a full batch (``full_batch_tpot_quantile``)
    full_share = np.where(np.isfinite(slots.mean_s), slots.wait_probability, 1.0)
    tpot_p = full_batch_tpot_quantile(tpot, tpot_var, tpot_full, full_share, p)
    out = (batch, b_cap, t_d, slope, tpot, tpot_var, tpot_p, life, aq, ap, slots, fixed, tpot_full, full_share)
    if rows is None and len(dec._cache) < 4096:  # type: ignore[union-attr]
        dec._cache[key] = out  # type: ignore[union-attr]
    return out


def _decode_rows(decs: PoolRows, w: Workload, lam_d: np.ndarray, p: float) -> tuple:
    """``_decode_side`` of every row, each distinct (decode pool, rates) row computed once: the partners of one
    decode pool share its figures to the last bit, as they do alone from its cache (a plan's candidates of one
    decode pool then tie exactly where they should, in tokens/s per user)."""
    lam_d = np.ascontiguousarray(np.broadcast_to(lam_d, (decs.owner.size, *np.shape(lam_d)[1:])))
    first: dict[tuple[int, bytes], int] = {}
    pick: list[int] = []  # a row of each distinct (pool, rates), in first-seen order
    inverse = []
    for r, key in enumerate(zip(decs.owner.tolist(), (row.tobytes() for row in lam_d))):
        if key not in first:
            first[key] = len(pick)
            pick.append(r)
        inverse.append(first[key])
    side = _decode_side(PoolRows(decs.pools, decs.owner[pick]), w, lam_d[pick], p)
    slots = SlotQueue(*(np.asarray(x)[inverse] for x in side[10].__dict__.values()))
    return tuple(slots if i == 10 else np.asarray(x)[inverse] for i, x in enumerate(side))


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float,
            pools: tuple[PoolModel, PoolModel] | None = None, joint: bool = False) -> ModeArrays:
    assert d.prefill is not None and d.decode is not None
    pre, dec = pools or (PoolModel.build(model, d.prefill, w), PoolModel.build(model, d.decode, w))
    return analyse_pairs(model, [d], [(pre, dec)], w, total_rate, p, joint)


def analyse_pairs(model: ModelSpec, ds: list[Deployment], pools: list[tuple[PoolModel, PoolModel]], w: Workload,
                  total_rate, p: float, joint: bool = False) -> ModeArrays:
    """``analyse`` of one deployment (its arrays shaped as ``total_rate``), or of several at once: row r of
    ``total_rate`` (rows x rates) for deployment ``ds[r]`` on its (prefill, decode) pool models ``pools[r]``, each
    row as it would be alone (a plan sizes every decode pool, and tries every pair, in one call each: a call's
    cost is mostly its fixed part). The deployments share the prefill step's token budget."""
    lam = np.asarray(total_rate, dtype=float)
    budget_tokens = ds[0].max_batched_tokens
    assert all(d.max_batched_tokens == budget_tokens for d in ds), "one prefill token budget a call"
    pres, t_kv, t_vis = [], [], []
    for d, (pre, dec) in zip(ds, pools):
        assert d.prefill is not None and d.decode is not None
        t = kv_transfer_s(model, d, w, pre, dec, PrefillService.of(pre, w, p).mean_s)
        # the move's share of TTFT outside the prefill; the prefill instance is held for a blocking move: prefill work
        pres.append(pre.held(t) if d.kv_transfer == "blocking" else pre)
        t_kv.append(t)
        t_vis.append(0.0 if d.kv_transfer == "blocking" else t)
    one = len(ds) == 1

    def per_row(values: list[float]):  # a float for one deployment, else a (rows, 1) column
        return values[0] if one else np.array(values, dtype=float)[:, None]

    # each deployment's prefill chain as it has it alone (two pairs of one prefill pool at different instance
    # counts would otherwise share a chain's states: a review saw 2.1e-4 on a p90 TTFT)
    pre = pres[0] if one else replace(PoolRows.each(pres), chains=np.arange(len(pres)))
    dec = pools[0][1] if one else PoolRows.each([pd[1] for pd in pools])
    t_kv_r, t_visible = per_row(t_kv), per_row(t_vis)
    c = per_row([float(d.prefill.engines) for d in ds])  # type: ignore[union-attr]
    levels = np.array([p, *ATTAINMENT_LEVELS]) if joint else np.array([p])
    lam_d = lam / per_row([float(d.decode.engines) for d in ds])  # type: ignore[union-attr]
    decs = PoolRows.of(dec, 1)
    limit = decs.per_row(lambda m: m.batch_limit(w))
    batch, b_cap, t_d, slope, tpot, tpot_var, tpot_p, life, aq, _ap, slots, fixed, tpot_full, full_share = \
        _decode_side(dec, w, lam_d, p) if one else _decode_rows(decs, w, lam_d, p)
    # where requests wait for a decode slot, that wait follows the prefill, the move and the step in
    # progress: the quantile of the sum (``with_slot_wait``), from that time's quantiles at TAIL_LEVELS
    # (per deployment: where none of its rates needs them, the plain quantile)
    matters = np.asarray(slots.matters(float(levels.max())))
    tabulate_rows = matters.any(axis=-1, keepdims=True) if matters.ndim > 1 and not one else None
    tabulate = bool(np.any(matters))
    asked = np.concatenate([levels, TAIL_LEVELS]) if tabulate else levels
    if not one and np.ndim(lam) == 1:
        lam = np.broadcast_to(lam, np.shape(lam_d))
    prefill_mean, prefill_q, rho_prefill = prefill_time(pre, w, lam, c, budget_tokens, asked)
    before_tail, before_far = None, None
    on_levels = np.expand_dims(t_visible, -1) if np.ndim(t_visible) else t_visible
    if tabulate:
        before_q = prefill_q[..., levels.size:] + on_levels + TAIL_LEVELS * np.asarray(t_d)[..., None]
        before_tail, before_far = quantile_table_tail(before_q, TAIL_LEVELS), before_q[..., -1]

    def ttft_at(i: int, q: float) -> np.ndarray:
        """The q-quantile of TTFT: the prefill, the KV move, the decode instance's next step, and
        a decode slot."""
        alone = prefill_q[..., i] + t_visible + q * t_d
        if before_tail is None:
            return alone
        both = with_slot_wait(q, before_tail, before_far, alone, slots, prefill_mean + t_visible + t_d / 2)
        return both if tabulate_rows is None else np.where(tabulate_rows, both, alone)

    ttft_p = ttft_at(0, p)
    ttft_mean = prefill_mean + t_visible + aq + t_d / 2
    levels = np.stack([ttft_at(i + 1, float(q)) for i, q in enumerate(ATTAINMENT_LEVELS)], axis=-2) if joint else None
    itl_p = t_d + z_score(p) * np.sqrt(b_cap) * slope

    rho_decode = lam_d * w.osl.mean * slope
    # the fixed point, as stability; without one (the batch outgrows its slots) the slots the arrivals would hold at
    # the step of a batch at the limit, so an overloaded pool's load is a number (it was inf, shown as 1e9)
    demand = np.where(np.isfinite(fixed), fixed, lam_d * life)
    if not np.all(np.isfinite(demand)):  # (only overloaded cells: a plan's stable grid reads no extra step)
        at_limit = decs.decode_steps(running_context(w), w, np.maximum(np.floor(limit), 1.0))
        demand = np.where(np.isfinite(demand), demand, np.maximum(lam_d * w.osl.mean * at_limit, limit))
    occupancy = slots.occupancy(demand / limit)
    slot_name = [("decode batch cap" if m.batch_cap <= m.kv_limit(w) else "decode KV memory") for m in decs.pools]
    stacked = np.stack(np.broadcast_arrays(rho_prefill, rho_decode, occupancy))
    stacked = np.where(np.isfinite(stacked), stacked, 1e9)
    util = stacked.max(axis=0)
    which = np.argmax(stacked, axis=0)
    if len(decs.pools) == 1:
        binding = np.array(["prefill pool", "decode bandwidth", slot_name[0]])[which]
    else:
        binding = np.where(which == 0, "prefill pool", np.where(which == 1, "decode bandwidth", np.array(
            slot_name, dtype=object)[decs.owner][:, None]))
    stable = (util < 1) & np.isfinite(fixed) & (fixed < limit)
    return ModeArrays(stable, util, ttft_mean, ttft_p, tpot, tpot_p, batch,
                      np.broadcast_to(t_kv_r, np.shape(lam)).astype(float), binding, tpot_var, itl_p, levels, tpot_full,
                      full_share)
