"""Discrete-event simulation of one deployment: the engine the closed forms describe, step by step.

It runs the same step-time functions as the closed form (``PoolModel``, the roofline of
``calculator.phases``) iteration by iteration, with seeded Poisson arrivals and lengths drawn from
the workload's distributions, so a disagreement with ``evaluate`` comes from the queueing and
fixed-point approximations alone. The engine it plays:

* **continuous batching** with the pool's ``max_batch`` and a KV-memory capacity: a waiting request
  is admitted (FIFO, head of line first) when a batch slot is free and its prompt's KV fits;
  running sequences grow by one token per step, and when the cache overflows the most recently
  admitted one is preempted and recomputed later (vLLM's recompute preemption); nothing is clipped;
* **scheduler policies** of the mixed mode: ``hybrid`` (every step carries all running decodes plus
  whole waiting prompts up to the token budget, the first prompt always) and ``prefill_first``
  (waiting prompts run in a step of their own; the decodes wait); **chunked** is Sarathi: each
  step carries the decodes plus up to ``chunk_tokens - decodes`` prompt tokens, FIFO, a prompt
  split over steps;
* **disaggregated**: a prefill pool of N servers sharing one FIFO queue, each step batching
  waiting prompts up to the token budget; the KV move; then one decode instance (requests routed
  to it at random, 1 / N_d of them) that admits under its KV capacity and decodes.

A mixed or chunked deployment of N instances is simulated as one instance at rate / N (random
routing); the attention data-parallel ranks of one instance that wait for each other's prompts
(``Pool.coupled_ranks``) run in lock-step (``run_lockstep``), each step as long as the slowest rank's. Per request it records TTFT (arrival to first token), TPOT (the mean gap between its
output tokens) and every inter-token gap (ITL). The first 10% of requests warm the system up and
are not measured; arrivals continue until every measured request has finished.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hardware_db.schema import GPUSpec, ModelSpec

from .. import budget
from ..errors import InputError
from .base import PERCENTILES, Deployment, PoolModel
from .workload import SLO, Workload

Policy = Literal["prefill_first", "hybrid", "chunked", "decode"]
WARMUP_SHARE = 0.1
EXTRA_ARRIVALS = 0.25
"""Arrivals beyond the measured ones, so the last measured requests still see a loaded system."""
MAX_SIM_REQUESTS = 50_000
MAX_STEPS = 3_000_000
CHECK_EVERY_STEPS = 512


def _quantise(x: float) -> float:
    """Step-time cache key: exact below 64 tokens, else on a geometric grid 0.8% apart."""
    if x <= 64:
        return float(round(x))
    return float(math.exp(round(math.log(x) * 128) / 128))


@dataclass
class Trace:
    """What one simulation measured (arrays over the measured requests)."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray  # NaN for a request with one output token
    itl_s: np.ndarray  # inter-token gaps while the measured requests arrive (values) ...
    itl_weight: np.ndarray  # ... and how many sequences saw each
    batch_mean: float  # time-average running sequences (decode instance)
    preemptions: int
    steps: int
    stable: bool
    admission_wait_s: np.ndarray | None = None  # arrival to first admission (decode instance: to its KV)
    slots_taken: np.ndarray | None = None
    """Per measured request, whether it arrived to find no batch slot for it: the batch cap or the KV memory
    could not take it beside the running and admitted sequences and the prompts queued ahead of it (those counted
    at its own prompt's KV)."""

    def ttft_p(self, p: float) -> float:
        return float(np.percentile(self.ttft_s, p))

    def tpot_p(self, p: float) -> float:
        t = self.tpot_s[np.isfinite(self.tpot_s)]
        return float(np.percentile(t, p)) if t.size else 0.0

    def itl_p(self, p: float) -> float:
        """Weighted percentile of the gaps: the gap below which p% of all emitted tokens arrived."""
        if not self.itl_s.size:
            return 0.0
        order = np.argsort(self.itl_s)
        cum = np.cumsum(self.itl_weight[order])
        return float(self.itl_s[order][min(np.searchsorted(cum, p / 100 * cum[-1]), cum.size - 1)])

    def attainment(self, slo: SLO) -> float:
        """Share of measured requests that meet both the TTFT and the TPOT target (joint)."""
        tpot = np.where(np.isfinite(self.tpot_s), self.tpot_s, 0.0)
        return float(np.mean((self.ttft_s <= slo.ttft_s) & (tpot <= slo.tpot_s)))


