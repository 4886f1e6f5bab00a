"""Build a ModelSpec from a Hugging Face ``config.json`` (a path or an already-parsed dict).

Supported ``model_type`` families and how their keys map (defaults are the transformers config
classes' defaults where a key is absent): llama, mistral, mixtral, qwen2, qwen3, qwen3_moe,
deepseek_v3 (also kimi_k2), gpt_oss, gemma2, gemma3 / gemma3_text.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hardware_db.schema import MLASpec, ModelSpec, MoESpec

SUPPORTED_FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss",
    "gemma2", "gemma3", "gemma3_text",
)
MAX_CONFIG_BYTES = 1_000_000

# transformers defaults used when a config omits the key
_DEFAULT_VOCAB = {"gemma3_text": 262208, "gemma2": 256000}
_DEFAULT_MAX_POS = {"gemma3_text": 131072, "gemma2": 8192}
_DEFAULT_SLIDING_PATTERN = {"gemma3_text": 6}


def _read(source: str | os.PathLike[str] | dict[str, Any]) -> dict[str, Any]:
    if isinstance(source, dict):
        return source
    p = Path(source)
    if p.is_dir():
        p = p / "config.json"
    try:
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{p}: config larger than {MAX_CONFIG_BYTES} bytes")
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{p}: cannot read config ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a config.json must be a JSON object")
    return data


def _get(cfg: dict[str, Any], key: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise ValueError(f"config: missing required key {key!r}")
    return default


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")
    return (s or "custom-model")[:64]


def _sliding(cfg: dict[str, Any], family: str, layers: int) -> tuple[int | None, int]:
    """(window, number of sliding layers) from layer_types, a pattern, or a global window."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        n = sum(1 for t in types if t == "sliding_attention")
        return (int(window) if n and window else None), (n if window else 0)
    if family in ("qwen2", "qwen3", "qwen3_moe"):
        if not cfg.get("use_sliding_window", False) or not window:
            return None, 0
        max_window_layers = int(cfg.get("max_window_layers", layers))
        return int(window), max(0, layers - max_window_layers)
    if family == "gemma2":
        return (int(window), layers // 2) if window else (None, 0)  # even layers slide
    if family == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern", _DEFAULT_SLIDING_PATTERN[family]))
        full = sum(1 for i in range(layers) if (i + 1) % pattern == 0)
        return (int(window), layers - full) if window else (None, 0)
    if family == "mistral" and window:
        return int(window), layers  # every layer uses the window
    return None, 0


def model_from_hf_config(
    source: str | os.PathLike[str] | dict[str, Any], model_id: str | None = None, name: str | None = None
) -> ModelSpec:
    """A ModelSpec from a config.json. Unsupported families raise ValueError naming the supported ones."""
    outer = _read(source)
    family = str(outer.get("model_type", ""))
    cfg = outer
    if family == "gemma3":  # multimodal wrapper: the decoder lives in text_config
        cfg = dict(outer.get("text_config") or {})
        family = "gemma3_text"
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"config: model_type {family or '(missing)'!r} is not supported; supported: {', '.join(SUPPORTED_FAMILIES)}"
        )
    try:
        return _build(cfg, family, outer, model_id, name)
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"config: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None
    except (TypeError, ValueError) as e:
        if str(e).startswith("config:"):
            raise
        raise ValueError(f"config: {e}") from None


