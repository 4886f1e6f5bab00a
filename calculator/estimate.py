"""``estimate``: prefill time, decode step time, KV size and memory fit of one configuration.

No queueing here (see ``calculator.serving``): TTFT is the prefill step itself, TPOT is the decode
step at the mean context of the generation, and E2E = TTFT + (osl - 1) * TPOT.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hardware_db.schema import Efficiency, GPUSpec, KVDtype, ModelSpec, WeightDtype

from . import formulas as f
from .arguments import as_model, choice, flag, gpu_spec, integer, model_spec, real
from .engines import engine_gpu
from .errors import InputError
from .kv_cache import kv_bytes_per_gpu, kv_bytes_per_token, kv_cache_bytes
from .limits import MAX_BATCH, MAX_EXPERT_PARALLEL, MAX_PARALLEL, MAX_TOKENS
from .params import embedding_params, param_count, routed_expert_params
from .phases import (DEFAULT_EXPERT_IMBALANCE, Group, Setup, phase_bound, setup_for, step_groups, step_overhead_s,
                     step_time_s)
from .precision import EMBEDDING_BYTES, GEMM_RATE, KV_DTYPES, WEIGHT_DTYPES, wide_bytes
from .speculation import Speculation, draft_setup, speculative_groups

RUNTIME_RESERVE_BYTES = 2.0e9
"""Per-GPU memory no engine can give to KV: CUDA context, cuBLAS/NCCL workspaces, CUDA graphs (~1-3 GB in vLLM)."""

DEFAULT_MAX_BATCHED_TOKENS = 8192
"""Tokens of one forward that the activation workspace is sized for (vLLM / TRT-LLM default budget)."""

BoundName = Literal["compute", "memory", "communication", "latency"]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class OpRow(_Out):
    """One operator group of one phase, or the step's fixed overhead (group ``step_overhead``); the rows of a
    phase add up to its step: ``prefill_s``, and the decode step at the mean context (``tpot_s``; with
    speculative decoding ``tpot_s`` x ``spec_tokens_per_step``)."""

    phase: Literal["prefill", "decode"]
    group: str
    flops: float = Field(description="FLOPs on one GPU for the step")
    bytes: float = Field(description="bytes moved on one GPU (HBM or link)")
    arithmetic_intensity: float | None = Field(description="FLOP per byte; None for communication")
    bound: BoundName
    time_s: float
    formula: str = Field(description="name of the formula in calculator.formulas that timed it")


class MemoryBreakdown(_Out):
    """Per-GPU memory of the configuration, bytes."""

    hbm_bytes: float
    usable_bytes: float = Field(description="hbm_bytes x gpu_memory_utilisation")
    weights_bytes: float
    activation_workspace_bytes: float
    runtime_reserve_bytes: float
    kv_budget_bytes: float = Field(description="usable - weights - workspace - reserve (negative: does not fit)")
    kv_bytes_per_sequence: float = Field(description="KV of one isl+osl sequence on one GPU")
    kv_bytes_batch: float = Field(description="KV of the requested batch on one GPU")
    fits: bool
    shortfall_bytes: float = Field(description="bytes missing per GPU for the weights and the batch's KV; 0 if it fits")


class Estimate(_Out):
    """Closed-form latency, memory and bounds of one model on one GPU type with one layout."""

    model: str
    gpu: str
    engine: str = Field(default="generic", description="the engine profile whose efficiencies were used (generic: "
                        "the GPU entry's own; calibration: the user's fit)")
    efficiency_fitted_on: str | None = Field(default=None, description="what the efficiencies were fitted on")
    tp: int
    pp: int
    ep: int
    dp: int = Field(description="attention data-parallel ranks (each tp GPUs with its own sequences)")
    cp: int = Field(default=1, description="context-parallel ranks (each tp GPUs; prompts split, KV sharded over them)")
    isl: int
    osl: int
    batch: int
    weight_dtype: str
    kv_dtype: str
    prefix_hit: float
    fits: bool
    reason: str | None = Field(description="why it does not fit, None when it does")
    num_gpus: int
    ttft_s: float | None = Field(description="time to first token of a lone request: the prefill step plus the "
                                 "engine profile's request path (``served_ttft``; 0 unless a profile or "
                                 "calibration sets ``request_overhead_us``), no queueing")
    prefill_s: float | None
    tpot_s: float | None = Field(description="decode step time at the mean context isl + (osl+1)/2; with pp > 1 the "
                                 "step of one micro-batch of batch / pp sequences (pp of them in flight); with "
                                 "speculative decoding a step over the tokens it emits")
    spec_tokens_per_step: float | None = Field(default=None, description="speculative decoding: tokens a step "
                                               "emits per sequence")
    e2e_s: float | None = Field(description="ttft + (osl - 1) * tpot")
    decode_first_step_s: float | None
    decode_last_step_s: float | None
    output_tokens_per_s: float | None = Field(description="batch / tpot: decode throughput of the instance")
    kv_bytes_per_token: float = Field(description="all layers, tp=1, before any sliding-window cap")
    kv_cache_bytes: float = Field(description="KV of the whole batch at isl+osl tokens, all layers, all GPUs")
    weights_bytes_per_gpu: float
    max_batch: int = Field(description="sequences of isl+osl tokens whose KV fits per instance (all dp ranks)")
    memory: MemoryBreakdown
    prefill_bound: BoundName | None
    decode_bound: BoundName | None
    prefill_intensity_flops_per_byte: float | None
    decode_intensity_flops_per_byte: float | None
    ridge_point_flops_per_byte: float = Field(description="GEMM peak / HBM bandwidth of the GPU (datasheet)")
    rows: tuple[OpRow, ...] = ()


def _rows(phase: Literal["prefill", "decode"], groups: list[Group], overhead_s: float) -> list[OpRow]:
    """The operator groups of one step and its fixed overhead: together the step's time."""
    rows = []
    for gr in groups:
        fl, by, bound = float(gr.flops), float(gr.bytes), gr.bound.item()
        rows.append(OpRow(
            phase=phase, group=gr.name, flops=fl, bytes=by,
            arithmetic_intensity=None if bound == "communication" or by == 0 else fl / by,
            bound=bound, time_s=float(gr.time_s), formula=gr.formula,
        ))
    rows.append(OpRow(phase=phase, group="step_overhead", flops=0.0, bytes=0.0, arithmetic_intensity=None,
                      bound="latency", time_s=overhead_s, formula="step_overhead_time"))
    return rows


