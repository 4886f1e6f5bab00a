"""Time of one forward step (a prefill or a decode iteration), opened into operator groups.

A step processes, for each of ``b`` requests, ``S`` new tokens that attend to ``P`` cached ones
(prefill: S = prompt, P = prefix hit; decode: S = 1, P = context - 1). Every group is timed on its
own roofline, ``max(FLOPs / (peak * eta_c), bytes / (bandwidth * eta_m)) + kernels * latency``, and
the groups add up. All inputs may be numpy arrays (broadcast together), so a sweep is one call.

Per-GPU quantities divide the model by tensor parallelism; pipeline stages run one after another for
one request, so the step latency sums all stages (PP adds p2p sends and never shortens a step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from hardware_db.schema import GPUSpec, ModelSpec

from . import formulas as f
from .errors import InputError
from .kv_cache import kv_elements_per_token_layer
from .params import attention_params, shape_values
from .precision import (
    ACTIVATION_BYTES,
    EMBEDDING_BYTES,
    GEMM_RATE,
    attention_rate,
    kv_bytes,
    weight_bytes,
    wide_bytes,
)

DEFAULT_EXPERT_IMBALANCE = 1.2
"""Routed tokens on the busiest expert-parallel GPU over the mean, with expert-parallel load
balancing (redundant experts): TensorRT-LLM measures 1.11 for DeepSeek-R1 at EP32 with 32 redundant
experts (2.56 without; NVIDIA TensorRT-LLM blog "Scaling Expert Parallelism in TensorRT-LLM, part
1", Table 1); SGLang's EP32 prefill runs 1.18x faster with simulated perfect balance (LMSYS blog,
2025-05-05); Ant Group reports a mean/max balance above 0.7 (max/mean below 1.43) on H20."""

DISPATCH_BYTES = {"fp8": 1.0, "fp4": 1.0}
"""Bytes per activation element an expert-parallel dispatch sends, by weight format: fp8 (with its
block scales, not counted) where the experts' GEMMs read fp8 (DeepSeek's inference system: "FP8
dispatch, BF16 combine"; DeepEP's low-latency dispatch); else the 16-bit activations."""

Phase = Literal["prefill", "decode"]
Bound = Literal["compute", "memory", "communication", "latency"]

LOGIT_BYTES = 4.0
"""Logits are materialised in fp32 for sampling."""

# Kernel launches per layer for each group (fused QKV, o-proj; gate_up, act, down; router, permute,
# two grouped GEMMs, act, unpermute; norm, rope, attention, kv write).
KERNELS_PER_LAYER = {"attention_proj": 2, "mlp": 3, "moe": 6, "attention": 4}


