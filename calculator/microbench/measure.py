"""Run the benchmark models with transformers: prefill and decode latencies, and the KV bytes their caches hold.

Prefill: ``batch`` random prompts of ``tokens`` tokens through ``model(...)`` with a fresh
DynamicCache and logits for the last position only (as a serving engine samples). Decode: one
prompt of ``context`` tokens is prefilled into a StaticCache, which is replicated to the batch
(``reorder_cache``, as beam search does) and then updated in place, as a serving engine's paged
cache is (DynamicCache appends with torch.cat, copying the whole cache every step); consecutive
one-token steps are timed, so a point's context is that of its middle timed step.

On CUDA a decode step is captured once per point as a CUDA graph and replayed, as serving engines run
decode (vLLM, SGLang and TensorRT-LLM all capture it), so the timing is the GPU's and not transformers'
eager Python dispatch. The step is capturable: the cache's write position and the step's position ids are
device tensors (``StaticLayer.cumulative_length``), and nothing in the forward reads a tensor back to the
host. Should a capture fail anyway, the run times eager steps from then on and the report says why.
"""

from __future__ import annotations

import copy
import gc
import inspect
from typing import Any

from hardware_db.schema import ModelSpec

from ..kv_cache import kv_cache_bytes, kv_elements_per_token_layer
from ..params import param_count
from ..precision import kv_bytes
from .ceilings import TORCH_DTYPES
from .models import Grid, hf_config
from .results import KVCheck, Measurement, ParamCheck
from .timing import Guard


GROUPED_SDPA = "pdplan_grouped_sdpa"
"""The benchmark's attention: transformers' SDPA, except that a one-token step of a GQA model attends with the query
heads of each group packed against their one key/value head, as engines' decode kernels read the cache (each KV
head once). transformers before 5.23 repeats every KV head over its query heads there (``repeat_kv``) whenever a
mask is passed, which a static cache always passes: on an H200, Llama-3.1-8B at 8 x 4,105 cached tokens then
stepped in 29 ms, against 19 ms for Llama-2-13B (MHA) with six times the cache."""


def grouped_sdpa_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                         scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """``GROUPED_SDPA``: (batch, heads, 1, dim) queries as (batch, kv heads, group, dim) against the unrepeated cache;
    any other step is transformers' own ``sdpa_attention_forward``. Returns (batch, tokens, heads, dim), as it does."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    group = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or group == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    packed = query.reshape(batch, heads // group, group, dim)
    mask = attention_mask
    if mask is not None and mask.shape[1] != 1:  # a per-head mask: its heads packed the same way
        mask = mask.reshape(mask.shape[0], heads // group, group, mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling, is_causal=False)
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def register_attention() -> str:
    """Register ``GROUPED_SDPA`` with transformers (idempotent) and return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # SDPA's masks (without it: no mask at all)
    return GROUPED_SDPA


def build_model(m: ModelSpec, dtype: str, device: str, seed: int) -> Any:
    """A random-weight transformers model with the ModelSpec's shapes (nothing is downloaded), attending with
    ``GROUPED_SDPA``."""
    import torch
    import transformers

    cfg = hf_config(m, attn_implementation=register_attention())
    cls = transformers.LlamaForCausalLM if m.family == "llama" else transformers.Qwen2ForCausalLM
    torch.manual_seed(seed)
    tdt = getattr(torch, TORCH_DTYPES[dtype])
    with torch.device(device):  # initialise the random weights where they will run
        try:
            model = cls._from_config(cfg, dtype=tdt)
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            model = cls._from_config(cfg, torch_dtype=tdt)
    return model.to(device).eval()


def _forward_kwargs(model: Any) -> tuple[str, str | None]:
    """Names of the cache argument and of the keep-last-logits argument in this transformers version."""
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
    return cache_kw, keep_kw


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def held_kv_bytes(cache: Any) -> int:
    """Bytes of the key and value tensors a transformers cache object holds (all layers, whole batch)."""
    if hasattr(cache, "layers"):  # transformers >= 4.56: one CacheLayer per decoder layer
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    else:  # older DynamicCache: parallel lists
        tensors = [*cache.key_cache, *cache.value_cache]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _static_cache(model: Any, max_cache_len: int, batch: int, device: str, dtype: Any) -> Any:
    from transformers import StaticCache

    try:
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    except TypeError:  # transformers < 4.56
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=max_cache_len,
                           device=device, dtype=dtype)


