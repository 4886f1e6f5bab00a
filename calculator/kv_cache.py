"""KV-cache size: per token, per sequence, per GPU and for a whole deployment."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from hardware_db.schema import ModelSpec

from . import formulas as f
from .arguments import integer, model_spec
from .errors import InputError
from .limits import MAX_PARALLEL, MAX_TOKENS
from .params import shape_values
from .precision import kv_bytes


def kv_elements_per_token_layer(m: ModelSpec, tp: int = 1) -> float:
    """Cached elements per token per layer on one GPU (K+V heads, or the MLA latent + rope key)."""
    if m.mla is not None:
        return float(f.kv_elements_mla(shape_values(m)))
    return float(f.kv_elements_gqa(shape_values(m), tp=tp))


def kv_bytes_per_gpu(m: ModelSpec, tokens: ArrayLike, kv_dtype: str = "bf16", tp: int = 1, pp: int = 1) -> np.ndarray:
    """KV bytes one sequence of ``tokens`` tokens holds on one GPU of a tp x pp instance."""
    values = shape_values(m)
    per_gpu_all_layers = f.kv_bytes_context(
        values, b_kv=kv_bytes(kv_dtype), e_kv=kv_elements_per_token_layer(m, tp), c=np.asarray(tokens, dtype=float)
    )
    return per_gpu_all_layers / pp


def kv_cache_bytes(m: ModelSpec | str, tokens: ArrayLike, kv_dtype: str = "bf16", tp: int = 1) -> float | np.ndarray:
    """KV bytes of one sequence of ``tokens`` tokens: all layers, all GPUs of the instance together.

    ``m`` is a model id or spec; ``tokens`` a number or an array of numbers in 0 ... MAX_TOKENS.
    With tp > num_kv_heads the KV heads are replicated, and MLA latents are replicated on every
    tensor-parallel GPU, so the total grows with tp in those cases.
    """
    m = model_spec(m)
    tokens_arr = _tokens(tokens)
    tp = integer("tp", tp, 1, MAX_PARALLEL)
    kv_bytes(kv_dtype)  # an unknown kv_dtype is an InputError naming it
    total = tp * kv_bytes_per_gpu(m, tokens_arr, kv_dtype, tp=tp)
    return float(total) if np.ndim(total) == 0 else total


def kv_bytes_per_token(m: ModelSpec | str, kv_dtype: str = "bf16") -> float:
    """Bytes per token over all layers at tp=1, before any sliding-window cap (the headline figure)."""
    return float(kv_bytes_per_gpu(model_spec(m), 1.0, kv_dtype))


def _tokens(tokens: ArrayLike) -> np.ndarray:
    """Token counts as floats: numbers (not bools) in 0 ... MAX_TOKENS, NaN and infinities refused."""
    if type(tokens) in (int, float) and 0 <= tokens <= MAX_TOKENS:  # the common scalar, without numpy checks
        return np.asarray(tokens, dtype=float)
    try:
        raw = np.asarray(tokens)
    except (TypeError, ValueError):  # ragged nesting
        raw = np.asarray(None)
    if raw.dtype.kind not in "iuf":
        raise InputError("tokens", f"must be a number of tokens or an array of them, got {tokens!r:.40}")
    arr = raw.astype(float, copy=False)
    if not np.all(np.isfinite(arr)):
        raise InputError("tokens", "must be finite (no NaN or infinity)")
    if np.any(arr < 0) or np.any(arr > MAX_TOKENS):
        raise InputError("tokens", f"must be in 0 ... {MAX_TOKENS:,}")
    return arr