@dataclass(frozen=True)
class Setup:
    """A model on a GPU type with a parallel layout and precisions: everything a step needs."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    pp: int = 1
    ep: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    dp: int = 1
    """Attention data-parallel ranks (DeepSeek-style attention-DP + expert parallelism): each rank of
    tp GPUs runs attention and the dense layers on its own sequences and KV; the routed experts are
    spread over all dp x tp GPUs (ep = dp x tp) and every token is dispatched to its experts' GPUs."""
    expert_imbalance: float = DEFAULT_EXPERT_IMBALANCE
    """With ep > 1: routed tokens on the busiest GPU / the mean (the step waits for it)."""
    cp: int = 1
    """Context-parallel ranks of tp GPUs each: a prompt's tokens are split over them (load-balanced
    causal chunks) and their KV passes around the ring while attention computes (ring attention);
    every sequence's KV cache is sharded over them, so a decode step reads 1/cp of it on each and
    combines the partial attention outputs. Weights are replicated on every rank."""
    values: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m, g = self.model, self.gpu
        for name, v in (("tp", self.tp), ("pp", self.pp), ("ep", self.ep), ("dp", self.dp), ("cp", self.cp)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InputError(name, f"must be a positive integer, got {v!r}")
        if not isinstance(self.expert_imbalance, (int, float)) or not 1.0 <= self.expert_imbalance <= 16.0:
            raise InputError("expert_imbalance", f"must be a number in 1 ... 16 (busiest GPU's routed tokens / the "
                                                 f"mean), got {self.expert_imbalance!r}")
        if (self.ep > 1 or self.dp > 1) and m.moe is None:
            raise InputError("ep" if self.ep > 1 else "dp",
                             "expert parallelism and attention data-parallelism need a mixture-of-experts model (a "
                             "dense model takes more instances instead)")
        if self.cp > 1 and self.dp > 1:
            raise InputError("cp", "context parallelism and attention data-parallelism are not combined; choose one")
        if m.moe is not None and self.ep > m.moe.num_experts:
            raise InputError("ep", f"{m.id} has {m.moe.num_experts} routed experts: at most {m.moe.num_experts} "
                                   f"expert-parallel GPUs hold one each, got ep={self.ep}")
        if self.dp > 1 and self.ep != self.dp * self.tp:
            raise InputError("ep", f"with attention data-parallelism the experts are spread over every GPU of the "
                                   f"instance: ep = dp x tp = {self.dp * self.tp}, got ep={self.ep}")
        if self.dp == 1 and self.tp % self.ep != 0:
            raise InputError("ep", f"must divide tp (experts are split inside the tensor-parallel group), "
                                   f"got ep={self.ep}, tp={self.tp}")
        if m.num_attention_heads % self.tp:
            raise InputError("tp", f"{m.id}'s {m.num_attention_heads} attention heads do not split evenly over "
                                   f"tp={self.tp}")
        if self.pp > m.num_layers:
            raise InputError("pp", f"{self.pp} stages exceed the model's {m.num_layers} layers")
        v = dict(shape_values(m))
        eff = g.efficiency
        v.update(
            tp=self.tp, ep=self.ep,
            b_w=weight_bytes(self.weight_dtype), b_kv=kv_bytes(self.kv_dtype),
            b_a=wide_bytes(self.weight_dtype, ACTIVATION_BYTES),
            e_kv=kv_elements_per_token_layer(m, self.tp),
            beta_hbm=g.hbm_bytes_per_s, eta_c=eff.compute, eta_m=eff.memory, eta_l=eff.link,
            tau_k=eff.kernel_latency_us * 1e-6, alpha=eff.collective_latency_us * 1e-6,
            o_seq=eff.sequence_overhead_us * 1e-6, T_half=eff.gemm_half_tokens, g_graph=eff.decode_graph_launch,
            beta_blk=eff.decode_attention_block_gb_s * 1e9, r_gemv=eff.gemv_speedup,
            # fp8 weights with block scales (the checkpoint's own, served as fp8) on a GPU that rescales on CUDA cores
            eta_bs=eff.block_scaled_memory if self.weight_dtype == "fp8" and m.weight_block_size else 0.0,
        )
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "tp_link_bytes_per_s", group_link_bytes_per_s(g, self.tp))
        # expert dispatch and combine cross the whole expert-parallel group (a NIC beyond one node)
        object.__setattr__(self, "ep_link_bytes_per_s", group_link_bytes_per_s(g, self.dp * self.tp))
        # ring attention: each GPU sends to its peer in the next rank; a stage sends to the next one
        object.__setattr__(self, "cp_link_bytes_per_s", pair_link_bytes_per_s(g, self.cp * self.tp))
        object.__setattr__(self, "pp_link_bytes_per_s", pair_link_bytes_per_s(g, self.tp * self.pp))

    # --- parameter bookkeeping (per whole model, before sharding) -----------------------------
    @cached_property
    def attention_proj_params(self) -> float:
        """Linear weights of attention, all layers (norm weights excluded)."""
        m = self.model
        return float(attention_params(m)) * m.num_layers

    @cached_property
    def dense_mlp_params(self) -> float:
        m = self.model
        return float(f.mlp_params(self.values)) * (m.num_layers - m.num_moe_layers)

    @cached_property
    def expert_params_each(self) -> float:
        return float(f.expert_params(self.values)) if self.model.moe else 0.0

    @cached_property
    def moe_fixed_params(self) -> float:
        """Shared experts and routers of all MoE layers (read every step)."""
        m = self.model
        if m.moe is None:
            return 0.0
        shared = m.moe.num_shared_experts * (2 + int(m.gated_mlp)) * m.hidden_size * m.moe.expert_intermediate_size
        return (shared + float(f.router_params(self.values))) * m.num_moe_layers

    @cached_property
    def io_width_attention(self) -> float:
        """Input + output widths of the attention projections on one GPU, all layers."""
        formula = f.io_width_attention_mla if self.model.mla else f.io_width_attention_gqa
        return float(formula(self.values)) * self.model.num_layers

    @cached_property
    def io_width_mlp(self) -> float:
        """Input + output widths of one dense MLP layer on one GPU."""
        return float(f.io_width_mlp(self.values))

    @cached_property
    def io_width_moe(self) -> float:
        """Widths each token moves through one MoE layer on one GPU."""
        return float(f.io_width_moe(self.values))

    @cached_property
    def gemm_rate_flops_per_s(self) -> float:
        return self.gpu.peak_flops_per_s(GEMM_RATE[self.weight_dtype])

    @cached_property
    def attention_rate_flops_per_s(self) -> float:
        return self.gpu.peak_flops_per_s(attention_rate(self.weight_dtype))