class _StepTimes:
    """Cached step times of one pool: decode-only, prompt-only and hybrid steps."""

    def __init__(self, pm: PoolModel) -> None:
        self.pm = pm
        self.cache: dict[tuple, float] = {}

    def __call__(self, decodes: int, ctx: float, prompts: int, tokens: float, prefix: float) -> float:
        key = (decodes, _quantise(ctx) if decodes else 0.0, prompts, _quantise(tokens) if prompts else 0.0,
               _quantise(prefix) if prompts and prefix else 0.0)
        t = self.cache.get(key)
        if t is None:
            b, c, k, s, p = key
            if not k:
                t = float(self.pm.decode_s(b, c))
            elif not b:
                t = float(self.pm.prefill_s(s, p, k))
            else:
                t = float(self.pm.step_s(b, c, s, p, k))
            self.cache[key] = t
        return t


def run_engine(pm: PoolModel, policy: Policy, arrivals: np.ndarray, prompt: np.ndarray, cached: np.ndarray,
               osl: np.ndarray, measured: np.ndarray, token_budget: int, max_batch: int | None = None,
               kv_capacity_bytes: float | None = None) -> tuple[np.ndarray, np.ndarray, Trace]:
    """Step one engine instance through the requests (sorted by ``arrivals``, s).

    ``prompt`` is the tokens each request's prefill computes (after its ``cached`` prefix tokens);
    with policy ``decode`` the prompt's KV arrives ready and the request joins the decode batch at
    admission (its first token came from the prefill pool). Returns (first-token time, finish time,
    trace) per request; TTFT in the trace is measured from ``arrivals``.
    """
    steps = _engine_steps(pm, policy, arrivals, prompt, cached, osl, measured, token_budget, max_batch,
                          kv_capacity_bytes)
    step_time = _StepTimes(pm)
    try:
        kind, value = next(steps)
        while True:  # alone, a step lasts its own time and an idle engine waits for its next arrival
            kind, value = steps.send(step_time(*value) if kind == "step" else value)
    except StopIteration as done:
        return done.value


def run_lockstep(pm: PoolModel, policy: Policy, ranks: int, arrivals: np.ndarray, prompt: np.ndarray,
                 cached: np.ndarray, osl: np.ndarray, measured: np.ndarray, token_budget: int, seed: int = 0) -> Trace:
    """``ranks`` attention data-parallel ranks of one instance that step together (``Pool.coupled_ranks``):
    a router sends each request to a rank at random, each rank schedules its own requests as ``run_engine``
    does, and every step lasts as long as the slowest rank's (the MoE dispatch and combine join them every
    layer); a rank with nothing to run sits the step out. A rank's step is timed at the ranks' mean decode
    batch (the routed experts every GPU reads serve all ranks' tokens; ``PoolModel`` steps are per rank as if
    every rank ran the same step), with its own context and prompt work (a prompt is its rank's alone:
    ``step_groups(prompt_ranks=1)``). The trace pools the ranks' requests and gaps."""
    rank_of = np.random.default_rng(seed + 3).integers(0, ranks, arrivals.size)
    gens = []
    for r in range(ranks):
        ix = np.flatnonzero(rank_of == r)
        gens.append(_engine_steps(pm, policy, arrivals[ix], prompt[ix], cached[ix], osl[ix], measured[ix],
                                  token_budget, None, None))
    traces: list[Trace | None] = [None] * ranks
    msgs: dict[int, tuple[str, Any]] = {}  # each rank's last word: ("step", its step's shape) or ("wait", next arrival)
    for r, g in enumerate(gens):
        try:
            msgs[r] = next(g)
        except StopIteration as done:
            traces[r] = done.value[2]
    now = 0.0
    step_time = _StepTimes(pm)
    while msgs:
        stepping = [r for r, (kind, _) in msgs.items() if kind == "step"]
        if stepping:
            mean_batch = sum(msgs[r][1][0] for r in stepping) / ranks  # the idle ranks hold none
            step = max(step_time(round(mean_batch, 2), *msgs[r][1][1:]) for r in stepping)
            now += step
            replies = {r: (step if msgs[r][0] == "step" else now) for r in msgs}
        else:  # every rank idle: all wait for the earliest arrival among them
            now = min(v for _, v in msgs.values())
            replies = dict.fromkeys(msgs, now)
        for r, value in replies.items():
            try:
                msgs[r] = gens[r].send(value)
            except StopIteration as done:
                traces[r] = done.value[2]
                del msgs[r]
    done_traces = [t for t in traces if t is not None]
    return Trace(np.concatenate([t.ttft_s for t in done_traces]), np.concatenate([t.tpot_s for t in done_traces]),
                 np.concatenate([t.itl_s for t in done_traces]), np.concatenate([t.itl_weight for t in done_traces]),
                 float(np.mean([t.batch_mean for t in done_traces])), sum(t.preemptions for t in done_traces),
                 max(t.steps for t in done_traces), all(t.stable for t in done_traces),
                 np.concatenate([t.admission_wait_s for t in done_traces]),
                 np.concatenate([t.slots_taken for t in done_traces]))