def _kv_check(m: ModelSpec, dtype: str, cache: Any, cache_name: str, batch: int, tokens: int) -> KVCheck:
    predicted = round(float(kv_cache_bytes(m, tokens, dtype))) * batch
    offset, note = 0, ""
    window = m.sliding_window
    if cache_name == "DynamicCache" and m.num_sliding_layers and window is not None and tokens >= window:
        # transformers' DynamicSlidingWindowLayer keeps the last W-1 tokens: the next step's query brings the W-th.
        per_token_layer = int(kv_elements_per_token_layer(m) * kv_bytes(dtype))
        offset = -batch * m.num_sliding_layers * per_token_layer
        note = (f"DynamicCache keeps W-1 = {window - 1} tokens in each of the {m.num_sliding_layers} sliding layers "
                f"between steps; pdplan counts W = {window} (the window including the token a step writes, as "
                "StaticCache and paged engines hold it)")
    elif cache_name == "StaticCache":
        note = "StaticCache sized to the prompt: full layers hold all its tokens, sliding layers min(tokens, W)"
    return KVCheck(model=m.id, cache=cache_name, batch=batch, tokens=tokens, measured_bytes=held_kv_bytes(cache),
                   predicted_bytes=predicted, convention_offset_bytes=offset, note=note)


class ModelBench:
    """One benchmark model loaded on the device, swept over its grid (possibly several times)."""

    GRAPH_WARMUP = 2
    """Eager steps on a side stream before a capture (allocator and lazy state settle, as torch's docs ask)."""

    def __init__(self, m: ModelSpec, grid: Grid, device: str, dtype: str, seed: int, cuda_graphs: bool = False) -> None:
        import torch

        self.m, self.grid, self.device, self.dtype = m, grid, device, dtype
        self.cuda_graphs = cuda_graphs and device == "cuda"
        self.graph_failure: str | None = None  # why a capture failed (then every later step runs eager)
        self.model = build_model(m, dtype, device, seed)
        self.param_check = ParamCheck(model=m.id, hf_params=sum(p.numel() for p in self.model.parameters()),
                                      predicted_params=param_count(m))
        self.cache_kw, keep_kw = _forward_kwargs(self.model)
        self.keep = {keep_kw: 1} if keep_kw else {}
        self.gen = torch.Generator(device="cpu").manual_seed(seed + 1)
        self.tdtype = getattr(torch, TORCH_DTYPES[dtype])
        self.kv_checks: list[KVCheck] = []
        self.samples: dict[tuple[str, int, int, int], list[tuple[float, ...]]] = {}  # (phase, tokens, i, j)
        self.steps_warmup, self.steps = grid.warmup + 1, 2 * grid.repeats - 1
        self._bases: dict[int, Any] = {}  # decode context -> prefilled one-sequence StaticCache
        with torch.inference_mode():
            self._forward(self.prompt(1, 16))  # first call: lazy initialisation
            if self.cuda_graphs:
                self._trial_capture()

    def _trial_capture(self) -> None:
        """Capture one decode step before any point is timed, past a sliding window where the model has one (a full
        window takes another path through transformers' cache); a failure turns graphs off for this model."""
        import torch

        context = (self.m.sliding_window or 0) + 16 if self.m.num_sliding_layers else 16
        cache = _static_cache(self.model, context + self.GRAPH_WARMUP + 1, 1, self.device, self.tdtype)
        self._forward(self.prompt(1, context), cache)
        try:
            self._captured(self.prompt(1, 1), cache)
        except Exception as e:  # noqa: BLE001 - any capture failure: this model's decode runs eager
            self.graph_failure = f"{type(e).__name__}: {e}"[:300]
            self.cuda_graphs = False
        finally:
            del cache
            torch.cuda.synchronize()

    def prompt(self, batch: int, tokens: int) -> Any:
        import torch

        return torch.randint(0, self.m.vocab_size, (batch, tokens), generator=self.gen).to(self.device)

    def _forward(self, ids: Any, cache: Any = None, last_only: bool = True) -> Any:
        kwargs = dict(self.keep) if last_only else {}
        if cache is not None:
            kwargs[self.cache_kw] = cache
        return self.model(input_ids=ids, use_cache=True, **kwargs)

    def sweep(self, guard: Guard, check_kv: bool) -> None:
        """Time every prefill and decode point once more; with ``check_kv`` also check the caches' KV bytes."""
        import torch

        grid, m = self.grid, self.m
        with torch.inference_mode():
            for tokens, batch, i, j in grid.prefill_points():
                ids = self.prompt(batch, tokens)
                last: list[Any] = []

                def prefill(ids: Any = ids, last: list[Any] = last) -> None:
                    last[:] = [self._forward(ids)]

                samples = guard.measure(lambda prefill=prefill: prefill, grid.warmup, grid.repeats, self.device)
                self.samples.setdefault(("prefill", tokens, i, j), []).append(samples)
                if check_kv:
                    self.kv_checks.append(_kv_check(m, self.dtype, _cache_of(last[0]), "DynamicCache", batch, tokens))
                del last[:]
            if check_kv and m.num_sliding_layers:
                for tokens, batch, *_ in _static_points(m, grid):
                    cache = _static_cache(self.model, tokens, batch, self.device, self.tdtype)
                    self._forward(self.prompt(batch, tokens), cache)
                    self.kv_checks.append(_kv_check(m, self.dtype, cache, "StaticCache", batch, tokens))
                    del cache
            for context, batch, i, j in grid.decode_points():
                samples = guard.measure(lambda context=context, batch=batch: self._decode_step(context, batch),
                                        self.steps_warmup, self.steps, self.device)
                # the median sample is taken as the middle step's, which holds this many cached tokens
                middle = context + self.lead_steps + self.steps_warmup + (self.steps - 1) // 2
                self.samples.setdefault(("decode", middle, i, j), []).append(samples)

    @property
    def lead_steps(self) -> int:
        """Steps a point's cache takes before its warm-up: the capture's side-stream steps (CUDA graphs)."""
        return self.GRAPH_WARMUP if self.cuda_graphs else 0

    def _decode_step(self, context: int, batch: int) -> Any:
        """A fresh cache of ``batch`` copies of one prefilled ``context``-token prompt, and one decode step on it
        (a CUDA graph's replay where graphs are on)."""
        import torch

        if context not in self._bases:
            length = context + self.GRAPH_WARMUP + self.steps_warmup + self.steps  # room for every step
            base = _static_cache(self.model, length, 1, self.device, self.tdtype)
            self._forward(self.prompt(1, context), base)
            self._bases[context] = base
        cache = copy.deepcopy(self._bases[context])
        if batch > 1:
            cache.reorder_cache(torch.zeros(batch, dtype=torch.long, device=self.device))
        token = self.prompt(batch, 1)
        if self.cuda_graphs:
            try:
                return self._captured(token, cache)
            except Exception as e:  # noqa: BLE001 - any capture failure: time eager steps, and say why
                self.graph_failure = f"{type(e).__name__}: {e}"[:300]
                self.cuda_graphs = False
                torch.cuda.synchronize()
                cache = copy.deepcopy(self._bases[context])  # the failed capture's steps may have written to it
                if batch > 1:
                    cache.reorder_cache(torch.zeros(batch, dtype=torch.long, device=self.device))
        return lambda: self._forward(token, cache, last_only=False)

    def _captured(self, token: Any, cache: Any) -> Any:
        """``graph.replay`` of one decode step on ``cache``, captured after ``GRAPH_WARMUP`` eager steps on a side
        stream; each replay writes the next cache slot (the write position is a device tensor the step advances)."""
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.GRAPH_WARMUP):
                self._forward(token, cache, last_only=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._forward(token, cache, last_only=False)
        return graph.replay

    def measurements(self) -> list[Measurement]:
        grid = self.grid
        batches = {"prefill": grid.prefill_batches, "decode": grid.decode_batches}
        return [Measurement(model=self.m.id, phase=phase, batch=batches[phase][j], tokens=tokens,  # type: ignore[arg-type]
                            grid_index=(i, j), sweeps_s=tuple(sweeps))
                for (phase, tokens, i, j), sweeps in self.samples.items()]

    def close(self) -> None:
        import torch

        self.model = None
        self._bases.clear()
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()


def _static_points(m: ModelSpec, grid: Grid) -> list[tuple[int, int, int, int]]:
    """StaticCache checks of a sliding model: the longest prompt (past the window) and one inside it."""
    pts = grid.prefill_points()
    window = m.sliding_window or 0
    longest = max(pts, key=lambda p: (p[0], p[1]))
    inside = [p for p in pts if p[0] < window]
    return [longest] + ([max(inside, key=lambda p: (p[1], p[0]))] if inside else [])