def group_link_bytes_per_s(gpu: GPUSpec, group_gpus: int) -> float:
    """Link bandwidth per GPU per direction of a group of ``group_gpus`` GPUs that communicate, B/s:
    the scale-out NIC when the group spans more than one scale-up domain, else the scale-up links the
    group actually uses (``group_link_bandwidth``: all of them through a switch, k - 1 direct links of
    a full mesh such as MI300X's xGMI, the PCIe link)."""
    if group_gpus > gpu.scaleup_domain_gpus:
        return gpu.scaleout_bytes_per_s
    return float(f.group_link_bandwidth(beta_agg=gpu.scaleup_bytes_per_s, k_grp=max(group_gpus, 2),
                                        n_links=gpu.scaleup_links))


def pair_link_bytes_per_s(gpu: GPUSpec, span_gpus: int = 2) -> float:
    """Bandwidth of one GPU sending to one peer, B/s, among ``span_gpus`` GPUs: a scale-up link (a
    full mesh's direct link) while they share a scale-up domain, else the NIC."""
    return group_link_bytes_per_s(gpu, 2 if span_gpus <= gpu.scaleup_domain_gpus else gpu.scaleup_domain_gpus + 1)


@lru_cache(maxsize=512)
def setup_for(model: ModelSpec, gpu: GPUSpec, tp: int = 1, pp: int = 1, ep: int = 1, weight_dtype: str = "bf16",
              kv_dtype: str = "bf16", dp: int = 1, expert_imbalance: float = DEFAULT_EXPERT_IMBALANCE,
              cp: int = 1) -> Setup:
    """``Setup(...)``, shared between calls with the same arguments (specs are frozen, so a setup
    never changes; building one evaluates a dozen formulas)."""
    return Setup(model, gpu, tp=tp, pp=pp, ep=ep, weight_dtype=weight_dtype, kv_dtype=kv_dtype, dp=dp,
                 expert_imbalance=expert_imbalance, cp=cp)


@dataclass(frozen=True)
class Group:
    """One operator group of a step: work, traffic, time and what bounds it (arrays broadcast)."""

    name: str
    flops: np.ndarray
    bytes: np.ndarray
    time_s: np.ndarray
    formula: str
    compute_s: np.ndarray
    memory_s: np.ndarray
    latency_s: np.ndarray
    communication: bool = False
    """A collective or send (its time is the link's), not a roofline group."""
    one_row: np.ndarray | None = None
    """Per element, whether the group is a linear layer of one row (a GEMV: ``gemm_memory_efficiency``);
    None: not a linear layer."""

    @cached_property
    def bound(self) -> np.ndarray:
        """Which ceiling sets the group's time, per element: compute, memory, latency or communication."""
        if self.communication:
            return np.full(np.shape(self.time_s), "communication")
        c, m, lat = self.compute_s, self.memory_s, self.latency_s
        return np.where(lat > np.maximum(c, m), "latency", np.where(c >= m, "compute", "memory"))

    def plus(self, other: Group) -> Group:
        """This group and ``other`` (two kernels of one operator run one after the other): work, traffic,
        times and ceilings add."""
        return Group(self.name, self.flops + other.flops, self.bytes + other.bytes, self.time_s + other.time_s,
                     self.formula, self.compute_s + other.compute_s, self.memory_s + other.memory_s,
                     self.latency_s + other.latency_s, self.communication)

    def slower(self, floor: Group) -> Group:
        """This group's work at, per element, the longer of its time and ``floor``'s (the same operator on part
        of the work, in a slower kernel); its ceilings are the ones of whichever sets the time."""
        pick = np.asarray(floor.time_s) > np.asarray(self.time_s)

        def choose(a, b):  # type: ignore[no-untyped-def]
            return np.where(pick, b, a)

        return Group(self.name, self.flops, self.bytes, choose(self.time_s, floor.time_s), self.formula,
                     choose(self.compute_s, floor.compute_s), choose(self.memory_s, floor.memory_s),
                     choose(self.latency_s, floor.latency_s), self.communication)

    def at(self, i: int) -> Group:
        """The group of the ``i``-th step of a 1-d sweep."""
        def pick(a: np.ndarray) -> np.ndarray:
            return a[i] if a.ndim else a  # a quantity that does not vary along the sweep is 0-d

        return Group(self.name, pick(self.flops), pick(self.bytes), pick(self.time_s), self.formula,
                     pick(self.compute_s), pick(self.memory_s), pick(self.latency_s), self.communication,
                     None if self.one_row is None else pick(self.one_row))