def _engine_steps(pm: PoolModel, policy: Policy, arrivals: np.ndarray, prompt: np.ndarray, cached: np.ndarray,
                  osl: np.ndarray, measured: np.ndarray, token_budget: int, max_batch: int | None,
                  kv_capacity_bytes: float | None):
    """``run_engine``'s engine as a generator: it yields ("step", the step's shape: decodes, their mean context,
    prompt pieces, their mean new tokens and mean prefix) and is sent the time the step lasted (its own, or
    longer where it waits for other ranks), or ("wait", its next arrival) when it has nothing to run and is sent
    the time it resumes at (it may find nothing new yet); it returns ``run_engine``'s tuple."""
    n = arrivals.size
    max_batch = pm.batch_cap if max_batch is None else max_batch
    capacity = pm.kv_budget_bytes if kv_capacity_bytes is None else kv_capacity_bytes
    kv = pm.kv_seq_bytes
    full, window, win_bytes = pm.kv_full_bytes_per_token, pm.kv_window, pm.kv_window_bytes_per_token
    first, done = np.full(n, np.nan), np.full(n, np.nan)
    remaining = np.maximum(osl - 1, 0).astype(np.int64)
    need = prompt.astype(np.int64).copy()  # tokens the prefill computes (grows when a preempted one recomputes)
    progress = np.zeros(n, dtype=np.int64)
    admitted = np.zeros(n, dtype=bool)
    admitted_at = np.full(n, np.nan)  # first admission (a batch slot and its prompt's KV), s
    taken = np.zeros(n, dtype=bool)  # arrived to find no slot for it (``Trace.slots_taken``)
    run_id = np.empty(0, dtype=np.int64)
    run_ctx = np.empty(0, dtype=float)
    run_last = np.empty(0, dtype=float)
    waiting: deque[int] = deque()
    reserved = 0.0  # KV bytes of admitted prompts not yet decoding
    admitted_waiting = 0
    itl_values: list[float] = []
    itl_weights: list[int] = []
    idx = np.flatnonzero(measured)
    window_start = float(arrivals[idx[0]]) if idx.size else 0.0
    window_end = float(arrivals[idx[-1]]) if idx.size else 0.0
    pending = int(idx.size)
    t, nxt, steps, preemptions, batch_time = 0.0, 0, 0, 0, 0.0
    stable = True
    backlog_cap = 20 * max_batch + 5_000

    def running_kv() -> float:
        if not run_id.size:
            return 0.0
        total = full * float(run_ctx.sum())
        if win_bytes:
            total += win_bytes * float(np.minimum(run_ctx, window).sum())
        return total

    while pending > 0:
        while nxt < n and arrivals[nxt] <= t:
            if measured[nxt]:
                ahead = len(waiting) - admitted_waiting + 1  # the prompts not yet admitted, this one included
                taken[nxt] = (run_id.size + admitted_waiting + ahead > max_batch
                              or running_kv() + reserved + ahead * float(kv(cached[nxt] + need[nxt])) > capacity)
            waiting.append(nxt)
            nxt += 1
        if not run_id.size and not waiting:
            if nxt >= n:
                break
            t = yield ("wait", float(arrivals[nxt]))
            continue
        steps += 1
        if steps % CHECK_EVERY_STEPS == 0:
            budget.check()
            if len(waiting) > backlog_cap or steps > MAX_STEPS:
                stable = False
                break
        used = running_kv() + reserved
        active = run_id.size + admitted_waiting

        def admit(r: int) -> bool:
            nonlocal used, reserved, active, admitted_waiting
            if admitted[r]:
                return True
            cost = float(kv(cached[r] + need[r]))
            if active >= max_batch or (used + cost > capacity and active):
                return False
            admitted[r] = True
            if np.isnan(admitted_at[r]):
                admitted_at[r] = t
            used += cost
            reserved += cost
            active += 1
            admitted_waiting += 1
            return True

        segments: list[tuple[int, int, float]] = []  # (request, tokens, prefix) computed this step
        decodes = run_id.size
        if policy == "decode":
            joined = []
            while waiting and admit(waiting[0]):
                joined.append(waiting.popleft())
            if joined:
                ids = np.asarray(joined, dtype=np.int64)
                first[ids] = t
                reserved -= float(kv(cached[ids] + need[ids]).sum())
                admitted_waiting -= ids.size
                run_id, run_ctx = np.concatenate([run_id, ids]), np.concatenate([run_ctx, cached[ids] + need[ids]])
                run_last = np.concatenate([run_last, np.full(ids.size, t)])
                decodes = run_id.size
        elif policy == "prefill_first":
            if waiting and admit(waiting[0]):
                left = token_budget
                for r in waiting:
                    todo = int(need[r] - progress[r])
                    if segments and (todo > left or not admit(r)):
                        break
                    segments.append((r, todo, float(cached[r] + progress[r])))
                    left -= todo
                decodes = 0
        else:
            left = token_budget - decodes
            for r in waiting:
                todo = int(need[r] - progress[r])
                if policy == "chunked":
                    if left <= 0 or not admit(r):
                        break
                    take = min(todo, left)
                else:
                    if (segments and todo > left) or not admit(r):
                        break
                    take = todo
                segments.append((r, take, float(cached[r] + progress[r])))
                left -= take
                if take < todo:
                    break

        ctx_mean = float(run_ctx.sum()) / decodes if decodes else 0.0
        if segments:
            k = len(segments)
            shape = (decodes, ctx_mean, k, sum(x[1] for x in segments) / k, sum(x[2] for x in segments) / k)
        else:
            if not decodes:  # the head cannot be admitted and nothing runs: wait for the next arrival
                if nxt >= n:
                    stable = False
                    break
                t = yield ("wait", float(arrivals[nxt]))
                continue
            shape = (decodes, ctx_mean, 0, 0.0, 0.0)
        dt = yield ("step", shape)
        start, t = t, t + dt
        batch_time += run_id.size * dt

        if decodes and run_id.size:
            if window_start <= t <= window_end:
                if policy == "prefill_first":
                    stale = run_last < start  # they also waited through the prompt-only step(s) before
                    n_stale = int(stale.sum())
                    if n_stale:
                        itl_values.append(float(t - run_last[stale][0]))
                        itl_weights.append(n_stale)
                    if run_id.size > n_stale:
                        itl_values.append(dt)
                        itl_weights.append(run_id.size - n_stale)
                else:
                    itl_values.append(dt)
                    itl_weights.append(int(run_id.size))
            run_last = np.full(run_id.size, t)
            remaining[run_id] -= 1
            run_ctx = run_ctx + 1
            fin = remaining[run_id] <= 0
            if fin.any():
                ids = run_id[fin]
                done[ids] = t
                pending -= int(measured[ids].sum())
                run_id, run_ctx, run_last = run_id[~fin], run_ctx[~fin], run_last[~fin]

        joined_ids = []
        for r, take, _ in segments:
            progress[r] += take
            if progress[r] >= need[r]:
                waiting.popleft()
                admitted_waiting -= 1
                reserved -= float(kv(cached[r] + need[r]))
                if np.isnan(first[r]):
                    first[r] = t
                if remaining[r] <= 0:
                    done[r] = t
                    pending -= int(measured[r])
                else:
                    joined_ids.append(r)
        if joined_ids:
            ids = np.asarray(joined_ids, dtype=np.int64)
            run_id = np.concatenate([run_id, ids])
            run_ctx = np.concatenate([run_ctx, (cached[ids] + need[ids]).astype(float)])
            run_last = np.concatenate([run_last, np.full(ids.size, t)])

        # recompute preemption: the cache overflowed as every sequence grew by one token
        if run_id.size > 1 and running_kv() + reserved > capacity:
            sizes = kv(run_ctx)
            over = float(sizes.sum()) + reserved - capacity
            drop = 0
            while over > 0 and run_id.size - drop > 1:
                drop += 1
                over -= float(sizes[-drop])
            for j in range(1, drop + 1):
                r = int(run_id[-j])
                need[r] = int(run_ctx[-j] - cached[r])
                progress[r] = 0
                admitted[r] = False
                waiting.appendleft(r)
            run_id, run_ctx, run_last = run_id[:-drop], run_ctx[:-drop], run_last[:-drop]
            preemptions += drop

    sel = measured
    tpot = np.where(osl[sel] > 1, (done[sel] - first[sel]) / np.maximum(osl[sel] - 1, 1), np.nan)
    ttft = first[sel] - arrivals[sel]
    trace = Trace(ttft, tpot, np.asarray(itl_values), np.asarray(itl_weights, dtype=float),
                  batch_time / t if t > 0 else 0.0, preemptions, steps,
                  stable and pending == 0 and not _growing(ttft), admitted_at[sel] - arrivals[sel], taken[sel])
    return first, done, trace


