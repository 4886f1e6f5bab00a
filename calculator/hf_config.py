"""Build a ModelSpec from a Hugging Face ``config.json`` (a path or an already-parsed dict).

Supported ``model_type`` families and how their keys map (defaults are the transformers config
classes' defaults where a key is absent or null): llama, mistral, mixtral, qwen2, qwen3, qwen3_moe,
deepseek_v3 (also kimi_k2), gpt_oss, gemma2, gemma3 / gemma3_text.

The input may be hostile (the REST API passes a user's JSON object), so every value is checked before
it is used: its JSON type (a boolean is not an integer, ``4096.0`` is 4096 but ``4096.7`` is refused,
a string is not a number) and, for a shape, its range, read from the ``Field`` constraints of
``hardware_db.schema`` (ModelSpec, MoESpec, MLASpec), so the bounds are the schema's own. No work
scales with a raw value: layer counts are closed forms and lists are length-checked before they are
read. Every failure is one ``InputError`` whose field is the caller's prefix plus the key path in the
config (``config.text_config.hidden_size``); the schema's cross-field checks are reported against the
config keys that fed them.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, ValidationError

from hardware_db.schema import MLASpec, ModelSpec, MoESpec

from .errors import InputError
from .files import read_text_file
from .limits import MAX_CONFIG_BYTES, MAX_HF_CONFIG_KEYS

SUPPORTED_FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss",
    "gemma2", "gemma3", "gemma3_text",
)

# transformers defaults used when a config omits the key
_DEFAULT_VOCAB = {"gemma3_text": 262208, "gemma2": 256000}
_DEFAULT_MAX_POS = {"gemma3_text": 131072, "gemma2": 8192}
_DEFAULT_SLIDING_PATTERN = 6  # gemma3_text: every 6th layer attends globally
_MAX_NAME_CHARS = 512  # _name_or_path, copied into the spec's name
_MAX_DTYPE_CHARS = 64  # quant_method / torch_dtype
_REQUIRED: Any = object()


@functools.cache
def _schema_bounds(model: type[BaseModel], name: str) -> tuple[int, int]:
    """(lowest, highest) integer the schema field ``model.name`` accepts, from its gt/ge/lt/le constraints."""
    lo = hi = None
    for c in model.model_fields[name].metadata:
        if isinstance(c, annotated_types.Gt):
            lo = int(c.gt) + 1
        elif isinstance(c, annotated_types.Ge):
            lo = int(c.ge)
        elif isinstance(c, annotated_types.Lt):
            hi = int(c.lt) - 1
        elif isinstance(c, annotated_types.Le):
            hi = int(c.le)
    if lo is None or hi is None:
        raise AssertionError(f"{model.__name__}.{name} declares no integer bounds")
    return lo, hi


_LAYERS = _schema_bounds(ModelSpec, "num_layers")
_LAYER_COUNT = (0, _LAYERS[1])  # a number of layers that may be zero (max_window_layers)
_STEP = (1, _LAYERS[1])  # a layer period (sliding_window_pattern, decoder_sparse_step)


# ------------------------------------------------------------------------------------- reading values

def _at(path: str, key: str | int) -> str:
    """The dotted path of ``key`` inside ``path`` (``path`` may be empty: then the key alone)."""
    return f"{path}.{key}" if path else str(key)


def _show(value: Any) -> str:
    """A short description of a JSON value for an error message (never its full text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) < 10**15:
            return f"{value:,}"
        if value.bit_length() < 1000:
            return f"{float(value):.3g}"
        return f"an integer of {value.bit_length():,} bits"  # str() itself refuses past 4300 digits
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value):,} item" + ("" if len(value) == 1 else "s")
    if isinstance(value, Mapping):
        return "an object"
    return f"a value of type {type(value).__name__}"