def _roofline(name: str, flops, bytes_, peak, kernels, setup: Setup, share: float = 1.0, tokens=None,
              graph: bool = False, blocks=None, weight_bytes=None) -> Group:
    """An operator group's roofline time; ``share`` scales both efficiencies (the decode attention kernel's).
    ``tokens``: the rows of a linear layer's GEMMs, whose compute efficiency rolls off below ``T_half``
    (``gemm_compute_efficiency``) and whose weights stream faster at one row where ``r_gemv`` says so
    (``gemm_memory_efficiency``); ``graph``: a decode step replayed from a CUDA graph (``launch_latency``);
    ``blocks``: the thread blocks of a decode attention kernel, whose memory efficiency they cap
    (``decode_attention_memory_efficiency``); ``weight_bytes``: the share of ``bytes_`` that is a linear layer's
    weights, which stream at ``block_scaled_memory_efficiency`` where they are block-scaled fp8 on a GPU that
    sets a limit (the rest of the traffic at eta_m)."""
    v = setup.values
    flops = np.asarray(flops, dtype=float)
    bytes_ = np.asarray(bytes_, dtype=float)
    eta_c = v["eta_c"]
    if tokens is not None and v["T_half"] > 0:
        eta_c = np.asarray(f.gemm_compute_efficiency(v, T=np.maximum(np.asarray(tokens, dtype=float), 1e-9)))
    eta_m = v["eta_m"]
    if tokens is not None and v["r_gemv"] != 1.0:
        eta_m = np.asarray(f.gemm_memory_efficiency(v, T=np.asarray(tokens, dtype=float)))
    if weight_bytes is not None and v["eta_bs"] > 0:
        eta_m = np.asarray(f.block_scaled_memory_efficiency(v, Q=np.maximum(bytes_, 1e-30), Q_w=weight_bytes,
                                                            eta_m=eta_m))
    eta_c, eta_m = eta_c * share, eta_m * share
    if blocks is not None and v["beta_blk"] > 0:
        # at least one block: a step with no decodes (a lone prompt's step) reads no decode KV at all
        n_blk = np.maximum(np.asarray(blocks, dtype=float), 1.0)
        eta_m = np.asarray(f.decode_attention_memory_efficiency(v, eta_m=eta_m, n_blk=n_blk))
    tau_k = float(f.launch_latency(v)) if graph else v["tau_k"]
    t = np.asarray(f.roofline_time(v, F=flops, Q=bytes_, pi=peak, n_k=kernels, eta_c=eta_c, eta_m=eta_m, tau_k=tau_k),
                   dtype=float)
    compute_s = flops / (peak * eta_c)
    memory_s = bytes_ / (v["beta_hbm"] * eta_m)
    latency_s = kernels * tau_k
    zero = np.zeros_like(t)
    one_row = None if tokens is None else np.asarray(tokens, dtype=float) + zero <= 1
    return Group(name, flops, bytes_, t, "roofline_time", compute_s + zero, memory_s + zero, latency_s + zero,
                 one_row=one_row)