def _build(cfg: dict[str, Any], family: str, outer: dict[str, Any], model_id: str | None, name: str | None) -> ModelSpec:
    layers = int(_get(cfg, "num_hidden_layers"))
    hidden = int(_get(cfg, "hidden_size"))
    heads = int(_get(cfg, "num_attention_heads"))
    kv_heads = int(_get(cfg, "num_key_value_heads", heads))
    head_dim = int(_get(cfg, "head_dim", hidden // heads))
    vocab = int(_get(cfg, "vocab_size", _DEFAULT_VOCAB.get(family, ...)))
    max_pos = int(_get(cfg, "max_position_embeddings", _DEFAULT_MAX_POS.get(family, 4096)))
    tie = bool(cfg.get("tie_word_embeddings", family in ("gemma2", "gemma3_text")))
    window, n_sliding = _sliding(cfg, family, layers)
    intermediate = int(_get(cfg, "intermediate_size"))
    spec: dict[str, Any] = dict(
        family=family, num_layers=layers, hidden_size=hidden, vocab_size=vocab, tie_word_embeddings=tie,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate,
        max_position_embeddings=max_pos, sliding_window=window, num_sliding_layers=n_sliding,
    )
    attention_bias = bool(cfg.get("attention_bias", False))
    if family == "qwen2":
        spec["qkv_bias"] = True
    elif family == "gpt_oss":
        spec.update(qkv_bias=attention_bias, o_bias=attention_bias, attention_sinks=True)
    elif attention_bias:
        spec.update(qkv_bias=True, o_bias=True)
    if family in ("qwen3", "qwen3_moe", "gemma3_text"):
        spec["qk_norm"] = True
    if family in ("gemma2", "gemma3_text"):
        spec["norms_per_layer"] = 4

    if family in ("deepseek_v3", "kimi_k2"):
        spec["mla"] = MLASpec(
            q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(_get(cfg, "kv_lora_rank")),
            qk_nope_head_dim=int(_get(cfg, "qk_nope_head_dim")), qk_rope_head_dim=int(_get(cfg, "qk_rope_head_dim")),
            v_head_dim=int(_get(cfg, "v_head_dim")),
        )
        spec["moe"] = MoESpec(
            num_experts=int(_get(cfg, "n_routed_experts")), experts_per_token=int(_get(cfg, "num_experts_per_tok")),
            expert_intermediate_size=int(_get(cfg, "moe_intermediate_size")),
            num_shared_experts=int(cfg.get("n_shared_experts") or 0),
            num_dense_layers=int(cfg.get("first_k_dense_replace") or 0),
            router_bias=cfg.get("topk_method") == "noaux_tc",
        )
    elif family == "mixtral":
        spec["moe"] = MoESpec(
            num_experts=int(_get(cfg, "num_local_experts")), experts_per_token=int(_get(cfg, "num_experts_per_tok")),
            expert_intermediate_size=intermediate,
        )
    elif family == "qwen3_moe":
        step = int(cfg.get("decoder_sparse_step", 1))
        dense_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = [i for i in range(layers) if i not in dense_only and (i + 1) % step == 0]
        if len(moe_layers) != layers - len(dense_only) or (dense_only and sorted(dense_only) != list(range(len(dense_only)))):
            raise ValueError("config: only leading dense layers are supported for qwen3_moe (mlp_only_layers)")
        spec["moe"] = MoESpec(
            num_experts=int(_get(cfg, "num_experts")), experts_per_token=int(_get(cfg, "num_experts_per_tok")),
            expert_intermediate_size=int(_get(cfg, "moe_intermediate_size")), num_dense_layers=len(dense_only),
        )
    elif family == "gpt_oss":
        spec["moe"] = MoESpec(
            num_experts=int(_get(cfg, "num_local_experts")),
            experts_per_token=int(cfg.get("experts_per_token") or _get(cfg, "num_experts_per_tok")),
            expert_intermediate_size=intermediate, router_bias=True, expert_bias=True,
        )

    repo = outer.get("_name_or_path") or None
    label = name or (str(repo) if repo else family)
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(outer.get("torch_dtype")), "bf16")
    if outer.get("quantization_config"):
        dtype = str(outer["quantization_config"].get("quant_method", dtype))
    return ModelSpec(
        id=_slug(model_id or label), name=label, hf_repo=str(repo) if repo else None,
        checkpoint_dtype=dtype, sources=("user-supplied Hugging Face config.json",), **spec,
    )
