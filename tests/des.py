"""A small discrete-event simulation of each serving mode: the test oracle for the closed forms.

It runs the same step-time functions (PoolModel) iteration by iteration with seeded Poisson
arrivals, so any disagreement comes from the queueing and fixed-point approximations alone.
"""

from __future__ import annotations

import numpy as np

from calculator.serving.base import PoolModel


def _decode_step(pm: PoolModel, running: dict[int, int], done: np.ndarray, t: float, ctx: float,
                 cache: dict[int, float]) -> float:
    """One continuous-batching decode iteration: every running request emits a token; returns the new time."""
    b = len(running)
    if b not in cache:
        cache[b] = float(pm.decode_s(b, ctx))
    t += cache[b]
    for r in list(running):
        running[r] -= 1
        if running[r] <= 0:
            done[r] = t
            del running[r]
    return t


def simulate_mixed(pm: PoolModel, rate: float, isl: int, osl: int, n: int = 3000, seed: int = 0):
    """One instance, prefill prioritised (one prefill per step), continuous-batched decode."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    prefill = float(pm.prefill_s(isl))
    ctx = isl + (osl + 1) / 2
    decode_cache: dict[int, float] = {}
    t, i = 0.0, 0
    queue: list[int] = []
    running: dict[int, int] = {}  # request -> tokens still to emit
    first, done = np.full(n, np.nan), np.full(n, np.nan)
    while i < n or queue or running:
        while i < n and arrivals[i] <= t:
            queue.append(i)
            i += 1
        if queue:
            r = queue.pop(0)
            t += prefill
            first[r] = t
            if osl > 1:
                running[r] = osl - 1
            else:
                done[r] = t
        elif running:
            t = _decode_step(pm, running, done, t, ctx, decode_cache)
        else:
            t = arrivals[i]
    ttft = first - arrivals
    tpot = (done - first) / max(osl - 1, 1)
    warm = slice(n // 10, None)
    return ttft[warm], tpot[warm]


def simulate_disaggregated(pre: PoolModel, dec: PoolModel, n_prefill: int, rate_total: float, isl: int, osl: int,
                           kv_s: float, n: int = 3000, seed: int = 0):
    """N prefill servers sharing one FIFO queue; one decode instance fed at rate_total (1 decode instance)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate_total, n))
    s = float(pre.prefill_s(isl))
    free = np.zeros(n_prefill)
    ready = np.empty(n)
    ttft = np.empty(n)
    for k, a in enumerate(arrivals):
        j = int(np.argmin(free))
        start = max(a, free[j])
        free[j] = start + s
        ttft[k] = start + s + kv_s - a
        ready[k] = start + s + kv_s
    order = np.argsort(ready)
    ctx = isl + (osl + 1) / 2
    t, idx = 0.0, 0
    running: dict[int, int] = {}
    first_dec = np.full(n, np.nan)
    done = np.full(n, np.nan)
    cache: dict[int, float] = {}
    while idx < n or running:
        while idx < n and ready[order[idx]] <= t:
            r = int(order[idx])
            running[r] = osl - 1
            first_dec[r] = t
            idx += 1
        if not running:
            t = ready[order[idx]]
            continue
        t = _decode_step(dec, running, done, t, ctx, cache)
    tpot = (done - first_dec) / max(osl - 1, 1)
    warm = slice(n // 10, None)
    return ttft[warm], tpot[warm]


def simulate_chunked(pm: PoolModel, rate: float, isl: int, osl: int, chunk: int, n: int = 2000, seed: int = 0):
    """One instance, Sarathi-style hybrid iterations: every running decode plus up to chunk - B prompt
    tokens taken FIFO from waiting prompts (a prompt may span iterations, an iteration several prompts).
    A prompt's last chunk emits its first token; the request then decodes osl - 1 more tokens."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    ctx = isl + (osl + 1) / 2
    step_cache: dict[tuple[int, int, int], float] = {}

    def step(b: int, tokens: int, prefix: int) -> float:
        key = (b, 8 * round(tokens / 8), 128 * round(prefix / 128))
        if key not in step_cache:
            step_cache[key] = float(pm.hybrid_s(b, ctx, key[1], key[2]))
        return step_cache[key]

    t, i = 0.0, 0
    waiting: list[list[int]] = []  # [request, prompt tokens already prefilled]
    running: dict[int, int] = {}
    first, done = np.full(n, np.nan), np.full(n, np.nan)
    while i < n or waiting or running:
        while i < n and arrivals[i] <= t:
            waiting.append([i, 0])
            i += 1
        if not waiting and not running:
            t = arrivals[i]
            continue
        budget = max(chunk - len(running), 0)
        taken, finished, prefix = 0, [], waiting[0][1] if waiting else 0
        for entry in waiting:
            if taken >= budget:
                break
            take = min(isl - entry[1], budget - taken)
            entry[1] += take
            taken += take
            if entry[1] >= isl:
                finished.append(entry)
        t += step(len(running), taken, prefix)
        for r in list(running):
            running[r] -= 1
            if running[r] <= 0:
                done[r] = t
                del running[r]
        for entry in finished:
            waiting.remove(entry)
            first[entry[0]] = t
            if osl > 1:
                running[entry[0]] = osl - 1
            else:
                done[entry[0]] = t
    ttft = first - arrivals
    tpot = (done - first) / max(osl - 1, 1)
    warm = slice(n // 10, None)
    return ttft[warm], tpot[warm]