def memory_breakdown(
    setup: Setup,
    isl: int,
    osl: int,
    batch: int,
    gpu_memory_utilisation: float = 0.9,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    spec: Speculation | None = None,
) -> MemoryBreakdown:
    """Per-GPU memory; with ``spec`` the draft network's weights and KV cache are on the same GPUs (an
    MTP layer or EAGLE head shares the target's embedding and LM head; a draft model has its own)."""
    m, g = setup.model, setup.gpu
    weights = _weights_per_gpu(setup)
    workspace = float(f.activation_workspace_bytes(setup.values, T=max_batched_tokens,
                                                   b=min(batch, max_batched_tokens))) / setup.pp
    # context parallelism shards every sequence's KV over the cp ranks
    per_seq = float(kv_bytes_per_gpu(m, isl + osl, setup.kv_dtype, tp=setup.tp, pp=setup.pp)) / setup.cp
    if spec is not None:
        ds = draft_setup(setup, spec)
        shares_head = spec.kind != "draft"
        weights += _weights_per_gpu(ds) - (_embedding_bytes_per_gpu(ds) if shares_head else 0.0)
        per_seq += float(kv_bytes_per_gpu(ds.model, isl + osl, setup.kv_dtype, tp=setup.tp)) / setup.cp
    mem = dict(u=gpu_memory_utilisation, M_hbm=g.hbm_bytes, W_b=weights, A_b=workspace, R_b=RUNTIME_RESERVE_BYTES)
    budget = float(f.kv_budget_bytes(mem))
    need = per_seq * batch
    fits = budget >= need and budget > 0
    return MemoryBreakdown(
        hbm_bytes=g.hbm_bytes, usable_bytes=g.hbm_bytes * gpu_memory_utilisation, weights_bytes=weights,
        activation_workspace_bytes=workspace, runtime_reserve_bytes=RUNTIME_RESERVE_BYTES, kv_budget_bytes=budget,
        kv_bytes_per_sequence=per_seq, kv_bytes_batch=need, fits=fits,
        shortfall_bytes=0.0 if fits else need - budget,
    )


def _weights_per_gpu(setup: Setup) -> float:
    """Weight bytes one GPU holds (attention-DP: every rank holds the attention and dense weights, the
    routed experts are spread over all ranks)."""
    m = setup.model
    shared = param_count(m) - routed_expert_params(m) * (1 - 1 / setup.dp)
    return float(f.weights_bytes_per_gpu(setup.values, N=shared, N_emb=embedding_params(m),
                                         b_e=wide_bytes(setup.weight_dtype, EMBEDDING_BYTES), pp=setup.pp))


def _embedding_bytes_per_gpu(setup: Setup) -> float:
    """The embedding and LM head's share of ``_weights_per_gpu``."""
    return wide_bytes(setup.weight_dtype, EMBEDDING_BYTES) * embedding_params(setup.model) / (setup.tp * setup.pp)