def _mla_dims(m: ModelSpec, phase: Phase) -> tuple[float, float]:
    """(d_qk, d_pv) per head. MLA prefill expands heads; decode runs absorbed in the latent space."""
    if m.mla is None:
        return float(m.head_dim), float(m.head_dim)
    if phase == "prefill":
        return float(m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim), float(m.mla.v_head_dim)
    return float(m.mla.kv_lora_rank + m.mla.qk_rope_head_dim), float(m.mla.kv_lora_rank)


def step_groups(
    setup: Setup, S: ArrayLike, P: ArrayLike, b: ArrayLike, phase: Phase,
    chunk: tuple[ArrayLike, ...] | None = None, prompt_ranks: float | None = None,
) -> list[Group]:
    """Operator groups of one forward step of ``b`` requests with ``S`` new and ``P`` cached tokens each.

    ``chunk=(S_c, P_c)`` adds one prefill chunk of ``S_c`` tokens after ``P_c`` already-prefilled ones
    to the same step (a Sarathi hybrid iteration): weights are read once for all tokens, and the chunk
    re-reads the KV its earlier chunks wrote. ``chunk=(S_c, P_c, b_c)`` adds ``b_c`` such chunks (several
    prompts batched into one step, each of S_c new tokens after P_c cached ones).

    ``prompt_ranks`` (attention data-parallelism): how many of the dp ranks carry such prompt tokens (a
    prefill's, or the chunks') in this step, the others running only their decodes; the routed experts, spread
    over all dp ranks' GPUs, see the prompt tokens of those ranks alone: a GPU's routed work is its decodes' plus
    prompt_ranks / dp of its prompt tokens (its own attention, dense and shared-expert work, and its dispatch,
    keep them all). None (or dp): every rank runs the same step.
    """
    m, v = setup.model, setup.values
    S = np.asarray(S, dtype=float)
    P = np.asarray(P, dtype=float)
    b = np.asarray(b, dtype=float)
    S_c = np.asarray(chunk[0] if chunk else 0.0, dtype=float)
    P_c = np.asarray(chunk[1] if chunk else 0.0, dtype=float)
    b_c = np.asarray(chunk[2] if chunk and len(chunk) > 2 else 1.0, dtype=float)
    # context parallelism: prompt tokens (a prefill, or a chunk) are split over the cp ranks; a
    # decode's one new token is computed on every rank (each attends over its share of the cache)
    cp = setup.cp
    T = (b * S / cp if phase == "prefill" else b * S) + b_c * S_c / cp
    tp, L = setup.tp, m.num_layers
    gemm_peak = setup.gemm_rate_flops_per_s
    graph = phase == "decode" and chunk is None  # engines replay decode-only steps from CUDA graphs
    groups: list[Group] = []

    # attention projections
    io_attn = setup.io_width_attention
    n_attn = setup.attention_proj_params
    w_attn = v["b_w"] * n_attn / tp
    groups.append(_roofline(
        "attention_proj",
        f.gemm_flops(v, N_lin=n_attn / tp, T=T),
        w_attn + f.gemm_activation_bytes(v, T=T, X_io=io_attn),
        gemm_peak, KERNELS_PER_LAYER["attention_proj"] * L, setup, tokens=T, graph=graph, weight_bytes=w_attn,
    ))

    # dense MLP layers
    dense_layers = L - m.num_moe_layers
    if dense_layers:
        n_mlp = setup.dense_mlp_params
        w_mlp = v["b_w"] * n_mlp / tp
        groups.append(_roofline(
            "mlp",
            f.gemm_flops(v, N_lin=n_mlp / tp, T=T),
            w_mlp + f.gemm_activation_bytes(v, T=T, X_io=setup.io_width_mlp * dense_layers),
            gemm_peak, KERNELS_PER_LAYER["mlp"] * dense_layers, setup, tokens=T, graph=graph, weight_bytes=w_mlp,
        ))

    # MoE layers: k routed + shared experts per token; weights of the distinct experts touched
    # With attention-DP every rank runs this step on its own T tokens at once: the routed experts, spread
    # over all dp x tp GPUs, see dp x T tokens, and the busiest GPU gets expert_imbalance x its share.
    if m.moe is not None:
        Lm = m.num_moe_layers
        imbalance = setup.expert_imbalance if setup.ep > 1 else 1.0
        routed = m.moe.experts_per_token * setup.expert_params_each * imbalance
        T_r = T  # tokens whose routed work one GPU does
        if prompt_ranks is not None and setup.dp > 1 and prompt_ranks < setup.dp:
            prompt = (b * S / cp if phase == "prefill" else 0.0) + b_c * S_c / cp
            T_r = T - prompt + prompt * max(float(prompt_ranks), 1.0) / setup.dp
        touched = f.expected_experts_touched(v, T=T_r * setup.dp)
        w_moe = v["b_w"] * (touched * setup.expert_params_each * Lm / setup.dp + setup.moe_fixed_params) / tp
        groups.append(_roofline(
            "moe",
            f.gemm_flops(v, N_lin=(routed * Lm + setup.moe_fixed_params) / tp, T=T) if T_r is T else
            f.gemm_flops(v, N_lin=routed * Lm / tp, T=T_r) + f.gemm_flops(v, N_lin=setup.moe_fixed_params / tp, T=T),
            w_moe + f.gemm_activation_bytes(v, T=T, X_io=setup.io_width_moe * Lm),
            gemm_peak, KERNELS_PER_LAYER["moe"] * Lm, setup, tokens=T, graph=graph, weight_bytes=w_moe,
        ))

    # LM head: last position of each request only; logits in fp32
    lm_params = m.vocab_size * m.hidden_size
    groups.append(_roofline(
        "lm_head",
        f.gemm_flops(v, N_lin=lm_params / tp, T=b),
        wide_bytes(setup.weight_dtype, EMBEDDING_BYTES) * lm_params / tp
        + b * (m.hidden_size * v["b_a"] + m.vocab_size * LOGIT_BYTES / tp),
        setup.gpu.peak_flops_per_s(attention_rate(setup.weight_dtype)), 2, setup, tokens=b, graph=graph,
    ))

    # attention core (QK^T, softmax, PV) over the cached and new tokens; with cp each rank does 1/cp
    # The decode attention kernel (one query token per sequence over its paged KV) runs at its own share
    # of the efficiencies; prompt and chunk attention at the GEMMs'. A hybrid step runs both kernels: with
    # the default share 1 they are one roofline over the step's attention work, otherwise two; an engine
    # that attends the whole step in one variable-length kernel (hybrid_attention_kernels = 1) runs it all
    # as the prompt kernel does.
    attn_flops, attn_bytes = _attention_work(setup, S, P, b, phase)
    share = setup.gpu.efficiency.decode_attention if phase == "decode" else 1.0
    # decode attention: one thread block per (sequence, KV head on this GPU); an MLA latent is one head
    blocks = b * (1.0 if m.mla is not None else max(1.0, m.num_kv_heads / tp)) if phase == "decode" else None
    kernels = KERNELS_PER_LAYER["attention"] * L
    rate = setup.attention_rate_flops_per_s
    if chunk is not None:
        chunk_flops, chunk_bytes = _attention_work(setup, S_c, P_c, b_c + 0 * S_c, "prefill")
        one_kernel = setup.gpu.efficiency.hybrid_attention_kernels == 1
        if one_kernel or (share == 1.0 and v["beta_blk"] == 0):
            attention = _roofline("attention", (attn_flops + chunk_flops) / cp, (attn_bytes + chunk_bytes) / cp,
                                  rate, (1 if one_kernel else 2) * kernels, setup)
            if one_kernel:
                # a step's work only grows with its prompt piece: the one kernel takes at least what the decodes
                # alone take in a decode-only step (else a two-token piece beside 62 decodes made the step 8 ms
                # cheaper than the decodes alone, and a prompt's stall on them negative)
                alone = _roofline("attention", attn_flops / cp, attn_bytes / cp, rate, kernels, setup, share,
                                  blocks=blocks)
                attention = attention.slower(alone)
        else:
            attention = _roofline("attention", attn_flops / cp, attn_bytes / cp, rate, kernels, setup, share,
                                  blocks=blocks).plus(
                _roofline("attention", chunk_flops / cp, chunk_bytes / cp, rate, kernels, setup))
    else:
        attention = _roofline("attention", attn_flops / cp, attn_bytes / cp, rate, kernels, setup, share, graph=graph,
                              blocks=blocks)
    groups.append(attention)
    if m.mla is not None:
        groups.extend(_mla_context_up_projection(setup, b * P * (phase == "prefill") + b_c * P_c))

    groups.extend(_communication(setup, T))
    if cp > 1:
        groups.append(_context_parallel_comm(setup, S, b, phase, (S_c, b_c) if chunk is not None else None, attention))
    if v["o_seq"] > 0:  # only where an engine's per-sequence cost was fitted (the defaults have none)
        n = b + (b_c * (S_c > 0) if chunk is not None else 0.0)
        t = np.asarray(f.sequence_overhead_time(v, n_seq=n), dtype=float) + 0.0 * T
        zero = np.zeros_like(t)
        groups.append(Group("sequence_overhead", zero, zero, t, "sequence_overhead_time", zero, zero, t))
    return groups