def _as_int(value: Any, where: str, bounds: tuple[int, int]) -> int:
    """``value`` as an int within ``bounds``; a whole float (4096.0) counts, a bool or 4096.7 does not."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(where, f"must be a finite integer, got {_show(value)}")
        if not value.is_integer():
            raise InputError(where, f"must be a whole number, got {_show(value)}")
        value = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise InputError(where, f"must be an integer, got {_show(value)}")
    lo, hi = bounds
    if value < lo:
        raise InputError(where, f"must be an integer ≥ {lo:,}, got {_show(value)}")
    if value > hi:
        raise InputError(where, f"must be an integer ≤ {hi:,}, got {_show(value)}")
    return value


def _int(cfg: Mapping[str, Any], path: str, key: str, bounds: tuple[int, int], default: Any = _REQUIRED,
         ) -> int:
    """Integer ``cfg[key]`` within ``bounds``; null or absent gives ``default`` (an error when required)."""
    value = cfg.get(key)
    if value is None:
        if default is _REQUIRED:
            raise InputError(_at(path, key), "required, but missing or null")
        return default
    return _as_int(value, _at(path, key), bounds)


def _bool(cfg: Mapping[str, Any], path: str, key: str, default: bool) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(_at(path, key), f"must be true or false, got {_show(value)}")
    return value


def _str(cfg: Mapping[str, Any], path: str, key: str, max_chars: int) -> str | None:
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(_at(path, key), f"must be a string, got {_show(value)}")
    if len(value) > max_chars:
        raise InputError(_at(path, key), f"must be at most {max_chars} characters, got {len(value):,}")
    return value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as a JSON object of at most MAX_HF_CONFIG_KEYS keys."""
    if not isinstance(value, Mapping):
        raise InputError(where, f"must be an object, got {_show(value)}")
    if len(value) > MAX_HF_CONFIG_KEYS:
        raise InputError(where, f"has {len(value):,} keys, more than the {MAX_HF_CONFIG_KEYS} allowed")
    return value


