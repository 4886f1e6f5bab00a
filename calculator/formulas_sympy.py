"""Every closed-form expression of pdplan, written once in sympy: the source of truth.

Nothing at run time imports this module. ``python -m calculator.formulas_codegen`` prints each
expression to numpy code and its LaTeX into ``calculator/formulas.py``, which the calculator
evaluates; ``tests/test_formulas_codegen.py`` fails when that file is not what this one generates.
Sympy is imported only by the generator, the tests, the docs build, and ``Formula.expr``.
Arguments are named by symbol name. User input never reaches this module.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import sympy as sp

# --- symbols -----------------------------------------------------------------------------------
# name -> (symbol, meaning, unit). Assumptions keep simplification honest (sizes are non-negative).
SYMBOLS: dict[str, tuple[sp.Symbol, str, str]] = {}


def _sym(name: str, meaning: str, unit: str = "1", latex: str | None = None) -> sp.Symbol:
    s = sp.Symbol(latex or name, nonnegative=True)
    SYMBOLS[name] = (s, meaning, unit)
    return s


# model shape
h = _sym("h", "hidden size", "elements")
V = _sym("V", "vocabulary size", "tokens")
L = _sym("L", "decoder layers", "layers")
L_m = _sym("L_m", "MoE layers (the rest are dense)", "layers", "L_{m}")
L_w = _sym("L_w", "sliding-window layers (the rest attend to the full context)", "layers", "L_{w}")
n_q = _sym("n_q", "query heads", "heads", "n_{q}")
n_kv = _sym("n_kv", "key/value heads", "heads", "n_{kv}")
d = _sym("d", "head dimension", "elements", "d_{h}")
I_ff = _sym("I", "dense MLP intermediate size", "elements", "I")
g = _sym("g", "1 for a gated MLP (3 matrices), 0 for a plain one (2)", "1")
beta_qkv = _sym("beta_qkv", "1 if q/k/v projections have biases", "1", r"\beta_{qkv}")
beta_o = _sym("beta_o", "1 if the output projection has a bias", "1", r"\beta_{o}")
beta_mlp = _sym("beta_mlp", "1 if MLP linears have biases", "1", r"\beta_{mlp}")
nu_qk = _sym("nu_qk", "1 if q and k carry a per-head RMSNorm", "1", r"\nu_{qk}")
sigma = _sym("sigma", "1 if each head has a learned attention-sink logit", "1", r"\sigma")
n_norm = _sym("n_norm", "norms per layer", "1", r"n_{norm}")
beta_ln = _sym("beta_ln", "1 for LayerNorm (weight+bias), 0 for RMSNorm (weight)", "1", r"\beta_{ln}")
tie = _sym("tie", "1 if the LM head shares the embedding matrix", "1", r"\tau")
P_pos = _sym("P_pos", "rows of a learned position-embedding table", "rows", "P_{pos}")
# MoE
E = _sym("E", "routed experts per MoE layer", "experts")
k = _sym("k", "routed experts per token (top-k)", "experts")
E_s = _sym("E_s", "shared (always-on) experts", "experts", "E_{s}")
I_e = _sym("I_e", "expert intermediate size", "elements", "I_{e}")
beta_e = _sym("beta_e", "1 if expert linears have biases", "1", r"\beta_{e}")
beta_r = _sym("beta_r", "1 if the router has a bias / score-correction bias", "1", r"\beta_{r}")
# MLA
r_q = _sym("r_q", "query low-rank dimension (0: none)", "elements", "r_{q}")
r_kv = _sym("r_kv", "key/value latent rank", "elements", "r_{kv}")
d_n = _sym("d_n", "non-rotary q/k head dimension", "elements", "d_{nope}")
d_r = _sym("d_r", "rotary q/k head dimension (shared rope key)", "elements", "d_{rope}")
d_v = _sym("d_v", "value head dimension", "elements", "d_{v}")
# attention maths
d_qk = _sym("d_qk", "q.k dot-product width per head", "elements", "d_{qk}")
d_pv = _sym("d_pv", "attention-output width per head", "elements", "d_{pv}")
e_kv = _sym("e_kv", "cached K/V elements per token per layer on one GPU", "elements", "e_{kv}")
W = _sym("W", "sliding-window length", "tokens")
# workload
S = _sym("S", "new (prefilled) tokens per request", "tokens")
P = _sym("P", "cached prefix tokens per request", "tokens")
c = _sym("c", "context length a decode step attends to", "tokens")
b = _sym("b", "requests in the batch", "requests")
T = _sym("T", "tokens processed in one forward step", "tokens")
# precision
b_w = _sym("b_w", "bytes per weight", "B", "b_{w}")
b_kv = _sym("b_kv", "bytes per cached K/V element", "B", "b_{kv}")
b_a = _sym("b_a", "bytes per activation element", "B", "b_{a}")
# parallelism
tp = _sym("tp", "tensor-parallel degree", "GPUs", "t")
ep = _sym("ep", "expert-parallel degree", "GPUs", "e_{p}")
# hardware
F = _sym("F", "floating-point operations", "FLOP")
Q = _sym("Q", "bytes moved to or from memory", "B")
M_msg = _sym("M", "bytes in one collective message", "B")
pi = _sym("pi", "peak FLOP/s", "FLOP/s", r"\pi")
beta_hbm = _sym("beta_hbm", "HBM bandwidth", "B/s", r"\beta")
beta_link = _sym("beta_link", "link bandwidth per direction", "B/s", r"\beta_{link}")
eta_c = _sym("eta_c", "compute efficiency", "1", r"\eta_{c}")
eta_m = _sym("eta_m", "memory efficiency", "1", r"\eta_{m}")
eta_l = _sym("eta_l", "link efficiency", "1", r"\eta_{l}")
n_k = _sym("n_k", "kernel launches", "kernels", "n_{k}")
tau_k = _sym("tau_k", "latency per kernel", "s", r"\tau_{k}")
T_half = _sym("T_half", "tokens in a step at which the linear layers reach half their fitted compute efficiency", "tokens",
              r"T_{1/2}")
r_gemv = _sym("r_gemv", "how many times faster than eta_m a linear layer of one row (a GEMV) streams its weights",
               "1", r"r_{gemv}")
n_blk = _sym("n_blk", "thread blocks a decode attention kernel runs: sequences x KV heads on one GPU", "blocks",
             r"n_{blk}")
beta_blk = _sym("beta_blk", "KV bandwidth one decode attention thread block streams, walking one sequence's cache "
                "for one KV head", "B/s", r"\beta_{blk}")
Q_w = _sym("Q_w", "bytes of weights among an operator group's bytes", "B", "Q_{w}")
eta_bs = _sym("eta_bs", "memory efficiency a linear layer over block-scaled fp8 weights reaches where the tensor cores "
              "cannot apply the scales (achieved / peak HBM bandwidth)", "1", r"\eta_{bs}")
g_graph = _sym("g_graph", "share of the per-kernel launch latency a step replayed from a CUDA graph still pays", "1",
               r"g_{graph}")
o_step = _sym("o_step", "fixed cost per forward step (scheduling, sampling, launch)", "s", r"o_{step}")
o_seq = _sym("o_seq", "cost per sequence in a step (scheduling, sampling, output processing)", "s", r"o_{seq}")
n_seq = _sym("n_seq", "sequences in a step (decoding ones and prompt pieces)", "1", r"n_{seq}")
alpha = _sym("alpha", "latency per collective", "s", r"\alpha")
n_coll = _sym("n_coll", "collectives", "1", "n_{coll}")
k_grp = _sym("k_grp", "GPUs in a communicating group", "GPUs", "k_{g}")
n_links = _sym("n_links", "direct links per GPU of a full mesh (1: a switch or PCIe)", "links", "n_{links}")
beta_agg = _sym("beta_agg", "scale-up bandwidth per GPU per direction, all its links", "B/s", r"\beta_{agg}")
X_io = _sym("X_io", "input+output widths of a group's linear layers on one GPU, summed over layers", "elements", "X_{io}")
N_lin = _sym("N_lin", "active linear-layer weights on one GPU (embeddings excluded)", "params", "N_{lin}")


@dataclass(frozen=True)
class Definition:
    """One formula as written: its sympy expression, unit, one-line doc, argument names (sorted) and
    the line of this file that defines it (which places it under a ``# --- section ---`` header)."""

    name: str
    expr: sp.Expr
    unit: str
    doc: str
    args: tuple[str, ...]
    line: int


FORMULAS: dict[str, Definition] = {}


def _formula(name: str, expr: sp.Expr, unit: str, doc: str) -> Definition:
    by_symbol = {v[0]: n for n, v in SYMBOLS.items()}
    args = tuple(sorted((by_symbol[s] for s in expr.free_symbols), key=str))
    f = Definition(name, expr, unit, doc, args, sys._getframe(1).f_lineno)
    FORMULAS[name] = f
    return f


# --- parameters --------------------------------------------------------------------------------
attention_params_gqa = _formula(
    "attention_params_gqa",
    h * n_q * d + 2 * h * n_kv * d + n_q * d * h
    + beta_qkv * (n_q * d + 2 * n_kv * d) + beta_o * h + nu_qk * 2 * d + sigma * n_q,
    "params",
    "Per-layer attention parameters for MHA/GQA/MQA: W_q, W_k, W_v, W_o, optional biases, q/k norms, sinks.",
)
attention_params_mla = _formula(
    "attention_params_mla",
    sp.Piecewise((h * r_q + r_q + r_q * n_q * (d_n + d_r), r_q > 0), (h * n_q * (d_n + d_r), True))
    + h * (r_kv + d_r) + r_kv + r_kv * n_q * (d_n + d_v) + n_q * d_v * h,
    "params",
    "Per-layer MLA parameters (DeepSeek-V2/V3): q down/up projections (or a direct W_q), kv down-projection "
    "to the latent plus the shared rope key, latent norm, kv up-projection, W_o.",
)
mlp_params = _formula(
    "mlp_params",
    (2 + g) * h * I_ff + beta_mlp * ((1 + g) * I_ff + h),
    "params",
    "Dense MLP parameters per layer: 3 matrices when gated (SwiGLU/GeGLU), 2 otherwise, plus biases.",
)
expert_params = _formula(
    "expert_params",
    (2 + g) * h * I_e + beta_e * ((1 + g) * I_e + h),
    "params",
    "Parameters of one expert (a gated MLP of width I_e, with biases for gpt-oss).",
)
router_params = _formula("router_params", h * E + beta_r * E, "params", "Router (gate) parameters per MoE layer.")
norm_params = _formula(
    "norm_params", n_norm * h * (1 + beta_ln), "params", "Norm parameters per layer (RMSNorm: weight; LayerNorm: +bias)."
)

embedding_params = _formula(
    "embedding_params",
    V * h * (2 - tie) + P_pos * h,
    "params",
    "Input embedding and LM head (one matrix when tied) plus learned position rows.",
)

_P_attn, _P_mlp, _P_exp, _P_router, _P_norm = (
    sp.Symbol("P_attn"), sp.Symbol("P_mlp"), sp.Symbol("P_exp"), sp.Symbol("P_router"), sp.Symbol("P_norm"),
)


def _total_params(experts_per_layer: sp.Expr) -> sp.Expr:
    return (
        L * (_P_attn + _P_norm)
        + (L - L_m) * _P_mlp
        + L_m * (experts_per_layer * _P_exp + E_s * (2 + g) * h * I_e + _P_router)
        + embedding_params.expr
        + h * (1 + beta_ln)
    )


def _expand(expr: sp.Expr, attention: Definition) -> sp.Expr:
    return expr.subs(
        {
            _P_attn: attention.expr,
            _P_mlp: mlp_params.expr,
            _P_exp: expert_params.expr,
            _P_router: router_params.expr,
            _P_norm: norm_params.expr,
        }
    )


for _kind, _attn in (("gqa", attention_params_gqa), ("mla", attention_params_mla)):
    _formula(
        f"total_params_{_kind}",
        _expand(_total_params(E), _attn),
        "params",
        "All parameters: layers (attention, norms, dense MLP or E routed + shared experts + router), "
        "embedding and LM head (once if tied), final norm, learned positions.",
    )
    _formula(
        f"active_params_{_kind}",
        _expand(_total_params(k), _attn),
        "params",
        "Parameters a token uses: as the total, with only the k selected routed experts per MoE layer.",
    )

# --- KV cache ----------------------------------------------------------------------------------
kv_elements_gqa = _formula(
    "kv_elements_gqa",
    2 * sp.ceiling(n_kv / tp) * d,
    "elements/token/layer/GPU",
    "K and V of the KV heads one GPU holds; heads are split by tp and replicated when n_kv < tp.",
)
kv_elements_mla = _formula(
    "kv_elements_mla",
    r_kv + d_r,
    "elements/token/layer/GPU",
    "MLA caches the compressed latent and the shared rope key, replicated on every tensor-parallel GPU.",
)
kv_bytes_context = _formula(
    "kv_bytes_context",
    b_kv * e_kv * ((L - L_w) * c + L_w * sp.Min(c, W)),
    "B/sequence/GPU",
    "KV bytes of one sequence of c tokens on one GPU: full layers keep c tokens, sliding layers at most W.",
)

# --- attention work ----------------------------------------------------------------------------
_n1 = sp.Max(0, sp.Min(P + S, W) - P)
causal_pairs_full = _formula(
    "causal_pairs_full",
    S * P + S * (S + 1) / 2,
    "query-key pairs",
    "Pairs scored when S new tokens attend causally to P cached ones and to each other.",
)
causal_pairs_window = _formula(
    "causal_pairs_window",
    _n1 * P + _n1 * (_n1 + 1) / 2 + (S - _n1) * W,
    "query-key pairs",
    "As causal_pairs_full, but each query sees at most W keys (sliding-window layer).",
)
attention_flops = _formula(
    "attention_flops",
    2 * n_q * (d_qk + d_pv) * b * ((L - L_w) * causal_pairs_full.expr + L_w * causal_pairs_window.expr),
    "FLOP",
    "QK^T and PV matmuls over all layers for a batch; a decode step is S=1, P=c-1.",
)
attention_kv_read_bytes = _formula(
    "attention_kv_read_bytes",
    b * b_kv * e_kv * ((L - L_w) * (P + S) + L_w * sp.Min(P + S, W)),
    "B",
    "KV the attention kernel reads on one GPU (each layer's cache read once, flash-attention style).",
)
kv_write_bytes = _formula(
    "kv_write_bytes",
    b * b_kv * e_kv * ((L - L_w) * S + L_w * sp.Min(S, W)),
    "B",
    "KV the step writes on one GPU for its new tokens (sliding layers keep at most W).",
)

# --- linear layers -----------------------------------------------------------------------------
gemm_flops = _formula(
    "gemm_flops",
    2 * N_lin * T,
    "FLOP",
    "Multiply-adds of the linear layers: 2 FLOP per active weight per token.",
)
io_width_attention_gqa = _formula(
    "io_width_attention_gqa",
    2 * h + (2 * n_q * d + 2 * n_kv * d) / tp,
    "elements/token/layer",
    "Input and output widths of W_qkv and W_o on one GPU (inputs replicated, head outputs split by tp).",
)
io_width_attention_mla = _formula(
    "io_width_attention_mla",
    2 * h + 2 * r_q + r_kv + d_r + (n_q * (d_n + d_r) + n_q * (d_n + d_v) + n_q * d_v) / tp,
    "elements/token/layer",
    "Input and output widths of the MLA projections on one GPU.",
)
io_width_mlp = _formula(
    "io_width_mlp",
    2 * h + (2 + g) * I_ff / tp,
    "elements/token/layer",
    "Input and output widths of a dense MLP on one GPU (gate+up out, down in).",
)
io_width_moe = _formula(
    "io_width_moe",
    (k + E_s) * (2 * h + (2 + g) * I_e / tp) + E,
    "elements/token/layer",
    "Widths each token moves through its k routed and shared experts, plus router logits.",
)
activation_workspace_bytes = _formula(
    "activation_workspace_bytes",
    b_a * T * (4 * h + (n_q + 2 * n_kv) * d / tp + 2 * (1 + g) * sp.Max(I_ff, (k + E_s) * I_e) / tp) + 4 * b * V / tp,
    "B",
    "Peak activation memory of one forward of T tokens on one GPU (residual, qkv, MLP intermediates, fp32 logits), "
    "as vLLM's profiling run reserves it.",
)
expected_experts_touched = _formula(
    "expected_experts_touched",
    E * (1 - (1 - k / E) ** T),
    "experts",
    "Expected distinct experts that T tokens routed top-k uniformly over E experts touch; the weights a "
    "MoE layer reads in one step.",
)

# --- roofline and communication ----------------------------------------------------------------
roofline_time = _formula(
    "roofline_time",
    sp.Max(F / (pi * eta_c), Q / (beta_hbm * eta_m)) + n_k * tau_k,
    "s",
    "Time of an operator group: the slower of its compute and memory ceilings, plus kernel latencies.",
)
gemm_compute_efficiency = _formula(
    "gemm_compute_efficiency",
    eta_c * T / (T + T_half),
    "1",
    "Compute efficiency of a step's linear layers (GEMMs of T rows): the fitted peak eta_c, rolled off for few "
    "rows (a decode batch, a short prompt), where tensor-core tiles run part-empty and too few thread blocks hide "
    "the memory latency; half of eta_c at T = T_1/2. T_1/2 = 0 (the bundled GPU defaults): eta_c at every size.",
)
gemm_memory_efficiency = _formula(
    "gemm_memory_efficiency",
    sp.Piecewise((eta_m * r_gemv, T <= 1), (eta_m, True)),
    "1",
    "Memory efficiency of a step's linear layers (GEMMs of T rows): eta_m, or r_gemv x eta_m where a layer has one "
    "row (T = 1: a lone decode, a prompt's LM head). CPU BLAS runs a one-row layer as a GEMV that streams the weights "
    "once, but packs them into panels before a GEMM of two or more rows, so a one-row step there reads its weights "
    "about twice as fast; r_gemv = 1 (every GPU default): a GEMV streams as fast as any GEMM.",
)
decode_attention_memory_efficiency = _formula(
    "decode_attention_memory_efficiency",
    sp.Min(eta_m, n_blk * beta_blk / beta_hbm),
    "1",
    "Memory efficiency of the decode attention kernel: one thread block per (sequence, KV head) walks that "
    "sequence's cache at beta_blk, so with fewer blocks than it takes to fill the GPU (a small batch, few KV heads "
    "per GPU at high tp) the kernel reaches only n_blk x beta_blk of the HBM bandwidth, whatever the cache's size.",
)
block_scaled_memory_efficiency = _formula(
    "block_scaled_memory_efficiency",
    Q / (Q_w / sp.Min(eta_m, eta_bs) + (Q - Q_w) / eta_m),
    "1",
    "Memory efficiency of a group of linear layers whose fp8 weights carry fine-grained block scales (DeepSeek-V3's "
    "128 x 128 tiles), over its Q bytes of which Q_w are weights: where the tensor cores have no block-scaled MMA "
    "(Hopper), every K block's partial sums are rescaled on the CUDA cores between MMA steps, and the best such "
    "kernels stream their weights at eta_bs of the HBM peak, below what a per-tensor fp8 GEMM reaches (measured "
    "where the weights are the traffic: a decode step, a short prompt); the activations move at eta_m.",
)
launch_latency = _formula(
    "launch_latency",
    tau_k * g_graph,
    "s",
    "Latency a step pays per kernel: tau_k launched one by one (g = 1), or the share g of it that remains when the "
    "engine replays the step from a captured CUDA graph (decode steps in vLLM, SGLang and TensorRT-LLM).",
)
step_overhead_time = _formula(
    "step_overhead_time",
    o_step,
    "s",
    "The fixed part of every forward step, whatever it computes: the engine's scheduling, sampling and launch "
    "work between steps (a GPU entry's step_overhead_us); a step's time is its operator groups plus this.",
)
sequence_overhead_time = _formula(
    "sequence_overhead_time",
    n_seq * o_seq,
    "s",
    "The per-sequence part of a step's fixed work: every sequence in it (a decode, a prompt or a chunk of one) "
    "is scheduled, sampled and its output processed.",
)
arithmetic_intensity = _formula("arithmetic_intensity", F / Q, "FLOP/B", "FLOPs per byte moved.")
ring_allreduce_time = _formula(
    "ring_allreduce_time",
    n_coll * (2 * (tp - 1) / tp * M_msg / (beta_link * eta_l) + alpha * sp.Min(tp - 1, 1)),
    "s",
    "n ring all-reduces of M bytes over tp GPUs: 2(tp-1)/tp of the message crosses each link, plus latency.",
)
alltoall_time = _formula(
    "alltoall_time",
    n_coll * ((ep - 1) / ep * M_msg / (beta_link * eta_l) + alpha * sp.Min(ep - 1, 1)),
    "s",
    "n all-to-alls (MoE dispatch or combine) of M bytes per GPU over ep GPUs.",
)
group_link_bandwidth = _formula(
    "group_link_bandwidth",
    beta_agg * sp.Min(k_grp - 1, n_links) / n_links,
    "B/s",
    "Link bandwidth a group of k GPUs has per GPU: all of it through a switch (n_links = 1); in a full mesh "
    "only the k - 1 direct links to the group's members.",
)
p2p_time = _formula(
    "p2p_time", n_coll * (M_msg / (beta_link * eta_l) + alpha), "s", "n point-to-point sends of M bytes."
)

# --- activation traffic and workspace ----------------------------------------------------------
gemm_activation_bytes = _formula(
    "gemm_activation_bytes",
    b_a * T * X_io,
    "B",
    "Activations the linear layers of one GPU read and write: tokens x (input + output widths) x bytes.",
)

# --- memory ------------------------------------------------------------------------------------
N_tot = _sym("N", "all parameters", "params", "N")
N_emb = _sym("N_emb", "embedding and LM-head parameters", "params", "N_{emb}")
b_e = _sym("b_e", "bytes per embedding / LM-head weight (kept 16-bit)", "B", "b_{e}")
pp_sym = _sym("pp", "pipeline-parallel stages", "GPUs", "p")
u = _sym("u", "fraction of HBM the engine may use", "1")
M_hbm = _sym("M_hbm", "HBM capacity of one GPU", "B", "M_{hbm}")
W_b = _sym("W_b", "weight bytes on one GPU", "B", "W_{b}")
A_b = _sym("A_b", "activation workspace on one GPU", "B", "A_{b}")
R_b = _sym("R_b", "runtime reserve on one GPU (CUDA context, graphs, NCCL buffers)", "B", "R_{b}")
K_seq = _sym("K_seq", "KV bytes of one whole sequence on one GPU", "B", "K_{seq}")

weights_bytes_per_gpu = _formula(
    "weights_bytes_per_gpu",
    (b_w * (N_tot - N_emb) + b_e * N_emb) / (tp * pp_sym),
    "B",
    "Weights one GPU holds: linear weights at the weight format, embeddings 16-bit, split over tp x pp.",
)
kv_budget_bytes = _formula(
    "kv_budget_bytes",
    u * M_hbm - W_b - A_b - R_b,
    "B",
    "HBM left for the KV cache on one GPU after weights, activation workspace and the runtime reserve.",
)
max_batch = _formula(
    "max_batch",
    sp.floor(sp.Max(0, kv_budget_bytes.expr) / K_seq),
    "sequences",
    "Sequences of isl+osl tokens whose KV fits in the budget.",
)

# --- queueing and serving ----------------------------------------------------------------------
lam = _sym("lambda", "arrival rate at one queue", "1/s", r"\lambda")
ES = _sym("E_S", "mean service time", "s", r"E[S]")
cs2 = _sym("c_s2", "squared coefficient of variation of the service time", "1", r"c_s^2")
ca2 = _sym("c_a2", "squared coefficient of variation of the inter-arrival times (1: Poisson, above 1: bursty)", "1",
           r"c_a^2")
n_srv = _sym("c_srv", "servers sharing one queue", "servers", "c")
p_q = _sym("p", "percentile as a fraction", "1")
Wq = _sym("W_q", "mean wait in queue", "s", "W_{q}")
Pw = _sym("P_w", "probability that an arrival waits", "1", "P_{w}")
t_d = _sym("t_d", "decode step time", "s", "t_{d}")
rho_p = _sym("rho_p", "fraction of time spent in prefill", "1", r"\rho_{p}")
n_out = _sym("n_out", "output tokens per request", "tokens", "n_{out}")
T_eng = _sym("T_eng", "time to first token inside the engine (queue, batch slot, the prompt's own steps)", "s",
             "T_{eng}")
t_req = _sym("t_req", "a served request's time outside the engine's steps before its first token reaches the client",
             "s", "t_{req}")

served_ttft = _formula(
    "served_ttft",
    T_eng + t_req,
    "s",
    "Time to first token as a client measures it: the engine's (queue, batch slot, the prompt's steps) plus the "
    "request path around it (HTTP, chat template and tokenisation, the hand-off to the engine core, the first "
    "token's detokenising and streaming), a constant of the engine profile.",
)
server_utilisation = _formula("server_utilisation", lam * ES / n_srv, "1", "rho = lambda E[S] / c.")
wait_probability = _formula(
    "wait_probability",
    sp.Min(1, (lam * ES / n_srv) ** (sp.sqrt(2 * (n_srv + 1)) - 1)),
    "1",
    "Probability of waiting in M/M/c, Sakasegawa's approximation (exact, rho, for c = 1).",
)
mean_queue_wait = _formula(
    "mean_queue_wait",
    wait_probability.expr / (n_srv * (1 - lam * ES / n_srv)) * ES * (ca2 + cs2) / 2,
    "s",
    "G/G/c mean wait (Allen-Cunneen): the M/M/c wait times (c_a^2 + c_s^2) / 2; for Poisson arrivals (c_a^2 = 1) "
    "and c = 1 it is Pollaczek-Khinchine, lambda E[S^2] / (2 (1 - rho)), and for c = 1 Kingman's G/G/1 formula.",
)
gamma_arrival_wait_probability = _formula(
    "gamma_arrival_wait_probability",
    (1 + (1 - Pw) * ca2 / (lam * ES)) ** (-1 / ca2),
    "1",
    "One step of the fixed point P_w = A*(mu (1 - P_w)) of the GI/M/1 queue (the probability that an "
    "arrival waits), A* the Laplace transform of Gamma inter-arrivals of squared cv c_a^2 and mean 1/lambda, "
    "mu = 1/E[S]; iterated from P_w = rho it converges to the least root. P_w = rho for Poisson arrivals; "
    "bursty arrivals (c_a^2 > 1) come in clusters, so more of them wait, each for less.",
)
wait_percentile = _formula(
    "wait_percentile",
    Wq / Pw * sp.Max(0, sp.log(Pw / (1 - p_q))),
    "s",
    "p-quantile of the wait: an arrival waits with probability P_w, and then an exponential time of mean W_q/P_w.",
)
rho_q = server_utilisation.expr
slot_wait_factor = _formula(
    "slot_wait_factor",
    (ca2 + cs2) / 2 + (1 - sp.Min(cs2, 1)) * (1 - rho_q) * (n_srv - 1) * (sp.sqrt(4 + 5 * n_srv) - 2) / (32 * rho_q * n_srv),
    "1",
    "A G/G/c queue's mean wait over M/M/c's at the same load: Allen-Cunneen's (c_a^2 + c_s^2) / 2, plus "
    "Cosmetatos' correction for service less variable than exponential, interpolated in c_s^2 (for Poisson "
    "arrivals c_s^2 W(M/M/c) + (1 - c_s^2) W(M/D/c)). Cosmetatos: W(M/D/c) = W(M/M/c) (1 + K) / 2, "
    "K = (1 - rho)(c - 1)(sqrt(4 + 5c) - 2) / (16 rho c) (G. P. Cosmetatos, INFOR 13 (1975) 328-331; refined by "
    "T. Kimura, J. Oper. Res. Soc. 42 (1991) 595-603): at c = 13 servers 0.62 of M/M/c at rho 0.6 and 0.55 at "
    "0.8 where Allen-Cunneen alone says 0.5. For c = 1 it is Pollaczek-Khinchine's (1 + c_s^2) / 2.",
)
rho_full = _sym("rho_full", "the batch slots' load at the full batch's hold, lambda hold_full / c", "1",
                r"\rho_{full}")
slot_free_prompt_rate = _formula(
    "slot_free_prompt_rate",
    lam * sp.Max(1 - Pw / rho_full, 0) / (1 - Pw),
    "1/s",
    "Rate at which prompts start their prefill while a batch slot is free, the load a prompt that finds one "
    "queues behind. All the slots are taken a share P_w of the time (Poisson arrivals see time averages), and "
    "then a prompt starts only as a sequence leaves, c / hold_full = lambda / rho_full a second; the rest of the "
    "lambda starts fall in the free time: (lambda - P_w lambda / rho_full) / (1 - P_w). On one instance that "
    "prefills and decodes (Qwen3-30B-A3B, 6,000-token prompts, 13 slots, 0.9 of capacity: 0.85 lambda) 6% of "
    "the simulated prompts that found a slot free waited more than 0.15 s beyond their own time; the prompt "
    "queue's wait at this rate says 7.7%, at the whole lambda 10.3%. P_w stands for the time share of a full "
    "batch, which it is for Poisson arrivals; where stalls batch the arrivals (the chain's P_w is then the "
    "share of requests) or the holds are nearly fixed (the M/D/c scaling) it is an approximation, and the rate "
    "is 0 where P_w reaches rho_full.",
)
rho_x = _sym("rho_x", "share of the decodes' time that prompts stall them (the time prompts add to their steps)", "1",
             r"\rho_{x}")
stall_batch_q = _formula(
    "stall_batch_q",
    (1 - (1 - rho_x) ** 2) / (1 + (1 - rho_x) ** 2),
    "1",
    "Ratio q of the geometric batch, P(n) = (1 - q) q^(n - 1), in which requests reach the batch slots while "
    "prompts stall the decodes a share rho of the time. Those that arrive during one busy period of the "
    "stalls take their slots together: for fixed stalls their number is Borel, P(n) = exp(-rho n) "
    "(rho n)^(n - 1) / n! (the customers an M/D/1 busy period serves at load rho; J. C. Tanner, Biometrika 48 "
    "(1961) 222-224), mean 1 / (1 - rho) and E[n^2] / E[n] = 1 / (1 - rho)^2. The geometric of the same "
    "E[n^2] / E[n] = (1 + q) / (1 - q) makes the slots' level-crossing chain first order (one product, like the "
    "product form), and its P(all slots taken) is within 3% of the Borel chain's on the long-prompt grid.",
)
x_st = _sym("x_st", "time one prompt stalls the running decodes (its steps beyond the plain decode steps)", "s", "x")
H_hold = _sym("H", "how long a request holds its batch slot (its own prefill and its decoding)", "s")
stall_batch_share = _formula(
    "stall_batch_share",
    rho_x * sp.Max(0, 1 - x_st / ((1 - rho_x) * H_hold)),
    "1",
    "The stall share at which the batch slots see their arrivals in batches (``stall_batch_q``): rho_x "
    "where a stall busy period (x / (1 - rho_x) long) is short beside a hold H, none where it lasts a hold. "
    "The prompts of one busy period take their slots one after another as their prefills run; they land "
    "together in the batch only when that is quick beside how long each then holds its slot (Qwen3-30B-A3B, "
    "6,000-token prompts: 0.1 s beside 3 s). Gemma-3-27B with 20,000-token prompts and 16-token outputs, "
    "prefill first, has busy periods of 1.4 s beside a hold of 1.0 s: there the slots fill and empty one by one.",
)
cw2 = _sym("c_w2", "squared coefficient of variation of a wait, given that it is positive", "1", r"c_w^2")
k_wb = _sym("k", "Weibull shape of a wait (1: exponential)", "1")
wait_cv2_mg1 = _formula(
    "wait_cv2_mg1",
    (2 * Wq**2 + lam * ES**3 * (1 + cs2) * (1 + 2 * cs2) / (3 * (1 - lam * ES))) * lam * ES / Wq**2 - 1,
    "1",
    "Squared cv of an M/G/1 wait given that it is positive: Takacs' E[W^2] = 2 W_q^2 + lambda E[S^3] / "
    "(3 (1 - rho)) over P_w = rho, with E[S^3] = E[S]^3 (1 + c)(1 + 2c) (gamma moments). 1/3 for fixed "
    "service at light load (the wait is then the uniform rest of one prefill), 1 for exponential service.",
)
residual_cv2 = _formula(
    "residual_cv2",
    4 * (1 + 2 * cs2) / (3 * (1 + cs2)) - 1,
    "1",
    "Squared cv of the rest of a step in progress (length-biased residual), for steps of squared cv c "
    "with gamma moments: 1/3 for steps of one length, 1 for exponential ones.",
)
theta_wb = _sym("theta_w", "Weibull scale of a positive wait: its mean / Gamma(1 + 1/k)", "s", r"\theta_{w}")
weibull_tail_quantile = _formula(
    "weibull_tail_quantile",
    theta_wb * sp.Max(0, sp.log(Pw / (1 - p_q))) ** (1 / k_wb),
    "s",
    "p-quantile of a wait that is positive with probability P_w and then Weibull of scale theta and shape k "
    "(k = 1 is the exponential wait_percentile; k > 1 a less variable wait).",
)
N_arr = _sym("N_a", "mean arrivals during one step", "requests", "N_{a}")
prefill_step_batch = _formula(
    "prefill_step_batch",
    N_arr + sp.exp(-N_arr),
    "requests",
    "Mean prompts in a prefill step that takes every prompt that arrived during the step before, or the "
    "next arrival when none did: E[max(N, 1)] for N ~ Poisson(N_a).",
)
m_br = _sym("m", "prompts that arrive per prompt's share of a step (lambda tau)", "1")
e1_st = _sym("e_1", "mean of the prefill step in progress at an arrival (length-biased: E[T^2] / E[T])", "s", "e_{1}")
e2_st = _sym("e_2", "second moment of the prefill step in progress at an arrival (E[T^3] / E[T])", "s^2", "e_{2}")
tau_p = _sym("tau_p", "prefill step time per mean prompt it holds (slope of T(b) = T_0 + tau b)", "s", r"\tau_{p}")
cv2_l = _sym("cv2_isl", "squared coefficient of variation of the prompt length", "1", r"c_{\ell}^2")
k1_bl = _sym("k_1", "mean of the full steps a prompt waits beyond the next one: K = floor((L + A) / b_max), L the "
              "prompts left over from the step in progress, A those that arrived in it before this one", "steps",
              "k_{1}")
k2_bl = _sym("k_2", "second moment of K (k_1)", "steps^2", "k_{2}")
T_full_st = _sym("T_full", "a full prefill step, of the budget's worth of prompts", "s", r"T_{full}")
bulk_wait_mean = _formula(
    "bulk_wait_mean",
    (e1_st * (sp.Rational(1, 2) + m_br) + k1_bl * T_full_st) / n_srv,
    "s",
    "Mean of U t + tau S + K T_full over c servers for an arrival that finds every prefill instance busy: the rest "
    "U t of the step in progress t (U uniform), what the prompts S that arrived during it add to its own step "
    "(Poisson, lambda t prompts, m = lambda tau), and the K full steps it waits when the prompts ahead of it fill "
    "the next step's budget (the backlog near capacity).",
)
bulk_wait_variance = _formula(
    "bulk_wait_variance",
    (e2_st / 3 + tau_p * m_br * (1 + cv2_l) * e1_st + m_br**2 * e2_st + m_br * e2_st
     - (e1_st * (sp.Rational(1, 2) + m_br)) ** 2 + (k2_bl - k1_bl**2) * T_full_st**2) / n_srv**2,
    "s^2",
    "Variance of U t + tau S + K T_full over c servers (bulk_wait_mean): E[(Ut)^2] = e_2/3, S given t compound "
    "Poisson (variance tau m t (1 + cv^2), m the mean prompts per prompt's share of a step), Cov(Ut, tau S) = "
    "m Var(t) / 2, and K's own variance (its covariance with the step in progress left out).",
)
mixed_tpot = _formula(
    "mixed_tpot",
    t_d / (1 - rho_p),
    "s",
    "Time-average TPOT when prompts stall decode a share rho of the time (a prompt's whole prefill with "
    "prefill_first, its step beyond a plain decode step with hybrid): each token waits out the stalls.",
)
tpot_sym = _sym("TPOT", "time per output token", "s")
N_c = _sym("N_c", "requests a closed-loop client keeps in flight (its concurrency)", "requests", "N_{c}")
X_c = _sym("X_c", "requests completed per second", "1/s", "X")
x_p = _sym("x_p", "time one prompt adds to the step it rides in (beyond the plain decode step)", "s", "x_{p}")
S_own = _sym("S_own", "the engine time from a prompt's arrival to its first token (its own step or steps)", "s",
             "S_{own}")
closed_loop_stall_share = _formula(
    "closed_loop_stall_share",
    X_c * x_p * (N_c - 1) / N_c,
    "1",
    "Share of a decoding request's time spent on the other requests' prompts in a closed loop of N_c requests: "
    "prompts arrive at the completion rate X, each stalls the steps it rides in by x_p, and (N_c - 1) / N_c of "
    "them belong to other requests (a lone request is never stalled by its own prompt).",
)
closed_loop_throughput = _formula(
    "closed_loop_throughput",
    N_c / (t_req + S_own + (n_out - 1) * tpot_sym),
    "1/s",
    "Completion rate of a closed loop with no think time (the response-time law): N_c requests each cycle through "
    "the request path, their first token and n_out - 1 inter-token gaps, and the client sends the next at once.",
)
littles_law_batch = _formula(
    "littles_law_batch", lam * n_out * tpot_sym, "sequences",
    "Sequences decoding at once = arrival rate x output tokens x time per token (Little's law).",
)
n_in = _sym("n_in", "prompt tokens per request (mean)", "tokens", "n_{in}")
cv2_out = _sym("cv2_osl", "squared coefficient of variation of the output length", "1", r"c_{o}^2")
running_context = _formula(
    "running_context",
    n_in + (n_out * (1 + cv2_out) + 1) / 2,
    "tokens",
    "Mean context of a decoding sequence at a random step: its prompt and the output it has emitted so far. "
    "A request of n output tokens decodes for n steps, so the running ones are length-biased (weight n) and "
    "halfway through: E[n^2] / (2 E[n]) = n_out (1 + c_o^2) / 2 tokens of output, not n_out / 2.",
)
X2 = _sym("E_X2", "second moment of one prompt's stall (the time its step(s) add to every running decode)", "s^2",
          "E[X^2]")
inv_n = _sym("E_inv_n", "mean of 1 / (output tokens - 1) over requests", "1/tokens", r"E[1/n]")
t_slope = _sym("t_slope", "decode step time added by one more sequence in the batch", "s", r"{t'_{d}}")
B_sym = _sym("B", "mean sequences decoding at once", "sequences")
L_full = _sym("L_full", "sequences a full batch holds (its slots: KV memory or the batch cap, an integer)", "sequences",
              "L")
k_own = _sym("k_own", "steps of a request's own prefill that carry the decodes (1: a whole prompt; its pieces when "
             "chunked; 0: a prompt step of its own)", "steps", "k_{own}")
n_cycle = sp.Max(k_own + n_out - 1, 1)
x_f = sp.Symbol("x_{f}", real=True)  # signed, unlike the other symbols
SYMBOLS["x_f"] = (x_f, "time one prompt adds to the decodes at a full batch: its steps beyond as many plain decode "
                  "steps (negative where a step with a prompt piece is cheaper than the decode step alone)", "s")


def _prompt_stalls(n_prompts: sp.Expr, n_steps: sp.Expr) -> sp.Expr:
    """What ``n_prompts`` prompts of stall x_f each add over ``n_steps`` steps of a full batch: n x_f, except that a
    prompt in k_own > 1 pieces rides in k_own of the steps at x_f / k_own each, and no more than every step
    carries a piece; and a stall below zero (a step with a prompt piece cheaper than the plain decode step)
    saves at most its difference on every step."""
    one_step = n_prompts * sp.Max(x_f, 0) + sp.Min(n_prompts, n_steps) * sp.Min(x_f, 0)
    return sp.Piecewise((x_f * sp.Min(n_prompts, n_steps / sp.Max(k_own, 1)), k_own > 1), (one_step, True))


full_batch_hold = _formula(
    "full_batch_hold",
    n_cycle * (t_d + t_slope * (L_full - sp.Min(L_full * k_own / n_cycle, L_full - 1) - B_sym))
    + _prompt_stalls(L_full, n_cycle),
    "s",
    "How long a request holds its slot while the batch runs full (a prompt starts only as a sequence leaves): "
    "its k_own prefill steps and n_out - 1 decode steps, each of a step over the L slots less the L k_own / "
    "(k_own + n_out - 1) that hold prompts in prefill (t_d(B) + t' (L - n_p - B) on the roofline's linear "
    "stretch), plus the stall x_f of every prompt that starts in its time: its own and L - 1 others, one per "
    "departure. On the long-prompt grid (Qwen3-30B-A3B, 6,000-token prompts, 13 slots) the simulated instance "
    "run full finishes 3.479 requests a second chunked (2,048-token budget) against 3.480 here (3.43 "
    "before, from the time share of prefill instead of the step share), and 3.456 with whole prompts against "
    "3.524: there the simulation runs 13.13 decodes on average and 8.6% more prompt steps than requests finish, "
    "as it lets a fourteenth prompt in beside a young batch and recomputes the sequence it preempts later. "
    "The prompts' stalls are L x_f where a prompt runs in one step; one in k_own > 1 pieces rides in k_own steps, "
    "and no more than every step of the hold carries a piece (the pieces of L prompts need L k_own steps, more "
    "than the hold has where the room beside a full batch is small); a negative x_f (a step with a prompt piece "
    "cheaper than the decode step alone: vLLM's CPU backend attends such a step in one kernel, fitted faster than "
    "its decode-only kernel) saves at most its difference on every step.",
)
full_batch_tpot = _formula(
    "full_batch_tpot",
    t_d + _prompt_stalls(L_full - 1, n_out) / n_out,
    "s",
    "The largest TPOT a request can see when the batch is capped (KV memory or the batch cap): the batch held "
    "full at L sequences through its lifetime, so about L - 1 prompts start in it, one per departure, each adding "
    "its stall x_f; capped as in full_batch_hold where a prompt spans k_own > 1 steps (every step carries a piece "
    "at most) or its stall is negative. A step with a piece is then at most every step: TPOT <= t_d + x_f / "
    "k_own, a real step's time (uncapped, a chunk-64 instance fitted to vLLM's CPU engine with 63 slots put its "
    "ceiling at -2.07 s: 256 two-token pieces a prompt, each step 8 ms under the decode step alone).",
)
var_sym = _sym("V_T", "variance of a request's TPOT", "s^2", "V_{T}")
z_q = _sym("z", "standard normal quantile of the percentile", "1")
tpot_stall_variance = _formula(
    "tpot_stall_variance",
    ca2 * lam * tpot_sym * X2 * inv_n / (1 - rho_p) ** 2,
    "s^2",
    "Variance of a request's TPOT from the prompts that land in its lifetime: compound Poisson "
    "(lambda n TPOT stalls of second moment E[X^2]) over n tokens, times the arrivals' index of dispersion "
    "(c_a^2 for a renewal process over a lifetime of many gaps), amplified by 1/(1 - rho) because every "
    "stall lengthens the lifetime in which further prompts arrive. A prompt's stall X counts its own step "
    "time and the decode time its sequence adds to the batch for the rest of the lifetime; rho = lambda E[X].",
)
rho_d = _sym("rho_d", "decode load: arrivals x output tokens x the step time one more sequence adds", "1",
             r"\rho_{d}")
V_t = _sym("V_t", "variance of the decode step a request sees, over the batch's distribution", "s^2", "V_{t}")
batch_step_variance = _formula(
    "batch_step_variance",
    t_slope**2 * B_sym / (1 - rho_d),
    "s^2",
    "Variance of the decode step over the batch's distribution, for a step t_0 + t' n linear in the batch. Every "
    "sequence more slows every step, so lifetimes stretch as the batch grows: a birth-death batch of births "
    "lambda and deaths n / (n_out (t_0 + t' n)) (a processor-sharing queue, insensitive to the output-length "
    "distribution) is negative binomial, of variance B / (1 - rho_d), rho_d = lambda n_out t'; Poisson "
    "(M/G/infinity) at rho_d = 0. A decode instance without prompts takes the same product form over its "
    "own step curve instead (``serving.base.product_form_step_moments``).",
)
tpot_batch_variance = _formula(
    "tpot_batch_variance",
    V_t * (2 + rho_d) / 3 / (1 - rho_p) ** 2,
    "s^2",
    "Variance of a request's TPOT from the decode batch it shares: the step's variance over the batch's "
    "distribution, of which the average over one lifetime keeps 2/3 at rho_d = 0, where the batch renews within "
    "a lifetime, and all as rho_d -> 1, where it relaxes in lifetime / (1 - rho_d).",
)
rho_b = _sym("rho_b", "share of time the prompt queue is busy (steps that carry prompt work)", "1", r"\rho_{b}")
t_b = _sym("t_b", "mean duration of a step that carries prompt work", "s", "t_{b}")
S_w = _sym("S_w", "time one prompt keeps the prompt queue busy", "s", "S_{w}")
S_k = _sym("S_k", "a chunked prompt's steps, each run for it alone (k - 1 full chunks and the part-filled last)", "s",
           "S_{k}")
k_it = _sym("k_it", "steps a chunked prompt takes on its own: ceil(n / (C - B))", "steps", "k")
n_c = _sym("n_c", "a chunked prompt's new tokens over a step's room for prompt tokens, n / (C - B)", "steps", "n_{c}")
t_C = _sym("t_C", "a step that carries a full chunk", "s", "t_{C}")
P_sh = _sym("P_sh", "probability that another prompt waits to fill a chunked prompt's part-filled last step", "1",
            r"P_{sh}")
chunked_last_step_shared = _formula(
    "chunked_last_step_shared",
    sp.Piecewise((1, 1 + lam * (S_k - n_c * t_C) <= 0), (sp.Min(1, lam * S_k / (1 + lam * (S_k - n_c * t_C))), True)),
    "1",
    "Probability that a prompt of several chunks leaves another waiting as its last, part-filled chunk runs, "
    "which then fills the rest of that step: the prompt queue's load lambda S_w (an M/G/1 departure leaves "
    "someone behind with probability rho), with S_w = S_k - P (S_k - n t_C / (C - B)) the busy time that "
    "itself depends on it (``chunked_prompt_busy``), solved for P; 1 where the full chunks alone saturate "
    "the queue (lambda n t_C / (C - B) = 1), and beyond, where the denominator is no longer positive (the root "
    "there was negative, and so the prompt's busy time: a chunk-64 instance with 63 slots, one token of room "
    "beside a full batch, called overloaded at 8 req/s with a utilisation of 0.65 and a prompt queue at -3.1).",
)
chunked_prompt_busy = _formula(
    "chunked_prompt_busy",
    S_k - P_sh * (S_k - n_c * t_C),
    "s",
    "Time a prompt of several chunks keeps the prompt queue busy. Its last chunk fills part of a step; the next "
    "prompt's first chunk fills the rest where one is waiting (``chunked_last_step_shared``), and otherwise "
    "that step runs part-filled, nearly as long as a full one, for this prompt alone: n / (C - B) full steps "
    "when prompts queue back to back, its own k steps S_k at light load (Qwen3-30B-A3B, 6,000 new tokens at "
    "2,048 a step: 2.93 full steps, 118 ms, against 3 steps, 127 ms, of which the simulated decodes' TPOT is "
    "5% longer than the full steps' count makes it).",
)
chunked_prompt_steps = _formula(
    "chunked_prompt_steps",
    k_it - P_sh * (k_it - n_c),
    "steps",
    "Steps a prompt of several chunks keeps the prompt queue busy (``chunked_prompt_busy``): k at light load, "
    "n / (C - B) when prompts queue back to back.",
)
busy_batch_rise = _formula(
    "busy_batch_rise",
    lam * S_w * (ca2 + cs2) / (1 - rho_b) ** 2 / 2,
    "sequences",
    "How much higher the decode batch runs while prompts are queued: the length-biased M/G/1 busy "
    "period E[S^2] / (E[S] (1 - rho)^2) times lambda, halved (the batch grows through it, as prompts "
    "finish and lifetimes stretch); with (c_a^2 + c_s^2) / 2 in place of (1 + c_s^2) / 2 for bursty arrivals.",
)
dB_sym = _sym("Delta_B", "rise of the decode batch while prompts are queued", "sequences", r"\Delta B")
token_weighted_tpot = _formula(
    "token_weighted_tpot",
    B_sym / (rho_b * (B_sym + (1 - rho_b) * dB_sym) / t_b + (1 - rho_b) * (B_sym - rho_b * dB_sym) / t_d),
    "s",
    "Mean TPOT as a request sees it: the batch B over the tokens emitted per second, in busy steps (share "
    "rho_b, duration t_b, batch B + (1 - rho_b) Delta B) and plain decode steps (t_d, batch B - rho_b Delta B). "
    "With Delta B = 0 it is t_d / (1 - rho_x); the correlation of long steps with a large batch raises it.",
)
n_dp = _sym("n_dp", "attention data-parallel ranks that step together, each admitting its own prompts", "ranks",
            "n_{dp}")
q_own = _sym("q_own", "share of one rank's steps that carry its own prompt work", "1", "q")
q_any = _sym("q_any", "share of the steps in which some rank carries prompt work", "1", r"q_{any}")
dp_busy_steps = _formula(
    "dp_busy_steps",
    1 - (1 - q_own) ** n_dp,
    "1",
    "Share of the steps that carry prompt work on some rank, where n attention data-parallel ranks step together "
    "(the MoE dispatch and combine join them every layer, so a step lasts as long as its slowest rank's) and each "
    "admits its own prompts, independently, in a share q of its steps (vLLM's and SGLang's data-parallel "
    "attention, TensorRT-LLM's without attention_dp_config.enable_balance). A prompt on one rank stretches the "
    "step of all: TensorRT-LLM measured the iteration time as the maximum over the ranks and 1.33x the "
    "throughput once the ranks take their prompts in the same steps (DeepSeek-V3 on 8 GB200, blog10_ADP_Balance_"
    "Strategy). For n = 1 it is q.",
)
F_k = _sym("F_k", "probability that one rank carries at most k prompts in a step", "1", "F_{k}")
dp_busiest_exceeds = _formula(
    "dp_busiest_exceeds",
    1 - F_k**n_dp,
    "1",
    "Probability that the busiest of n ranks carries more than k whole prompts in a step, each carrying at most k "
    "with probability F_k (independently: each rank's prompts that arrived during the step before, Poisson with "
    "mean lambda T, up to the prompts its token budget holds, m). Summed over k = 0 ... m - 1 it is the mean "
    "prompt count of the busiest rank, E[max_r min(K_r, m)], which takes the place of q_any in ``dp_mean_step`` "
    "for whole prompts (hybrid and prefill-first steps): the step waits for the rank that took the most. For one "
    "rank the sum is E[min(K, m)], lambda T while the budget holds them all.",
)
dp_mean_step = _formula(
    "dp_mean_step",
    t_d + q_any * (t_b - t_d),
    "s",
    "Mean step of a rank that waits for the others: a plain decode step t_d, or a step of t_b wherever some rank "
    "carries prompt work (share q_any, ``dp_busy_steps``). Its own share q = lambda (S_w / t_b) T counts its "
    "prompts' busy steps per step of that mean length, so T solves T = t_d + (t_b - t_d) q_any(lambda S_w T / t_b) "
    "on [t_d, t_b] for chunked pieces (one root: the right side is concave in T and ends below t_b); for whole "
    "prompts the busiest rank's count (``dp_busiest_exceeds``) stands for q_any, on [t_d, t_d + (t_b - t_d) m]. "
    "For one rank it is t_d / (1 - lambda S_w (t_b - t_d) / t_b), the token-weighted TPOT without the batch's "
    "rise.",
)
t_own = _sym("t_own", "duration of the step that carries a request's own (whole) prompt", "s", r"t_{own}")
b_n = _sym("b_n", "mean over requests of (1 + rho + ... + rho^(n-1)) / n, n its gaps (0 for none)", "1",
           r"\bar{b}_{n}")
bulk_start_stall = _formula(
    "bulk_start_stall",
    rho_p * (t_own - tpot_sym) * b_n,
    "s",
    "What a request's mean TPOT gains because it starts decoding right after a step that carried its whole "
    "prompt: the prompts that arrived during that step (lambda t_own of them) run in the next step, where a "
    "random moment of its life would find only those that arrived during one of its gaps (lambda TPOT). Each "
    "extra prompt adds its stall x, and every gap it lengthens admits more prompts into the next: over a "
    "request's n gaps the delay grows by 1 + rho + ... + rho^(n-1) (rho = lambda x), spread over the n gaps "
    "(b_n, averaged over the output lengths; 1 / (1 - rho) over n for long outputs, nothing without a gap). "
    "Chunked prompts that span several steps leave a FIFO queue behind as an arrival finds it: no such term.",
)
b_n2 = _sym("b_n2", "mean over requests of ((1 + rho + ... + rho^(n-1)) / n)^2", "1", r"\bar{b}^{(2)}_{n}")
bulk_start_variance = _formula(
    "bulk_start_variance",
    lam * t_own * X2 * b_n2,
    "s^2",
    "Variance that the prompts queued behind a request's own step add to its TPOT: their number is Poisson "
    "(mean lambda t_own), each a stall of second moment E[X^2], grown over the gaps like the mean (b_n2).",
)
w_pq = _sym("w_p", "p-quantile of a prompt's wait for its step", "s", "w_{p}")
w_mean = _sym("w_mean", "mean of a prompt's wait for its step", "s", r"\bar{w}")
s_pq = _sym("s_p", "p-quantile of a prompt's own time (its step or steps)", "s", "s_{p}")
s_mean_sym = _sym("s_mean", "mean of a prompt's own time", "s", r"\bar{s}")
_excess = (w_pq - w_mean) * sp.Abs(w_pq - w_mean) + (s_pq - s_mean_sym) * sp.Abs(s_pq - s_mean_sym)
wait_plus_own_quantile = _formula(
    "wait_plus_own_quantile",
    ((w_pq + s_pq) + (w_mean + s_mean_sym + sp.sign(_excess) * sp.sqrt(sp.Abs(_excess)))) / 2,
    "s",
    "p-quantile of a prompt's wait plus its own time: halfway between the sum of the two p-quantiles (the "
    "parts in lockstep, an upper bound) and the independent-normal combination (their excesses over the means "
    "in quadrature, signed), which is short for right-skewed parts such as lognormal prompt lengths and the "
    "wait's exponential tail. Both are w_p + s_p where the own time does not vary.",
)
lognormal_quantile = _formula(
    "lognormal_quantile",
    tpot_sym * sp.exp(z_q * sp.sqrt(sp.log(1 + var_sym / tpot_sym**2)) - sp.log(1 + var_sym / tpot_sym**2) / 2),
    "s",
    "p-quantile of a lognormal with mean TPOT and variance V_T (a request's TPOT is a positive sum, skewed right).",
)
k_g = _sym("k_g", "gamma shape", "1", "k")
theta_g = _sym("theta_g", "gamma scale", "s", r"\theta")
gamma_quantile_wh = _formula(
    "gamma_quantile_wh",
    k_g * theta_g * sp.Max(0, 1 - 1 / (9 * k_g) + z_q / (3 * sp.sqrt(k_g))) ** 3,
    "s",
    "p-quantile of a gamma(k, theta) by Wilson and Hilferty's cube-root normal approximation.",
)
kv_transfer_time = _formula(
    "kv_transfer_time",
    Q / (beta_link * eta_l) + alpha,
    "s",
    "Moving a request's KV cache (Q bytes, summed over the parallel links) from the prefill to the decode pool.",
)

# --- speculative decoding ----------------------------------------------------------------------
a_acc = _sym("a_acc", "probability that a draft token is accepted (each independently)", "1", r"a")
n_draft = _sym("n_draft", "draft tokens proposed per step", "tokens", r"n_{d}")
t_verify = _sym("t_verify", "target step verifying n_d + 1 tokens per sequence", "s", r"t_{v}")
t_draft = _sym("t_draft", "draft network's step for one proposed token", "s", r"t_{dr}")
spec_tokens_per_step = _formula(
    "spec_tokens_per_step",
    (1 - a_acc ** (n_draft + 1)) / (1 - a_acc),
    "tokens",
    "Tokens one speculative step emits per sequence: the accepted prefix of the n_d drafts plus the target's "
    "own next token, 1 + a + ... + a^n_d (Leviathan et al., 2023).",
)
spec_tpot = _formula(
    "spec_tpot",
    (t_verify + n_draft * t_draft) * (1 - a_acc) / (1 - a_acc ** (n_draft + 1)),
    "s",
    "Time per output token with speculative decoding: n_d draft steps and one verify step per step, over the "
    "tokens the step emits.",
)