def _context_parallel_comm(setup: Setup, S, b, phase: Phase, chunk, attention: Group) -> Group:
    """Context parallelism's traffic. Prompt tokens: ring attention passes each rank's new KV to the
    other cp - 1 ranks, one hop a layer each, while attention computes; only what outlasts the
    attention is visible. Decode: every rank sends its partial attention output (and log-sum-exp) for
    the new token to the others, one exchange a layer."""
    m, v = setup.model, setup.values
    cp, L = setup.cp, m.num_layers
    S, b = np.asarray(S, dtype=float), np.asarray(b, dtype=float)
    prompt_tokens = b * S if phase == "prefill" else 0.0 * b
    if chunk is not None:
        prompt_tokens = prompt_tokens + np.asarray(chunk[1], dtype=float) * np.asarray(chunk[0], dtype=float)
    kv_hop = prompt_tokens / cp * v["e_kv"] * v["b_kv"]  # one rank's new KV of one layer, on one GPU
    ring = np.asarray(f.p2p_time(v, n_coll=L * (cp - 1), M=kv_hop, beta_link=setup.cp_link_bytes_per_s), dtype=float)
    ring = np.where(prompt_tokens > 0, ring, 0.0)
    exposed = np.maximum(ring - attention.time_s, 0.0)
    decodes = b if phase == "decode" else 0.0 * b
    partial = decodes * (m.num_attention_heads / setup.tp) * (_mla_dims(m, "decode")[1] + 1) * v["b_a"]
    # an all-to-all among the cp ranks (the formula's group size is its "ep")
    gather = np.asarray(f.alltoall_time({**v, "ep": cp}, n_coll=L, M=partial * cp, beta_link=setup.cp_link_bytes_per_s),
                        dtype=float)
    gather = np.where(decodes > 0, gather, 0.0)
    return _comm_group("cp_exchange", exposed + gather, L * (cp - 1) * kv_hop + L * partial * (cp - 1),
                       "p2p_time")


