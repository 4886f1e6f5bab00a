"""Parameter counts of a ModelSpec, evaluated by ``formulas`` (generated from ``formulas_sympy``)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from hardware_db.schema import ModelSpec

from . import formulas as f


@lru_cache(maxsize=256)
def shape_values(m: ModelSpec) -> Mapping[str, float]:
    """The model's symbol values, keyed by formula symbol name (read-only; specs are frozen, so the
    mapping is computed once per model)."""
    moe, mla = m.moe, m.mla
    v: dict[str, float] = {
        "h": m.hidden_size, "V": m.vocab_size, "L": m.num_layers, "L_m": m.num_moe_layers,
        "L_w": m.num_sliding_layers, "W": m.sliding_window or 0,
        "n_q": m.num_attention_heads, "n_kv": m.num_kv_heads, "d": m.head_dim,
        "I": m.intermediate_size, "g": int(m.gated_mlp),
        "beta_qkv": int(m.qkv_bias), "beta_o": int(m.o_bias), "beta_mlp": int(m.mlp_bias),
        "nu_qk": int(m.qk_norm), "sigma": int(m.attention_sinks),
        "n_norm": m.norms_per_layer, "beta_ln": int(m.norm == "layernorm"),
        "tie": int(m.tie_word_embeddings), "P_pos": m.learned_position_embeddings,
        "E": moe.num_experts if moe else 1, "k": moe.experts_per_token if moe else 1,
        "E_s": moe.num_shared_experts if moe else 0, "I_e": moe.expert_intermediate_size if moe else 0,
        "beta_e": int(moe.expert_bias) if moe else 0, "beta_r": int(moe.router_bias) if moe else 0,
        "r_q": mla.q_lora_rank if mla else 0, "r_kv": mla.kv_lora_rank if mla else 0,
        "d_n": mla.qk_nope_head_dim if mla else 0, "d_r": mla.qk_rope_head_dim if mla else 0,
        "d_v": mla.v_head_dim if mla else 0,
    }
    return MappingProxyType(v)


def _kind(m: ModelSpec) -> str:
    return "mla" if m.mla is not None else "gqa"


@lru_cache(maxsize=256)
def param_count(m: ModelSpec) -> int:
    return round(float(f.FORMULAS[f"total_params_{_kind(m)}"](shape_values(m))))


@lru_cache(maxsize=256)
def active_param_count(m: ModelSpec) -> int:
    return round(float(f.FORMULAS[f"active_params_{_kind(m)}"](shape_values(m))))


@lru_cache(maxsize=256)
def attention_params(m: ModelSpec) -> int:
    """Per-layer attention parameters."""
    formula = f.attention_params_mla if m.mla is not None else f.attention_params_gqa
    return round(float(formula(shape_values(m))))


@lru_cache(maxsize=256)
def embedding_params(m: ModelSpec) -> int:
    """Input embedding plus LM head (once when tied) plus learned positions."""
    return int(f.embedding_params(shape_values(m)))


@lru_cache(maxsize=256)
def routed_expert_params(m: ModelSpec) -> int:
    """All routed-expert weights in the model (0 for dense models)."""
    if m.moe is None:
        return 0
    return round(float(f.expert_params(shape_values(m)))) * m.moe.num_experts * m.num_moe_layers