def _read(source: Any, field: str) -> Mapping[str, Any]:
    """The config object: ``source`` itself, or the JSON object in that file (or in source/config.json)."""
    if isinstance(source, Mapping):
        return _object(source, field)
    if not isinstance(source, (str, os.PathLike)):
        raise InputError(field, f"must be a config.json object or a path to one, got {_show(source)}")
    p = Path(source)
    if "\x00" in str(p):
        raise InputError(field, "a path cannot contain a NUL character")
    try:
        if p.is_dir():
            p = p / "config.json"
    except OSError:
        pass  # read_text_file says why it cannot be read
    text = read_text_file(p, field, MAX_CONFIG_BYTES)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(field, f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise InputError(field, f"{p}: not a usable config.json (nested too deeply)") from None
    except ValueError:  # an integer literal past Python's digit limit
        raise InputError(field, f"{p}: not a usable config.json (a number with too many digits)") from None
    if not isinstance(data, dict):
        raise InputError(field, f"{p}: a config.json must be a JSON object, got {_show(data)}")
    return _object(data, field)


# ------------------------------------------------------------------------------------- the mapping

def _block_size(value: Any, where: str) -> tuple[int, int] | None:
    """A quantisation config's ``weight_block_size``: two positive integers (rows, columns), or absent."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise InputError(where, f"must be two integers [rows, columns], got {_show(value)}")
    rows, cols = (_as_int(v, _at(where, i), (1, 65_536)) for i, v in enumerate(value))
    return rows, cols


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")
    return (s or "custom-model")[:64]


def _count_sliding(types: Any, where: str, layers: int) -> int:
    """Layers marked 'sliding_attention' in a layer_types list of exactly ``layers`` strings."""
    if not isinstance(types, (list, tuple)):
        raise InputError(where, f"must be a list of strings, got {_show(types)}")
    if len(types) != layers:
        raise InputError(where, f"must have one entry per layer (num_hidden_layers = {layers:,}), "
                                f"got {len(types):,}")
    n = 0
    for i, t in enumerate(types):
        if not isinstance(t, str):
            raise InputError(_at(where, i), f"must be a string such as 'full_attention', got {_show(t)}")
        n += t == "sliding_attention"
    return n


def _sliding(cfg: Mapping[str, Any], path: str, family: str, layers: int) -> tuple[int | None, int]:
    """(window, number of sliding layers) from layer_types, a pattern, or a global window."""
    window_bounds = _schema_bounds(ModelSpec, "sliding_window")
    has_window = cfg.get("sliding_window") is not None

    def window() -> int:
        return _int(cfg, path, "sliding_window", window_bounds)

    if cfg.get("layer_types") is not None:
        n = _count_sliding(cfg["layer_types"], _at(path, "layer_types"), layers)
        return (window(), n) if n and has_window else (None, 0)
    if family in ("qwen2", "qwen3", "qwen3_moe"):
        if not _bool(cfg, path, "use_sliding_window", False) or not has_window:
            return None, 0
        max_window_layers = _int(cfg, path, "max_window_layers", _LAYER_COUNT, layers)
        return window(), max(0, layers - max_window_layers)
    if not has_window or family not in ("gemma2", "gemma3_text", "mistral"):
        return None, 0
    if family == "gemma2":
        return window(), layers // 2  # even layers slide
    if family == "gemma3_text":  # layer i is global when (i + 1) % pattern == 0
        pattern = _int(cfg, path, "sliding_window_pattern", _STEP, _DEFAULT_SLIDING_PATTERN)
        return window(), layers - layers // pattern
    return window(), layers  # mistral: every layer uses the window


def _qwen3_moe_dense_layers(cfg: Mapping[str, Any], path: str, layers: int) -> int:
    """Leading dense layers of a qwen3_moe model. In transformers layer i is MoE when i is not in
    mlp_only_layers and (i + 1) % decoder_sparse_step == 0; only a dense prefix 0..k-1 is supported."""
    step = _int(cfg, path, "decoder_sparse_step", _STEP, 1)
    where = _at(path, "mlp_only_layers")
    raw = cfg.get("mlp_only_layers")
    raw = [] if raw is None else raw
    if not isinstance(raw, (list, tuple)):
        raise InputError(where, f"must be a list of layer indices, got {_show(raw)}")
    if len(raw) > layers:
        raise InputError(where, f"must list at most num_hidden_layers ({layers:,}) layers, got {len(raw):,}")
    dense = {_as_int(x, _at(where, i), (0, layers - 1)) for i, x in enumerate(raw)}
    if dense != set(range(len(dense))):
        raise InputError(where, "only leading dense layers (0, 1, ..., k-1) are supported for qwen3_moe")
    if len(dense) == layers:
        raise InputError(where, f"lists all {layers:,} layers; at least one MoE layer must remain")
    moe_layers = layers // step - sum(1 for d in dense if (d + 1) % step == 0)
    if moe_layers != layers - len(dense):
        raise InputError(_at(path, "decoder_sparse_step"), f"a step of {step} interleaves dense and MoE "
                         "layers; only leading dense layers (mlp_only_layers) are supported")
    return len(dense)


def model_from_hf_config(
    source: str | os.PathLike[str] | Mapping[str, Any], model_id: str | None = None, name: str | None = None,
    *, field: str = "config",
) -> ModelSpec:
    """A ModelSpec from a config.json object or file. Any invalid input raises one ``InputError`` whose
    field is ``field`` plus the offending key path (unsupported families name the supported ones)."""
    outer = _read(source, field)
    family = outer.get("model_type")
    if family is not None and not isinstance(family, str):
        raise InputError(_at(field, "model_type"), f"must be a string such as 'llama', got {_show(family)}")
    cfg, path = outer, field
    if family == "gemma3":  # multimodal wrapper: the decoder lives in text_config
        path, family = _at(field, "text_config"), "gemma3_text"
        if outer.get("text_config") is None:
            raise InputError(path, "required for model_type 'gemma3' (it holds the decoder)")
        cfg = _object(outer["text_config"], path)
    if family not in SUPPORTED_FAMILIES:
        shown = repr(family[:40]) if family else "(missing)"
        supported = ", ".join(SUPPORTED_FAMILIES)
        raise InputError(field, f"model_type {shown} is not supported; supported: {supported}")
    spec, origin = _spec_fields(cfg, path, family)
    repo = _str(outer, field, "_name_or_path", _MAX_NAME_CHARS) or None
    label = name or repo or family
    torch_dtype = _str(outer, field, "torch_dtype", _MAX_DTYPE_CHARS)
    torch_dtype = torch_dtype or _str(outer, field, "dtype", _MAX_DTYPE_CHARS)  # newer transformers' name
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(torch_dtype or "", "bf16")
    block_size = None
    if outer.get("quantization_config") is not None:
        qpath = _at(field, "quantization_config")
        quant = _object(outer["quantization_config"], qpath)
        dtype = _str(quant, qpath, "quant_method", _MAX_DTYPE_CHARS) or dtype
        if dtype == "fp8":  # fp8 block scales (DeepSeek-V3's); other methods' groups are not read here
            block_size = _block_size(quant.get("weight_block_size"), _at(qpath, "weight_block_size"))
    try:
        return ModelSpec(
            id=_slug(str(model_id or label)), name=label, hf_repo=repo, checkpoint_dtype=dtype,
            weight_block_size=block_size,
            sources=("user-supplied Hugging Face config.json",), **spec,
        )
    except ValidationError as e:
        raise _config_error(e, spec, origin, field) from None


def _spec_fields(cfg: Mapping[str, Any], path: str, family: str) -> tuple[dict[str, Any], dict[str, str]]:
    """ModelSpec keyword arguments from a decoder config, and for each spec field (dotted: moe.num_experts)
    the config key that fed it."""
    origin: dict[str, str] = {}

    def num(spec_field: str, key: str, default: Any = _REQUIRED, schema: type[BaseModel] = ModelSpec) -> int:
        origin[spec_field] = key
        return _int(cfg, path, key, _schema_bounds(schema, spec_field.rsplit(".", 1)[-1]), default)

    layers = num("num_layers", "num_hidden_layers")
    hidden = num("hidden_size", "hidden_size")
    heads = num("num_attention_heads", "num_attention_heads")
    kv_heads = num("num_kv_heads", "num_key_value_heads", heads)
    if cfg.get("head_dim") is None and hidden // heads < 1:
        raise InputError(_at(path, "head_dim"), "required here: hidden_size // num_attention_heads = "
                                                f"{hidden:,} // {heads:,} = 0 is not a head size")
    head_dim = num("head_dim", "head_dim", hidden // heads)
    vocab = num("vocab_size", "vocab_size", _DEFAULT_VOCAB.get(family, _REQUIRED))
    max_pos = num("max_position_embeddings", "max_position_embeddings", _DEFAULT_MAX_POS.get(family, 4096))
    tie = _bool(cfg, path, "tie_word_embeddings", family in ("gemma2", "gemma3_text"))
    window, n_sliding = _sliding(cfg, path, family, layers)
    origin["sliding_window"] = "sliding_window"
    intermediate = num("intermediate_size", "intermediate_size")
    spec: dict[str, Any] = dict(
        family=family, num_layers=layers, hidden_size=hidden, vocab_size=vocab, tie_word_embeddings=tie,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate,
        max_position_embeddings=max_pos, sliding_window=window, num_sliding_layers=n_sliding,
    )
    attention_bias = _bool(cfg, path, "attention_bias", False)
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

    def mla(key: str, default: Any = _REQUIRED) -> int:
        return num(f"mla.{key}", key, default, MLASpec)

    def moe(spec_field: str, key: str, default: Any = _REQUIRED) -> int:
        return num(f"moe.{spec_field}", key, default, MoESpec)

    if family in ("deepseek_v3", "kimi_k2"):
        spec["mtp_layers"] = num("mtp_layers", "num_nextn_predict_layers", 0)
        spec["mla"] = {  # the config keys are the MLASpec field names
            "q_lora_rank": mla("q_lora_rank", 0), "kv_lora_rank": mla("kv_lora_rank"),
            "qk_nope_head_dim": mla("qk_nope_head_dim"), "qk_rope_head_dim": mla("qk_rope_head_dim"),
            "v_head_dim": mla("v_head_dim"),
        }
        spec["moe"] = dict(
            num_experts=moe("num_experts", "n_routed_experts"),
            experts_per_token=moe("experts_per_token", "num_experts_per_tok"),
            expert_intermediate_size=moe("expert_intermediate_size", "moe_intermediate_size"),
            num_shared_experts=moe("num_shared_experts", "n_shared_experts", 0),
            num_dense_layers=moe("num_dense_layers", "first_k_dense_replace", 0),
            router_bias=cfg.get("topk_method") == "noaux_tc",
        )
    elif family == "mixtral":
        spec["moe"] = dict(
            num_experts=moe("num_experts", "num_local_experts"),
            experts_per_token=moe("experts_per_token", "num_experts_per_tok"),
            expert_intermediate_size=intermediate,
        )
        origin["moe.expert_intermediate_size"] = "intermediate_size"
    elif family == "qwen3_moe":
        spec["moe"] = dict(
            num_experts=moe("num_experts", "num_experts"),
            experts_per_token=moe("experts_per_token", "num_experts_per_tok"),
            expert_intermediate_size=moe("expert_intermediate_size", "moe_intermediate_size"),
            num_dense_layers=_qwen3_moe_dense_layers(cfg, path, layers),
        )
        origin["moe.num_dense_layers"] = "mlp_only_layers"
    elif family == "gpt_oss":
        k_key = "experts_per_token" if cfg.get("experts_per_token") is not None else "num_experts_per_tok"
        spec["moe"] = dict(
            num_experts=moe("num_experts", "num_local_experts"),
            experts_per_token=moe("experts_per_token", k_key),
            expert_intermediate_size=intermediate, router_bias=True, expert_bias=True,
        )
        origin["moe.expert_intermediate_size"] = "intermediate_size"
    return spec, {k: _at(path, v) for k, v in origin.items()}


_SPEC_NAME = re.compile(r"\b(?:(?:moe|mla)\.)?[a-z_]+\b")


def _config_error(e: ValidationError, spec: dict[str, Any], origin: dict[str, str], field: str) -> InputError:
    """The first error of ModelSpec's own validation, told in the config's words: the field is the key
    that fed the failing spec field, and spec names in the message become config keys. A cross-field
    check (no field location) blames the first spec field its message names."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    scope = f"{loc}." if loc in ("moe", "mla") else ""  # a nested record's own model validator
    named: list[str] = []

    def rename(m: re.Match[str]) -> str:
        spec_field = m.group(0) if m.group(0) in origin else scope + m.group(0)
        if spec_field not in origin:
            return m.group(0)
        named.append(spec_field)
        return _key(origin[spec_field])

    text = _SPEC_NAME.sub(rename, msg)
    if loc in origin:  # one field out of the schema's range
        return InputError(origin[loc], f"{text}, got {_show(err.get('input'))}")
    if not named:
        return InputError(field, text)
    blamed, key = named[0], _key(origin[named[0]])
    values = ", ".join(f"{_key(origin[n])} = {_show(_spec_value(spec, n))}" for n in dict.fromkeys(named))
    return InputError(origin[blamed], f"{text.removeprefix(key + ' ')}; got {values}")


def _key(path: str) -> str:
    """The last key of a dotted path: config.text_config.hidden_size -> hidden_size."""
    return path.rsplit(".", 1)[-1]


def _spec_value(spec: dict[str, Any], dotted: str) -> Any:
    head, _, tail = dotted.partition(".")
    value = spec.get(head)
    return value.get(tail) if tail and isinstance(value, dict) else value