def _mla_context_up_projection(setup: Setup, cached_tokens: np.ndarray) -> list[Group]:
    """MLA prompt attention runs in the expanded head space (the non-absorbed path of vLLM's and SGLang's
    MLA prefill), so the cached latents it attends to (a prefix-cache hit, a chunk's earlier chunks) are
    up-projected to keys and values by W_UK and W_UV (``kv_b_proj``) in every step that reads them: a
    linear layer of r x n_h (d_nope + d_v) weights per layer over the cached tokens (``gemm_flops``),
    reading their latents and writing the expanded K and V (``gemm_activation_bytes``). Its weights are
    already read by ``attention_proj``. Empty (no row) where no step reads a cached token."""
    cached_tokens = np.asarray(cached_tokens, dtype=float)
    if not np.any(cached_tokens > 0):
        return []
    m, v, mla = setup.model, setup.values, setup.model.mla
    assert mla is not None
    heads = m.num_attention_heads / setup.tp
    expanded = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    T = cached_tokens / setup.cp  # with cp each rank holds and up-projects its share of the context
    return [_roofline(
        "mla_up_projection",
        f.gemm_flops(v, N_lin=mla.kv_lora_rank * expanded * m.num_layers, T=T),
        f.gemm_activation_bytes(v, T=T, X_io=(mla.kv_lora_rank + mla.qk_rope_head_dim + expanded) * m.num_layers),
        setup.gemm_rate_flops_per_s, m.num_layers * (cached_tokens > 0), setup, tokens=T,
    )]


