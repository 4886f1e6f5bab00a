"""Saturated (offline) throughput of one instance: every slot busy, as trtllm-bench measures it.

A batch of B requests (B = the KV-memory limit, capped by the engine's batch limit) needs B prefills
and ``osl`` decode steps; with in-flight batching the two interleave but the work adds up, so

    output tokens/s = B * osl / (B * t_prefill_per_request + osl * t_decode(B, mean context)).

Prefills are packed up to the engine's token budget per step (several short prompts per step).
"""

from __future__ import annotations

import math

import numpy as np

from .estimate import DEFAULT_MAX_BATCHED_TOKENS, memory_breakdown
from .formulas import max_batch as max_batch_formula
from .phases import Setup, step_groups, step_time_s

DEFAULT_ENGINE_MAX_BATCH = 2048
"""trtllm-bench / vLLM-style cap on concurrent sequences per instance."""


def prefill_time_per_request_s(setup: Setup, isl: int, max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS) -> float:
    """Prefill step time divided by the requests packed into one step of at most the token budget."""
    per_step = max(1, max_batched_tokens // isl)
    t = float(step_time_s(step_groups(setup, S=isl, P=0, b=per_step, phase="prefill"), setup))
    return t / per_step


def saturated_batch(setup: Setup, isl: int, osl: int, gpu_memory_utilisation: float = 0.9,
                    engine_max_batch: int = DEFAULT_ENGINE_MAX_BATCH) -> int:
    """Sequences one attention data-parallel rank (the whole instance when dp = 1) runs at saturation:
    what its KV memory holds, within its share of the engine's cap."""
    mem = memory_breakdown(setup, isl, osl, 1, gpu_memory_utilisation)
    fit = int(max_batch_formula(u=gpu_memory_utilisation, M_hbm=mem.hbm_bytes, W_b=mem.weights_bytes,
                                A_b=mem.activation_workspace_bytes, R_b=mem.runtime_reserve_bytes,
                                K_seq=mem.kv_bytes_per_sequence))
    return min(fit, engine_max_batch // setup.dp)  # per attention data-parallel rank


def offline_throughput(setup: Setup, isl: int, osl: int, batch: int | None = None,
                       gpu_memory_utilisation: float = 0.9, engine_max_batch: int = DEFAULT_ENGINE_MAX_BATCH) -> float:
    """Output tokens/s of one instance (all its GPUs) at saturation, or with a fixed static ``batch``.
    With attention data-parallelism each of the dp ranks runs its own batch (the saturated one, or
    ``batch`` / dp), and the instance's throughput is dp times a rank's."""
    if batch is not None:
        b = max(1, round(batch / setup.dp))
    else:
        b = saturated_batch(setup, isl, osl, gpu_memory_utilisation, engine_max_batch)
    if b < 1:
        return 0.0
    t_pre = prefill_time_per_request_s(setup, isl)
    mean_ctx = isl + (osl + 1) / 2
    t_dec = float(step_time_s(step_groups(setup, S=1, P=np.asarray(mean_ctx - 1), b=b, phase="decode"), setup))
    return setup.dp * b * osl / (b * t_pre + osl * t_dec) if math.isfinite(t_dec) else 0.0
