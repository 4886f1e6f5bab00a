"""Saturated (offline) throughput of one instance: every slot busy, as trtllm-bench measures it.

A batch of B requests (B = the KV-memory limit, capped by the engine's batch limit) needs B prefills
and ``osl`` decode steps; with in-flight batching the two interleave but the work adds up, so

    output tokens/s = B * osl / (B * t_prefill_per_request + osl * t_decode(B, mean context)).

Prefills are packed up to the engine's token budget per step (several short prompts per step).

With attention data-parallelism the dp ranks step together, and unless the engine makes them take their
prompts in the same steps (``dp_balance``: TensorRT-LLM's ``attention_dp_config.enable_balance``), a prefill
on one rank stretches every rank's step: a rank carries c = B / osl prompts per decode step, and a step
carries some rank's prompt with probability q_any = 1 - (1 - c)^dp (``dp_busy_steps``), so the mean step is
t_decode + q_any t_prefill (``dp_mean_step``) instead of t_decode + c t_prefill, with t_prefill that of the
dp c / q_any ranks that prefill in such a step (the routed experts see their prompts alone).
"""

from __future__ import annotations

import math

import numpy as np

from .estimate import DEFAULT_MAX_BATCHED_TOKENS, memory_breakdown
from .formulas import dp_busy_steps, dp_mean_step
from .formulas import max_batch as max_batch_formula
from .phases import Setup, step_groups, step_time_s

DEFAULT_ENGINE_MAX_BATCH = 2048
"""trtllm-bench / vLLM-style cap on concurrent sequences per instance."""


def prefill_time_per_request_s(setup: Setup, isl: int, max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
                               prompt_ranks: float | None = None) -> float:
    """Prefill step time divided by the requests packed into one step of at most the token budget;
    ``prompt_ranks``: on that many attention data-parallel ranks at once, the others not prefilling
    (``step_groups``; None: all)."""
    per_step = max(1, max_batched_tokens // isl)
    t = float(step_time_s(step_groups(setup, S=isl, P=0, b=per_step, phase="prefill", prompt_ranks=prompt_ranks),
                          setup))
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
                       gpu_memory_utilisation: float = 0.9, engine_max_batch: int = DEFAULT_ENGINE_MAX_BATCH,
                       dp_balance: bool = False) -> float:
    """Output tokens/s of one instance (all its GPUs) at saturation, or with a fixed static ``batch``.
    With attention data-parallelism each of the dp ranks runs its own batch (the saturated one, or
    ``batch`` / dp), and the instance's throughput is dp times a rank's; its ranks wait for each other's
    prefills unless ``dp_balance`` (the module docstring)."""
    if batch is not None:
        b = max(1, round(batch / setup.dp))
    else:
        b = saturated_batch(setup, isl, osl, gpu_memory_utilisation, engine_max_batch)
    if b < 1:
        return 0.0
    t_pre = prefill_time_per_request_s(setup, isl)
    mean_ctx = isl + (osl + 1) / 2
    t_dec = float(step_time_s(step_groups(setup, S=1, P=np.asarray(mean_ctx - 1), b=b, phase="decode"), setup))
    if not math.isfinite(t_dec):
        return 0.0
    if setup.dp == 1 or dp_balance:
        return setup.dp * b * osl / (b * t_pre + osl * t_dec)
    per_step = b / osl  # a rank's prompts per decode step
    q_any = float(dp_busy_steps(q_own=min(per_step, 1.0), n_dp=float(setup.dp)))
    if per_step < 1:  # a step's prefills are those of the n c / q_any ranks that carry one, on average
        t_pre = prefill_time_per_request_s(setup, isl, prompt_ranks=setup.dp * per_step / max(q_any, 1e-12))
    step = float(dp_mean_step(t_d=t_dec, q_any=q_any, t_b=t_dec + t_pre * max(per_step, 1.0)))
    return setup.dp * b / step
