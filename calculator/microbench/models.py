"""The benchmark's models and grids: ModelSpecs as data, and their transformers configs.

The models are Llama-architecture decoders (GQA, SwiGLU, RoPE, RMSNorm, untied head) plus one
Qwen2 decoder whose upper layers attend within a sliding window (Qwen2 is Llama with q/k/v biases
and per-layer ``layer_types``). Sizes are picked so a 2-core CPU runs them in seconds while the
weights (90-800 MB) are far larger than the caches, so decode is a real memory-bound read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from hardware_db.schema import ModelSpec

_SOURCE = ("calculator.microbench: random-weight benchmark model",)


def _llama(model_id: str, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
           **extra: Any) -> ModelSpec:
    return ModelSpec(
        id=model_id, name=model_id, family=extra.pop("family", "llama"), num_layers=layers, hidden_size=hidden,
        vocab_size=32000, num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
        intermediate_size=intermediate, max_position_embeddings=4096, checkpoint_dtype="bf16", sources=_SOURCE,
        **extra,
    )


BENCH_MODELS: dict[str, ModelSpec] = {m.id: m for m in (
    _llama("bench-llama-s", layers=12, hidden=512, heads=8, kv_heads=2, intermediate=1408),  # deep and narrow
    _llama("bench-llama-m", layers=8, hidden=1024, heads=16, kv_heads=4, intermediate=2816),
    _llama("bench-llama-l", layers=12, hidden=1536, heads=24, kv_heads=4, intermediate=4096),
    _llama("bench-qwen2-swa", layers=6, hidden=768, heads=12, kv_heads=4, intermediate=2048,
           family="qwen2", qkv_bias=True, sliding_window=128, num_sliding_layers=4),
    # CUDA: large enough that one step is not a string of kernel launches
    _llama("bench-llama-1b", layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=5632),
    _llama("bench-llama-3b", layers=24, hidden=3072, heads=24, kv_heads=8, intermediate=8192),
    _llama("bench-qwen2-swa-1b", layers=16, hidden=2048, heads=16, kv_heads=4, intermediate=5632,
           family="qwen2", qkv_bias=True, sliding_window=1024, num_sliding_layers=12),
)}


@dataclass(frozen=True)
class Grid:
    """What one run measures: which models, and the prefill and decode grids of each."""

    models: tuple[str, ...]
    prefill_tokens: tuple[int, ...]
    prefill_batches: tuple[int, ...]
    max_prefill_tokens: int  # batch x prompt of one forward
    decode_contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    max_decode_tokens: int  # batch x context held in the cache
    warmup: int
    repeats: int  # timed repeats per point and sweep (odd: the median is a sample)
    sweeps: int  # passes over the whole grid; a point takes its least disturbed sweep
    matmul_sizes: tuple[int, ...]
    copy_bytes: int

    def prefill_points(self) -> list[tuple[int, int, int, int]]:
        """(tokens, batch, tokens index, batch index) of the prefill grid."""
        return [(s, b, i, j) for i, s in enumerate(self.prefill_tokens) for j, b in enumerate(self.prefill_batches)
                if s * b <= self.max_prefill_tokens]

    def decode_points(self) -> list[tuple[int, int, int, int]]:
        return [(c, b, i, j) for i, c in enumerate(self.decode_contexts) for j, b in enumerate(self.decode_batches)
                if c * b <= self.max_decode_tokens]


GRIDS: dict[tuple[Literal["cpu", "cuda"], bool], Grid] = {
    ("cpu", True): Grid(
        models=("bench-llama-s", "bench-llama-m", "bench-qwen2-swa"),
        prefill_tokens=(16, 64, 256), prefill_batches=(1, 2), max_prefill_tokens=256,
        decode_contexts=(128, 512), decode_batches=(1, 2, 8), max_decode_tokens=8192,
        warmup=1, repeats=3, sweeps=2, matmul_sizes=(512, 1024, 2048), copy_bytes=256 * 2**20,
    ),
    ("cpu", False): Grid(
        models=("bench-llama-s", "bench-llama-m", "bench-llama-l", "bench-qwen2-swa"),
        prefill_tokens=(16, 32, 64, 128, 256, 512), prefill_batches=(1, 2, 4), max_prefill_tokens=512,
        decode_contexts=(128, 512, 2048), decode_batches=(1, 2, 4, 8, 16, 32), max_decode_tokens=16384,
        warmup=1, repeats=3, sweeps=2, matmul_sizes=(256, 512, 1024, 2048, 4096), copy_bytes=512 * 2**20,
    ),
    ("cuda", True): Grid(
        models=("bench-llama-1b", "bench-qwen2-swa-1b"),
        prefill_tokens=(128, 512, 2048), prefill_batches=(1, 4), max_prefill_tokens=8192,
        decode_contexts=(512, 2048), decode_batches=(1, 16, 64), max_decode_tokens=32768,
        warmup=2, repeats=5, sweeps=2, matmul_sizes=(2048, 4096, 8192), copy_bytes=2 * 2**30,
    ),
    ("cuda", False): Grid(
        models=("bench-llama-1b", "bench-llama-3b", "bench-qwen2-swa-1b"),
        prefill_tokens=(128, 256, 512, 1024, 2048, 4096), prefill_batches=(1, 2, 4, 8), max_prefill_tokens=16384,
        decode_contexts=(512, 1024, 2048, 3072), decode_batches=(1, 4, 16, 32, 64, 128), max_decode_tokens=65536,
        warmup=3, repeats=7, sweeps=3, matmul_sizes=(1024, 2048, 4096, 8192), copy_bytes=4 * 2**30,
    ),
}


CATALOG_GRID = Grid(
    models=(),  # the catalog models a run names
    prefill_tokens=(128, 512, 2048, 8192), prefill_batches=(1, 4), max_prefill_tokens=8192,
    decode_contexts=(256, 1024, 4096), decode_batches=(1, 8, 32, 128), max_decode_tokens=32768,
    warmup=2, repeats=5, sweeps=2, matmul_sizes=(2048, 4096, 8192), copy_bytes=4 * 2**30,
)
"""The CUDA grid for catalog models (7-13B on one GPU): fewer, larger points than the bench models' grid,
since an 8k-token forward of a 13B model takes ~0.3 s; at most 32,768 cached tokens (27 GB of Llama-2-13B's
KV) beside the weights of every model the run holds at once."""


def resolve_models(names: tuple[str, ...] | list[str]) -> list[ModelSpec]:
    """The ModelSpecs named: bench models by id, else catalog models (``hardware_db``) that the benchmark can
    build (llama and qwen2 decoders); ``InputError`` naming ``models`` otherwise."""
    from hardware_db.loader import load_model

    from ..errors import InputError

    if not names:
        raise InputError("models", "name at least one model")
    specs: list[ModelSpec] = []
    for name in names:
        m = BENCH_MODELS.get(name)
        if m is None:
            try:
                m = load_model(name)
            except InputError as e:  # unknown or ambiguous id: the message names the closest ids
                raise InputError("models", f"{name!r}: {e}") from None
        try:
            check_buildable(m)
        except ValueError as e:
            raise InputError("models", str(e)) from None
        if m.id in {s.id for s in specs}:
            raise InputError("models", f"{m.id} is named twice")
        specs.append(m)
    return specs


def grid_for(device: Literal["cpu", "cuda"], quick: bool, models: list[ModelSpec] | None = None) -> Grid:
    """The grid of a run: the device's own (``GRIDS``) for its bench models; on CUDA ``CATALOG_GRID`` once a
    catalog model is named (a CPU keeps its grid: a catalog model there is the user's choice of a long run)."""
    grid = GRIDS[(device, quick)]
    if models is None:
        return grid
    if device == "cuda" and any(m.id not in BENCH_MODELS for m in models):
        grid = CATALOG_GRID
    return replace(grid, models=tuple(m.id for m in models))


def split_of(model_index: int, tokens_index: int, batch_index: int) -> Literal["fit", "held_out"]:
    """Checkerboard over each model's grid (shifted per model): neighbours of a held-out point are fitted."""
    return "fit" if (model_index + tokens_index + batch_index) % 2 == 0 else "held_out"


def layer_types(m: ModelSpec) -> list[str]:
    """Per-layer attention kind: the top ``num_sliding_layers`` layers slide (Qwen2's max_window_layers rule)."""
    full = m.num_layers - m.num_sliding_layers
    return ["full_attention" if i < full else "sliding_attention" for i in range(m.num_layers)]


def check_buildable(m: ModelSpec) -> None:
    """``ValueError`` unless the benchmark can build ``m`` with transformers' llama or qwen2 classes."""
    unsupported = [name for name, bad in (
        ("moe", m.moe is not None), ("mla", m.mla is not None), ("qk_norm", m.qk_norm), ("sinks", m.attention_sinks),
        ("plain MLP", not m.gated_mlp), ("mlp_bias", m.mlp_bias), ("layernorm", m.norm != "rmsnorm"),
        ("learned positions", m.learned_position_embeddings > 0),
    ) if bad]
    if unsupported:
        raise ValueError(f"{m.id}: the benchmark builds llama/qwen2 decoders only, not {', '.join(unsupported)}")
    if m.family == "llama":
        if m.num_sliding_layers:
            raise ValueError(f"{m.id}: a llama config has no sliding-window layers; use family qwen2")
        if m.qkv_bias != m.o_bias:
            raise ValueError(f"{m.id}: llama's attention_bias sets q/k/v and o biases together")
    elif m.family == "qwen2":
        if not m.qkv_bias or m.o_bias:
            raise ValueError(f"{m.id}: qwen2 has q/k/v biases and no o bias")
        if m.head_dim * m.num_attention_heads != m.hidden_size:
            raise ValueError(f"{m.id}: qwen2 derives head_dim = hidden / heads")
    else:
        raise ValueError(f"{m.id}: family {m.family!r} is not one the benchmark builds (llama, qwen2)")


def hf_config(m: ModelSpec, attn_implementation: str = "sdpa") -> Any:
    """A transformers config with exactly the ModelSpec's shapes (``llama`` or ``qwen2`` families)."""
    import transformers

    check_buildable(m)
    common: dict[str, Any] = {
        "vocab_size": m.vocab_size, "hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
        "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_kv_heads, "max_position_embeddings": m.max_position_embeddings,
        "tie_word_embeddings": m.tie_word_embeddings, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "attn_implementation": attn_implementation,
    }
    if m.family == "llama":
        return transformers.LlamaConfig(head_dim=m.head_dim, attention_bias=m.qkv_bias, mlp_bias=False, **common)
    window = m.sliding_window if m.num_sliding_layers else None
    return transformers.Qwen2Config(
        use_sliding_window=window is not None, sliding_window=window,
        max_window_layers=m.num_layers - m.num_sliding_layers, layer_types=layer_types(m), **common,
    )
