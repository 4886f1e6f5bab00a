"""A closed-loop benchmark client against one engine instance: ``concurrency`` requests always in flight.

This is what ``vllm bench serve --max-concurrency N``, SGLang's ``bench_serving --max-concurrency``,
genai-perf's ``--concurrency`` and ``trtllm-bench`` at a fixed concurrency measure: the client sends a request
whenever one completes, so the engine always holds N requests, and nothing is Poisson about it. An open-loop
queue at the run's throughput with a batch cap of N is saturated by construction (its utilisation is one), so
the serving modes cannot describe such a run; this module does, with the engine's own step times and the
hybrid scheduler of current engines (running decodes and new prompts in one step, a step's token budget
``max_batched_tokens``: vLLM V1, SGLang, TensorRT-LLM's in-flight batching).

Mean-value model: the engine runs n = min(N, the KV and batch limit) sequences at the mean context; a prompt
rides in one step beside the n - 1 others (in chunks of the budget's room when it does not fit one), and what
it adds to that step stalls every other request's decode (``closed_loop_stall_share``, ``mixed_tpot``); the
requests beyond n wait for a slot (Little's law); the completion rate closes the loop
(``closed_loop_throughput``), solved by fixed-point iteration. TTFT is as the client sees it (``served_ttft``).
Lengths are the means (a run of fixed lengths; with a spread, its mean latencies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import formulas as f
from .base import PoolModel
from .workload import Workload

ITERATIONS = 60


@dataclass(frozen=True)
class ClosedLoop:
    """One instance under a closed loop of ``concurrency`` requests: means over requests, seconds."""

    concurrency: int
    running: float
    """sequences the engine runs at once (min of the concurrency and its KV / batch limit)"""
    throughput_rps: float
    ttft_s: float
    """mean time to first token as the client measures it"""
    tpot_s: float
    """mean time per output token (each request's inter-token gaps)"""
    prompt_s: float
    """a prompt's own engine time, its step (or chunk steps) beside the running decodes"""
    stall_share: float
    slot_wait_s: float
    """mean wait for a slot of the requests beyond the engine's limit"""


def closed_loop(pm: PoolModel, isl: float, osl: float, concurrency: int, max_batched_tokens: int = 8192
                ) -> ClosedLoop:
    """Mean TTFT, TPOT and throughput of one engine instance (``pm``) with ``concurrency`` requests of ``isl``
    prompt and ``osl`` output tokens always in flight (see the module docstring)."""
    n_total = int(concurrency)
    limit = pm.batch_limit(Workload(rate=1.0, isl=isl, osl=osl))
    n = float(max(1.0, min(n_total, math.floor(limit))))
    others = n - 1.0
    ctx = isl + (osl + 1) / 2
    room = max(float(max_batched_tokens) - others, 1.0)
    pieces = max(1, math.ceil(isl / room))
    piece = isl / pieces
    # each piece rides in a step beside the other requests' decodes, after the pieces before it
    prefixes = piece * np.arange(pieces)
    steps = np.asarray(pm.step_s(others, ctx, piece, prefixes), dtype=float)
    plain = float(np.asarray(pm.decode_s(others, ctx))) if others > 0 else 0.0
    prompt_s = float(steps.sum())
    x = prompt_s - pieces * plain  # what the prompt adds to the steps it rides in
    t_d = float(np.asarray(pm.decode_s(n, ctx)))
    t_req = pm.gpu.efficiency.request_overhead_us * 1e-6
    x_step = x / pieces  # what one piece adds to its step
    X, tpot, rho, own = 0.0, t_d, 0.0, prompt_s
    for _ in range(ITERATIONS):
        rho = float(f.closed_loop_stall_share(X_c=X, x_p=x, N_c=n))
        tpot = float(f.mixed_tpot(t_d=t_d, rho_p=min(rho, 0.999)))
        # a new prompt waits for the step in progress, half a step on average (none when alone: its arrival
        # follows a completion at a step's end, so the step is not length-biased as at a random instant), and a
        # whole prompt shares its step with the other prompts that arrived meanwhile: q, the share of steps
        # that carry another request's prompt piece, each adding x_step
        q = min(1.0, X * tpot * pieces * others / n)
        residual = others / n * tpot / 2
        own = residual + prompt_s + (q * x_step if pieces == 1 else 0.0)
        X_new = float(f.closed_loop_throughput(N_c=n, t_req=t_req, S_own=own, n_out=osl, TPOT=tpot))
        if abs(X_new - X) <= 1e-9 * X_new:
            X = X_new
            break
        X = X_new
    slot_wait = (n_total - n) / X if n_total > n else 0.0
    ttft = float(f.served_ttft(T_eng=slot_wait + own, t_req=t_req))
    return ClosedLoop(concurrency=n_total, running=n, throughput_rps=X, ttft_s=ttft, tpot_s=tpot,
                      prompt_s=prompt_s, stall_share=rho, slot_wait_s=slot_wait)


__all__ = ["ClosedLoop", "closed_loop"]