def _growing(ttft: np.ndarray) -> bool:
    """Whether the backlog grew through the run (an overload that a finite run still drains): the
    last tenth of the measured requests waited 3x longer than the first tenth, and a second more."""
    k = max(10, ttft.size // 10)
    if ttft.size < 2 * k or not np.all(np.isfinite(ttft)):
        return False
    return float(np.median(ttft[-k:])) > 3 * float(np.median(ttft[:k])) + 1.0


def run_prefill_pool(pm: PoolModel, servers: int, arrivals: np.ndarray, prompt: np.ndarray, cached: np.ndarray,
                     token_budget: int) -> tuple[np.ndarray, np.ndarray]:
    """End of each request's prefill in a pool of ``servers`` instances sharing one FIFO queue; a free
    instance takes every waiting prompt up to the token budget (the first always) in one step.
    Returns (end of prefill, s; duration of the step that ran it, s)."""
    n = arrivals.size
    step_time = _StepTimes(pm)
    free = np.zeros(servers)
    end, duration = np.empty(n), np.empty(n)
    head = 0
    while head < n:
        if head % CHECK_EVERY_STEPS == 0:
            budget.check()
        j = int(np.argmin(free))
        start = max(float(free[j]), float(arrivals[head]))
        last = head + 1
        tokens = int(prompt[head])
        while last < n and arrivals[last] <= start and tokens + prompt[last] <= token_budget:
            tokens += int(prompt[last])
            last += 1
        batch = slice(head, last)
        dt = step_time(0, 0.0, last - head, float(prompt[batch].mean()), float(cached[batch].mean()))
        free[j] = start + dt
        end[batch] = start + dt
        duration[batch] = dt
        head = last
    return end, duration


@dataclass(frozen=True)
class Requests:
    """Seeded Poisson arrivals (s) with drawn prompt and output lengths."""

    arrivals: np.ndarray
    isl: np.ndarray
    osl: np.ndarray
    cached: np.ndarray
    measured: np.ndarray

    @classmethod
    def draw(cls, w: Workload, rate: float, measured_requests: int, seed: int) -> Requests:
        rng = np.random.default_rng(seed)
        n = int(measured_requests * (1 + WARMUP_SHARE + EXTRA_ARRIVALS))
        ca2 = w.arrival_cv**2  # Gamma inter-arrivals of that squared cv (1: exponential, Poisson; 0: even)
        gaps = np.full(n, 1.0 / rate) if ca2 == 0 else rng.gamma(1.0 / ca2, ca2 / rate, n)
        arrivals = np.cumsum(gaps)
        isl = w.isl.sample(rng, n)
        osl = w.osl.sample(rng, n)
        cached = np.round(isl * w.prefix_hit).astype(np.int64)
        measured = np.zeros(n, dtype=bool)
        warm = int(measured_requests * WARMUP_SHARE)
        measured[warm:warm + measured_requests] = True
        return cls(arrivals, isl, osl, cached, measured)

    @classmethod
    def of_trace(cls, arrival_s: np.ndarray, isl: np.ndarray, osl: np.ndarray, prefix_hit: float) -> Requests:
        """A trace's requests as they came (the first WARMUP_SHARE not measured)."""
        isl = np.asarray(isl, dtype=np.int64)
        measured = np.zeros(isl.size, dtype=bool)
        measured[int(isl.size * WARMUP_SHARE):] = True
        return cls(np.asarray(arrival_s, dtype=float), isl, np.asarray(osl, dtype=np.int64),
                   np.round(isl * prefix_hit).astype(np.int64), measured)

    def share(self, instances: int, seed: int) -> Requests:
        """The requests one of ``instances`` instances gets from a router that spreads them at random."""
        if instances == 1:
            return self
        mine = np.random.default_rng(seed + 2).random(self.arrivals.size) < 1.0 / instances
        return Requests(self.arrivals[mine], self.isl[mine], self.osl[mine], self.cached[mine], self.measured[mine])


def run_deployment(model: ModelSpec, d: Deployment, w: Workload, pools: Sequence[PoolModel], requests: int = 3000,
                   seed: int = 0, replay: Requests | None = None) -> Trace:
    """Simulate the deployment's busiest view (one mixed/chunked instance, or the prefill pool and one
    decode instance) at the workload's rate, or on the requests of ``replay`` (a trace: a mixed/chunked
    instance gets a seeded random 1/k of them, as a router spreading them over k instances)."""
    from ..kv_cache import kv_cache_bytes
    from .disaggregated import kv_move_s

    if d.mode != "disaggregated":
        pm = pools[0]
        policy: Policy = "chunked" if d.mode == "chunked" else d.scheduler
        budget_tokens = d.chunk_tokens if d.mode == "chunked" else d.max_batched_tokens
        ranks = pm.pool.coupled_ranks  # attention-DP ranks that wait for each other: simulated together
        groups = pm.pool.engines // ranks
        rate = w.rate / groups
        r = Requests.draw(w, rate, requests, seed) if replay is None else replay.share(groups, seed)
        if ranks > 1:
            return run_lockstep(pm, policy, ranks, r.arrivals, r.isl - r.cached, r.cached, r.osl, r.measured,
                                budget_tokens, seed)
        _, _, trace = run_engine(pm, policy, r.arrivals, r.isl - r.cached, r.cached, r.osl, r.measured, budget_tokens)
        return trace
    pre, dec = pools
    n_dec = dec.pool.engines
    r = Requests.draw(w, w.rate, requests * n_dec, seed) if replay is None else replay
    assert d.decode is not None
    lengths = np.unique(r.isl)
    whole = np.array([kv_move_s(model, float(kv_cache_bytes(model, v, d.decode.kv_dtype, tp=d.decode.tp)), pre, dec, d.kv_link,
                                False, 0.0) for v in lengths])[np.searchsorted(lengths, r.isl)]
    if d.kv_transfer == "blocking":  # the prefill instance is held for each prompt's move (the mean prompt's)
        mean_move = kv_move_s(model, float(kv_cache_bytes(model, w.isl.mean, d.decode.kv_dtype, tp=d.decode.tp)),
                              pre, dec, d.kv_link, False, 0.0)
        pre, whole = pre.held(mean_move), np.zeros_like(whole)
    end, duration = run_prefill_pool(pre, pre.pool.engines, r.arrivals, r.isl - r.cached, r.cached,
                                     d.max_batched_tokens)
    if d.layerwise_kv_overlap and d.kv_transfer != "blocking":  # only what outlasts the prefill is visible
        L = model.num_layers
        whole = np.maximum(whole / L, whole - duration * (L - 1) / L)
    ready = end + whole
    mine = np.random.default_rng(seed + 1).random(r.arrivals.size) < 1.0 / n_dec
    order = np.argsort(ready[mine], kind="stable")
    idx = np.flatnonzero(mine)[order]
    _, _, trace = run_engine(dec, "decode", ready[idx], r.isl[idx] - r.cached[idx], r.cached[idx], r.osl[idx],
                             r.measured[idx], d.max_batched_tokens)
    ttft = trace.ttft_s + (ready[idx] - r.arrivals[idx])[r.measured[idx]]
    return Trace(ttft, trace.tpot_s, trace.itl_s, trace.itl_weight, trace.batch_mean, trace.preemptions, trace.steps,
                 trace.stable and not _growing(ttft), trace.admission_wait_s, trace.slots_taken)


class Simulation(BaseModel):
    """What ``simulate`` measured: percentiles of TTFT, TPOT (a request's mean gap) and ITL (every gap)."""

    model_config = ConfigDict(frozen=True)

    mode: str
    stable: bool = Field(description="False when the backlog kept growing (the rate overloads the deployment)")
    requests: int = Field(description="measured requests (after a 10% warm-up)")
    decode_batch: float = Field(description="time-average sequences running per (decode) instance")
    preemptions: int = Field(description="sequences preempted because the KV cache overflowed")
    ttft_by_percentile_s: dict[int, float]
    tpot_by_percentile_s: dict[int, float]
    itl_by_percentile_s: dict[int, float]
    attainment: float | None = Field(default=None, description="share of requests meeting TTFT and TPOT (joint)")


def simulate(model: ModelSpec | str, deployment: Deployment | Mapping[str, Any], workload: Workload | Mapping[str, Any],
             slo: SLO | Mapping[str, Any] | None = None, gpus: Sequence[GPUSpec | Mapping[str, Any]] | GPUSpec = (),
             requests: int = 3000, seed: int = 0, replay: Any = None, replay_format: str = "auto") -> Simulation:
    """Check one deployment by discrete-event simulation (see the module docstring for the engine).

    Slower than ``evaluate`` (about a second per thousand requests with long outputs) and seeded, so
    repeatable. ``requests`` is how many are measured (100 ... 50,000). Near capacity, and where KV memory
    binds, the queues mix slowly and a few thousand requests sample a few congested or quiet stretches, not
    the steady state that ``evaluate`` describes: there use 50,000 and several seeds (a KV-bound p90 TTFT at
    0.8 of capacity moved by 15-32% between three seeds of 12,000 requests and the same seeds run to 50,000;
    the serving validation page, docs/serving-validation.md). ``replay`` (a trace file, see
    ``calculator.traces``) plays the trace's own requests, arrival times and lengths, instead of drawing
    them from ``workload`` (whose ``prefix_hit`` still applies); at most 50,000 requests of it.
    """
    from ..arguments import as_model, integer, model_spec
    from . import _pool_models, check_context

    m = model_spec(model)
    d = as_model("deployment", deployment, Deployment)
    w = as_model("workload", workload, Workload)
    s = None if slo is None else as_model("slo", slo, SLO)
    requests = integer("requests", requests, 100, MAX_SIM_REQUESTS)
    seed = integer("seed", seed, 0, 2**32 - 1)
    check_context(m, w)
    pools = _pool_models(m, d, w, gpus)
    if any(pm.pool.spec is not None for pm in pools):
        raise InputError("deployment", "speculative decoding is not simulated yet (evaluate models it in closed form)")
    bad = next((pm for pm in pools if not pm.fits), None)
    if bad is not None:
        raise InputError("deployment", bad.reason or "does not fit")
    replayed = None
    if replay is not None:
        from ..traces import read_trace

        t = read_trace(replay, replay_format)  # type: ignore[arg-type]
        if t.arrival_s.size > MAX_SIM_REQUESTS:
            raise InputError("replay", f"{t.arrival_s.size:,} requests; at most {MAX_SIM_REQUESTS:,} are simulated "
                                       "(cut a window with calculator.traces.read_trace(window=...))")
        if t.arrival_s.size < 20:
            raise InputError("replay", f"{t.arrival_s.size} requests; a replay needs at least 20")
        replayed = Requests.of_trace(t.arrival_s, t.isl, t.osl, w.prefix_hit)
    trace = run_deployment(m, d, w, pools, requests, seed, replayed)
    return Simulation(
        mode=d.mode, stable=trace.stable, requests=int(trace.ttft_s.size), decode_batch=trace.batch_mean,
        preemptions=trace.preemptions,
        ttft_by_percentile_s={p: trace.ttft_p(p) for p in PERCENTILES} if trace.stable else {},
        tpot_by_percentile_s={p: trace.tpot_p(p) for p in PERCENTILES} if trace.stable else {},
        itl_by_percentile_s={p: trace.itl_p(p) for p in PERCENTILES} if trace.stable else {},
        attainment=trace.attainment(s) if s is not None and trace.stable else None,
    )