def _attention_work(setup: Setup, S, P, b, phase: Phase) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes of the attention core on one GPU for one kind of segment."""
    m, v = setup.model, setup.values
    d_qk, d_pv = _mla_dims(m, phase)
    heads = m.num_attention_heads / setup.tp
    av = {**v, "S": S, "P": P, "b": b, "d_qk": d_qk, "d_pv": d_pv, "n_q": heads}
    q_o_bytes = v["b_a"] * b * S * m.num_layers * heads * (d_qk + d_pv)
    return f.attention_flops(av), f.attention_kv_read_bytes(av) + f.kv_write_bytes(av) + q_o_bytes


def _comm_group(name: str, t: np.ndarray, bytes_: np.ndarray, formula: str) -> Group:
    t = np.asarray(t, dtype=float)
    zero = np.zeros_like(t)
    return Group(name, zero, np.asarray(bytes_, dtype=float) + zero, t, formula, zero, zero, zero, communication=True)


def _communication(setup: Setup, T: np.ndarray) -> list[Group]:
    m, v = setup.model, setup.values
    out: list[Group] = []
    msg = T * m.hidden_size * v["b_a"]
    if setup.tp > 1:
        # two all-reduces per layer (after W_o and after the MLP), one where attention and MLP run in
        # parallel and their partial sums are reduced together; with EP the MoE layers exchange by all-to-all
        n_ar = (1 if m.parallel_attention else 2) * m.num_layers - (m.num_moe_layers if setup.ep > 1 else 0)
        t = f.ring_allreduce_time(v, n_coll=n_ar, M=msg, beta_link=setup.tp_link_bytes_per_s)
        out.append(_comm_group("tp_allreduce", t, n_ar * msg * 2 * (setup.tp - 1) / setup.tp, "ring_allreduce_time"))
    if setup.ep > 1:
        Lm = m.num_moe_layers
        k = m.moe.experts_per_token  # type: ignore[union-attr]
        # attention-DP: each GPU sends its rank's tokens (split over the rank's tp GPUs) to k experts'
        # GPUs; experts inside the tensor-parallel group: each GPU sends 1/ep of the (replicated) tokens.
        # The combine returns 16-bit results; the dispatch sends the activations in the format the
        # experts' GEMMs read (fp8 for fp8/fp4 weights: DeepEP, DeepSeek's FP8 dispatch)
        combine = msg * k / setup.tp if setup.dp > 1 else msg * k / setup.ep
        dispatch = combine * DISPATCH_BYTES.get(setup.weight_dtype, v["b_a"]) / v["b_a"]
        t = (f.alltoall_time(v, n_coll=Lm, M=dispatch, beta_link=setup.ep_link_bytes_per_s)
             + f.alltoall_time(v, n_coll=Lm, M=combine, beta_link=setup.ep_link_bytes_per_s))
        out.append(_comm_group("ep_alltoall", t, Lm * (dispatch + combine), "alltoall_time"))
    if setup.pp > 1:
        t = f.p2p_time(v, n_coll=setup.pp - 1, M=msg, beta_link=setup.pp_link_bytes_per_s)
        out.append(_comm_group("pp_send", t, (setup.pp - 1) * msg, "p2p_time"))
    return out


def step_time_s(groups: list[Group], setup: Setup) -> np.ndarray:
    """Sum of the groups plus the fixed per-step overhead (scheduling, sampling, launch)."""
    total = sum(gr.time_s for gr in groups)
    return np.asarray(total, dtype=float) + step_overhead_s(setup)


def step_overhead_s(setup: Setup) -> float:
    """The fixed cost of one forward step (``step_overhead_time``), s."""
    return float(f.step_overhead_time(o_step=setup.gpu.efficiency.step_overhead_us * 1e-6))


PHASE_BOUNDS = ("compute", "memory", "communication", "latency")


def phase_bound(groups: list[Group], setup: Setup) -> np.ndarray:
    """Which of compute, memory, communication or fixed latency takes most of the step's time."""
    compute = memory = communication = 0.0
    latency = step_overhead_s(setup)
    for gr in groups:
        if gr.communication:
            communication = communication + gr.time_s
            continue
        compute_bound = gr.compute_s >= gr.memory_s
        compute = compute + gr.compute_s * compute_bound
        memory = memory + gr.memory_s * ~compute_bound
        latency = latency + gr.latency_s
    stacked = np.stack(np.broadcast_arrays(compute, memory, communication, latency))
    return np.asarray(PHASE_BOUNDS)[np.argmax(stacked, axis=0)]