def _check_arguments(tp: int, pp: int, ep: int, dp: int, isl: int, osl: int, batch: int, weight_dtype: str,
                     kv_dtype: str, prefix_hit: float, gpu_memory_utilisation: float, rows: bool, m: ModelSpec
                     ) -> tuple[int, ...]:
    """The integers as ints; every argument checked against the REST bounds and the context window."""
    ints = tuple(integer(name, value, 1, high) for name, value, high in (
        ("tp", tp, MAX_PARALLEL), ("pp", pp, MAX_PARALLEL), ("ep", ep, MAX_EXPERT_PARALLEL), ("dp", dp, MAX_EXPERT_PARALLEL),
        ("isl", isl, MAX_TOKENS), ("osl", osl, MAX_TOKENS), ("batch", batch, MAX_BATCH)))
    choice("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    choice("kv_dtype", kv_dtype, KV_DTYPES)
    real("prefix_hit", prefix_hit, 0.0, 1.0, high_open=True)
    real("gpu_memory_utilisation", gpu_memory_utilisation, 0.0, 1.0, low_open=True)
    flag("rows", rows)
    if isl + osl > m.max_position_embeddings:
        raise InputError("isl", f"isl + osl = {isl + osl:,} tokens exceeds {m.id}'s context window of "
                                f"{m.max_position_embeddings:,} tokens")
    return ints


def estimate(
    model: ModelSpec | str,
    gpu: GPUSpec | str,
    tp: int = 1,
    pp: int = 1,
    isl: int = 1024,
    osl: int = 256,
    batch: int = 1,
    weight_dtype: WeightDtype = "bf16",
    kv_dtype: KVDtype = "bf16",
    prefix_hit: float = 0.0,
    ep: int = 1,
    gpu_memory_utilisation: float = 0.9,
    dp: int = 1,
    expert_imbalance: float = DEFAULT_EXPERT_IMBALANCE,
    spec: Speculation | Mapping[str, Any] | None = None,
    cp: int = 1,
    calibration: Efficiency | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    rows: bool = True,
    engine: str = "generic",
) -> Estimate:
    """Prefill, decode, KV and memory of ``batch`` requests of ``isl`` prompt and ``osl`` output tokens.

    ``prefix_hit`` is the fraction of the prompt already in the prefix cache (not recomputed).
    ``model`` and ``gpu`` are database ids or specs. ``calibration`` is an ``Efficiency`` (or a
    mapping of its fields, or a path to a calibration YAML) that replaces the GPU's default
    efficiencies. ``engine`` names an engine profile (``list_engines()``; ``generic``, the default, keeps
    the GPU entry's own efficiencies); it cannot be combined with a calibration. A configuration that does not fit is returned with ``fits=False``, the reason and
    the shortfall, and no latency figures. Invalid arguments raise ``InputError`` naming the
    argument; the bounds are the REST API's (``calculator.limits``).
    """
    m = model_spec(model)
    g = gpu_spec(gpu)
    tp, pp, ep, dp, isl, osl, batch = _check_arguments(tp, pp, ep, dp, isl, osl, batch, weight_dtype, kv_dtype,
                                                       prefix_hit, gpu_memory_utilisation, rows, m)
    real("expert_imbalance", expert_imbalance, 1.0, 16.0)
    cp = integer("cp", cp, 1, MAX_PARALLEL)  # tp, pp, ep, dp above; cp with them in the REST bounds
    if spec is not None:
        spec = as_model("spec", spec, Speculation)
    g = engine_gpu(g, engine, calibration)
    setup = setup_for(m, g, tp=tp, pp=pp, ep=ep, weight_dtype=weight_dtype, kv_dtype=kv_dtype, dp=dp,
                      expert_imbalance=float(expert_imbalance), cp=cp)
    # attention-DP: the batch is spread over the dp ranks, each with its own sequences and KV
    rank_batch = -(-batch // dp)
    mem = memory_breakdown(setup, isl, osl, rank_batch, gpu_memory_utilisation, spec=spec)
    per_seq = mem.kv_bytes_per_sequence
    max_b = dp * int(f.max_batch(u=gpu_memory_utilisation, M_hbm=g.hbm_bytes, W_b=mem.weights_bytes,
                                 A_b=mem.activation_workspace_bytes, R_b=mem.runtime_reserve_bytes, K_seq=per_seq))
    common = dict(
        spec_tokens_per_step=None if spec is None else spec.tokens_per_step,
        engine="calibration" if calibration is not None else engine, efficiency_fitted_on=g.efficiency.fitted_on,
        model=m.id, gpu=g.id, tp=tp, pp=pp, ep=ep, dp=dp, isl=isl, osl=osl, batch=batch, weight_dtype=weight_dtype,
        kv_dtype=kv_dtype, prefix_hit=prefix_hit, num_gpus=tp * pp * dp * cp, cp=cp,
        kv_bytes_per_token=kv_bytes_per_token(m, kv_dtype),
        kv_cache_bytes=float(kv_cache_bytes(m, isl + osl, kv_dtype, tp=tp)) * batch,
        weights_bytes_per_gpu=mem.weights_bytes, max_batch=max_b, memory=mem,
        ridge_point_flops_per_byte=g.ridge_point_flops_per_byte(GEMM_RATE[weight_dtype]),
    )
    if not mem.fits:
        return Estimate(
            fits=False, reason=_not_fit_reason(m, g, setup, mem, batch), ttft_s=None, prefill_s=None, tpot_s=None,
            e2e_s=None, decode_first_step_s=None, decode_last_step_s=None, output_tokens_per_s=None,
            prefill_bound=None, decode_bound=None, prefill_intensity_flops_per_byte=None,
            decode_intensity_flops_per_byte=None, **common,
        )
    cached = int(round(isl * prefix_hit))
    new = isl - cached
    # attention-DP ranks are taken as equally loaded (an idle rank still joins every MoE step, as engines pad
    # it with a dummy batch), so with fewer requests than ranks this over-counts the expert work
    pre = step_groups(setup, S=new, P=cached, b=max(batch / dp, 1.0), phase="prefill")
    prefill_s = float(step_time_s(pre, setup))
    mean_ctx = isl + (osl + 1) / 2
    contexts = np.array([isl + 1, mean_ctx, isl + osl], dtype=float)
    # pipeline parallelism: the batch decodes as pp micro-batches in flight, one per stage (a step
    # of a micro-batch crosses every stage; the stages work on the others meanwhile)
    micro_batch = max(batch / (pp * dp), 1.0)
    if spec is None:
        dec = step_groups(setup, S=1, P=contexts - 1, b=micro_batch, phase="decode")
        dec_times = step_time_s(dec, setup)
    else:  # a speculative step, over the tokens it emits (spec_tpot)
        dec = speculative_groups(setup, spec, micro_batch, contexts)
        dec_times = step_time_s(dec, setup) / spec.tokens_per_step
    first, mean, last = (float(x) for x in dec_times)
    overhead = step_overhead_s(setup)
    ttft_s = float(f.served_ttft(T_eng=prefill_s, t_req=setup.gpu.efficiency.request_overhead_us * 1e-6))
    dec_mean = [gr.at(1) for gr in dec]  # the step at the mean context
    return Estimate(
        fits=True, reason=None, ttft_s=ttft_s, prefill_s=prefill_s, tpot_s=mean,
        e2e_s=ttft_s + (osl - 1) * mean, decode_first_step_s=first, decode_last_step_s=last,
        output_tokens_per_s=batch / mean,
        prefill_bound=phase_bound(pre, setup).item(), decode_bound=phase_bound(dec_mean, setup).item(),
        prefill_intensity_flops_per_byte=_intensity(pre), decode_intensity_flops_per_byte=_intensity(dec_mean),
        rows=tuple(_rows("prefill", pre, overhead) + _rows("decode", dec_mean, overhead)) if rows else (),
        **common,
    )


def _intensity(groups: list[Group]) -> float:
    fl = sum(float(gr.flops) for gr in groups)
    by = sum(float(gr.bytes) for gr in groups if not gr.communication)
    return fl / by if by else float("inf")


def _not_fit_reason(m: ModelSpec, g: GPUSpec, setup: Setup, mem: MemoryBreakdown, batch: int) -> str:
    gb = 1e9
    fixed = mem.weights_bytes + mem.activation_workspace_bytes + mem.runtime_reserve_bytes
    where = f"{m.id} on {g.id} at tp={setup.tp} pp={setup.pp} ({setup.weight_dtype} weights)"
    if mem.kv_budget_bytes <= 0:
        return (
            f"weights do not fit: {where} needs {fixed / gb:.1f} GB per GPU for weights, workspace and runtime "
            f"but only {mem.usable_bytes / gb:.1f} GB are usable; short by {(fixed - mem.usable_bytes) / gb:.1f} GB "
            f"per GPU (plus {mem.kv_bytes_batch / gb:.2f} GB for the batch's KV)"
        )
    return (
        f"KV cache does not fit: {where} leaves {mem.kv_budget_bytes / gb:.1f} GB per GPU for KV, the batch of {batch} "
        f"needs {mem.kv_bytes_batch / gb:.1f} GB; short by {mem.shortfall_bytes / gb:.1f} GB per GPU"
    )
