"""Shared pieces of the serving model: deployment specs, a pool's step-time functions, results.

Each mode module (mixed, chunked, disaggregated) turns a deployment, a workload and an array of
arrival rates into a ``ModeArrays`` of TTFT/TPOT statistics; ``evaluate`` and the optimizer only
read those arrays. All step times come from ``calculator.phases`` (the same roofline as
``estimate``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from hardware_db.loader import load_gpu
from hardware_db.schema import GPUSpec, KVDtype, ModelSpec, WeightDtype

from .. import formulas as f
from ..errors import InputError, UnstableError
from ..estimate import memory_breakdown
from ..kv_cache import kv_bytes_per_gpu
from ..limits import MAX_EXPERT_PARALLEL, MAX_PARALLEL
from ..phases import DEFAULT_EXPERT_IMBALANCE, Setup, step_groups, step_time_s
from ..speculation import Speculation, draft_setup, speculative_groups
from .mdc import delay_probability_ratio
from .workload import SLO, Count, Length, Workload, running_context

Mode = Literal["mixed", "chunked", "disaggregated"]
Scheduler = Literal["hybrid", "prefill_first"]
SCHEDULER_ENGINES = {
    "hybrid": ("running decodes and new prompts share each step (a whole prompt is one piece when chunking is "
               "off): vLLM V1 (0.8+), SGLang, TensorRT-LLM (inflight batching), llama.cpp's server, "
               "transformers' continuous batching"),
    "prefill_first": ("a step runs waiting prompts alone and stalls every decode: vLLM V0 (before 0.8, "
                      "chunked prefill off), early TGI"),
}
"""What each mixed-mode scheduler policy describes (the docs table reads it from here)."""
DEFAULT_BATCH_CAP = 512
FIXED_POINT_ITERATIONS = 60


class Pool(BaseModel):
    """Identical instances of one GPU type, each spanning tp x pp x dp GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gpu: str = Field(min_length=1, max_length=64)
    tp: Count = Field(default=1, ge=1, le=MAX_PARALLEL)
    pp: Count = Field(default=1, ge=1, le=MAX_PARALLEL)
    dp: Count = Field(default=1, ge=1, le=MAX_EXPERT_PARALLEL, description="attention data-parallel ranks of tp GPUs each "
                      "(mixture-of-experts models): each rank runs attention on its own sequences and KV, the routed "
                      "experts are spread over all dp x tp GPUs (ep = dp x tp)")
    ep: Count = Field(default=1, ge=1, le=MAX_EXPERT_PARALLEL, description="expert-parallel degree: with dp = 1 it divides "
                      "tp (experts split inside the tensor-parallel group); with dp > 1 it is dp x tp")
    cp: Count = Field(default=1, ge=1, le=MAX_PARALLEL, description="context-parallel ranks of tp GPUs: a prompt's "
                      "tokens are split over them (ring attention) and every sequence's KV is sharded over them")
    expert_imbalance: float = Field(default=DEFAULT_EXPERT_IMBALANCE, ge=1.0, le=16.0, description="with ep > 1: "
                                    "routed tokens on the busiest GPU / the mean (1.2: with expert load balancing)")
    dp_balance: bool = Field(
        default=False, description="dp > 1, mixed and chunked modes: the ranks take their prompts in the same steps "
        "(TensorRT-LLM's attention_dp_config.enable_balance), so a rank's decodes are stalled by its own prompts "
        "alone (the wait for the other ranks is not counted in TTFT); false (vLLM, SGLang, TensorRT-LLM's default): "
        "each rank admits its own prompts and every step lasts as long as the slowest rank's, so a prompt on any "
        "rank stalls the decodes of all")
    instances: Count = Field(default=1, ge=1, le=10_000)
    max_batch: Count = Field(default=DEFAULT_BATCH_CAP, ge=1, le=16_384, description="engine cap on concurrent "
                             "sequences (per attention data-parallel rank: each runs a scheduler of its own)")
    weight_dtype: WeightDtype = "bf16"
    kv_dtype: KVDtype = "bf16"
    spec: Speculation | None = Field(default=None, description="speculative decoding on this pool's decodes "
                                     "(mtp, eagle or a draft model)")
    pipelined: bool = Field(
        default=True, description="pp > 1: one micro-batch in flight per stage, each with its own sequences and "
        "KV (vLLM's virtual engines, SGLang and TensorRT-LLM pipeline parallelism); false: one batch crosses the "
        "stages at a time and each stage idles while the others work")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp * self.instances

    @property
    def streams(self) -> int:
        """Independent batches in one instance: a batch per attention data-parallel rank, and per rank one
        micro-batch per stage when pipelined."""
        return self.dp * self.micro_batches

    @property
    def micro_batches(self) -> int:
        """Micro-batches in flight on the same GPUs: pp when pipelined, else 1."""
        return self.pp if self.pipelined else 1

    @property
    def coupled_ranks(self) -> int:
        """Attention data-parallel ranks whose prompts stall one another's steps in a pool that prefills and
        decodes (``dp_busy_steps``): dp, or 1 where they take their prompts together (``dp_balance``)."""
        return 1 if self.dp_balance else self.dp

    @property
    def engines(self) -> int:
        """Independent schedulers of the pool (``streams`` per instance): each runs steps of the whole
        model (the sum of the stages) on its own sequences, and the stages work on the others' steps
        meanwhile, so a pipelined instance of pp stages serves pp times the traffic of an unpipelined
        one at the same step time."""
        return self.instances * self.streams

    @model_validator(mode="after")
    def _expert_layout(self) -> Pool:
        if self.dp > 1 and self.ep != self.dp * self.tp:
            raise ValueError(f"ep: with attention data-parallelism the experts are spread over every GPU of the "
                             f"instance, ep = dp x tp = {self.dp * self.tp}, got {self.ep}")
        if self.dp == 1 and self.tp % self.ep:
            raise ValueError(f"ep: must divide tp (experts are split inside the tensor-parallel group), got ep={self.ep}, "
                             f"tp={self.tp}")
        return self


class Deployment(BaseModel):
    """How a model is served: one pool (mixed, chunked) or a prefill and a decode pool (disaggregated)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mode: Mode
    pool: Pool | None = Field(default=None, description="mixed / chunked: the one pool")
    prefill: Pool | None = Field(default=None, description="disaggregated: the prefill pool")
    decode: Pool | None = Field(default=None, description="disaggregated: the decode pool")
    chunk_tokens: Count = Field(default=2048, ge=64, le=65_536, description="chunked: token budget per iteration")
    scheduler: Scheduler = Field(
        default="hybrid", description="mixed: 'hybrid' (new prompts join the running decodes' step: vLLM V1, SGLang, "
        "TensorRT-LLM) or 'prefill_first' (prompts run in steps of their own: vLLM V0)")
    max_batched_tokens: Count = Field(
        default=8192, ge=64, le=1_048_576, description="mixed and disaggregated prefill: token budget of one step "
        "(prompts are batched up to it; a prompt longer than it runs alone)")
    kv_link: Literal["scaleout", "scaleup"] = Field(
        default="scaleout", description="disaggregated: NIC between nodes, or the scale-up link inside one node")
    layerwise_kv_overlap: bool = Field(default=False, description="disaggregated: send each layer's KV as it is computed")
    kv_transfer: Literal["overlapped", "blocking"] = Field(
        default="overlapped", description="disaggregated: 'overlapped' (the prefill instance goes on to the next "
        "prompt while the KV moves: RDMA connectors such as NIXL or Mooncake) or 'blocking' (it is held until the "
        "request's KV is saved: a synchronous connector, e.g. vLLM's ExampleConnector writing to disk; the move "
        "is then prefill work, and counts once in TTFT)")

    def to_launch(self, model: Any, engine: str, model_path: str | None = None, port: int = 8000,
                  max_model_len: int | None = None) -> Any:
        """This deployment of ``model`` as ``engine``'s commands (``calculator.launch.to_launch``)."""
        from ..launch import to_launch

        return to_launch(model, self, engine, model_path, port, max_model_len)

    @model_validator(mode="after")
    def _pools(self) -> Deployment:
        if self.mode == "disaggregated":
            if self.prefill is None or self.decode is None:
                raise ValueError(f"{'prefill' if self.prefill is None else 'decode'}: a disaggregated deployment "
                                 "needs a prefill and a decode pool")
            if self.pool is not None:
                raise ValueError("pool: a disaggregated deployment has a prefill and a decode pool instead")
        elif self.pool is None:
            raise ValueError(f"pool: a {self.mode} deployment needs its pool")
        elif self.prefill is not None or self.decode is not None:
            raise ValueError(f"{'prefill' if self.prefill is not None else 'decode'}: a {self.mode} deployment "
                             "has one pool (and no prefill/decode pools)")
        return self

    @model_validator(mode="after")
    def _spec_decodes(self) -> Deployment:
        if self.prefill is not None and self.prefill.spec is not None:
            raise ValueError("prefill: spec: a prefill pool does not decode; speculative decoding belongs to the "
                             "decode pool")
        return self

    @property
    def pools(self) -> tuple[Pool, ...]:
        return (self.pool,) if self.pool is not None else (self.prefill, self.decode)  # type: ignore[return-value]

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)


TABLE_POINTS = 128
"""Points of a tabulated step-time curve (geometric in the batch, ~5% apart up to a batch of 512)."""
TABLE_MIN_BATCH = 0.5
"""Below one sequence a step costs what one sequence costs, so the grid need not go lower."""


DEFAULT_BUDGET_TOKENS = int(Deployment.model_fields["max_batched_tokens"].default)
"""The engine's token budget per step unless a deployment sets one."""


def prefill_batch_grid(most: float) -> np.ndarray:
    """Prompts a prefill step holds, 1 ... ``most`` on a geometric grid (``PoolModel.prefill_batch_table``)."""
    return np.unique(np.geomspace(1.0, most, 24)) if most > 1 else np.array([1.0, 1.0 + 1e-9])


@functools.lru_cache(maxsize=1024)
def batch_grid(limit: float) -> np.ndarray:
    """Geometric batch grid from 0.5 to ``limit + 1`` (one past the cap, for marginal costs); shared,
    so read-only."""
    grid = np.geomspace(TABLE_MIN_BATCH, max(float(limit), 1.0) + 1.0, TABLE_POINTS)
    grid.flags.writeable = False
    return grid


@dataclass(frozen=True)
class PoolModel:
    """Step-time functions of one instance of a pool for one model (vectorised over numpy arrays).

    The serving modes read step times through tables over the decode batch (built once per pool,
    context and chunk budget from ``calculator.phases``): a roofline step time is piecewise linear
    in the batch, so linear interpolation on a fine geometric grid reproduces it, and the fixed
    points of Little's law become a vectorised root search instead of an iteration.
    """

    setup: Setup
    pool: Pool
    gpu: GPUSpec
    kv_budget_bytes: float  # KV bytes one GPU holds for one engine (a pipelined instance's stream)
    kv_full_bytes_per_token: float  # per GPU, layers that keep the whole context
    kv_window_bytes_per_token: float  # per GPU, sliding-window layers (they keep at most kv_window tokens)
    kv_window: float
    fits: bool
    reason: str | None
    isl_mean: float = 0.0  # the workload's mean prompt: speculation maps step-domain contexts to tokens around it
    prompt_hold_s: float = 0.0  # a prefill instance held this long per prompt after its step (a blocking KV save)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, model: ModelSpec, pool: Pool, workload: Workload, gpu: GPUSpec | None = None) -> PoolModel:
        g = gpu or load_gpu(pool.gpu)
        setup = Setup(model, g, tp=pool.tp, pp=pool.pp, ep=pool.ep, weight_dtype=pool.weight_dtype,
                      kv_dtype=pool.kv_dtype, dp=pool.dp, expert_imbalance=pool.expert_imbalance, cp=pool.cp)
        seq = int(workload.isl.mean + workload.osl.mean)
        mem = memory_breakdown(setup, seq, 0, 1, spec=pool.spec)
        draft = None if pool.spec is None else draft_setup(setup, pool.spec).model

        def kv(tokens: float) -> float:  # per GPU: context parallelism shards every sequence over cp ranks
            own = float(kv_bytes_per_gpu(model, tokens, pool.kv_dtype, tp=pool.tp, pp=pool.pp))
            draft_kv = 0.0 if draft is None else float(kv_bytes_per_gpu(draft, tokens, pool.kv_dtype, tp=pool.tp))
            return (own + draft_kv) / pool.cp

        window = float(model.sliding_window or 0) if model.num_sliding_layers else 0.0
        full = kv(window + 1) - kv(window) if window else kv(1.0)
        fits = mem.kv_budget_bytes > kv(seq)
        reason = None if fits else (
            f"{model.id} does not fit on {g.id} at tp={pool.tp} pp={pool.pp}" + (f" cp={pool.cp}" if pool.cp > 1 else "")
            + (f" dp={pool.dp} ep={pool.ep}" if pool.dp > 1 or pool.ep > 1 else "") + f" ({pool.weight_dtype}): "
            f"{(mem.weights_bytes + mem.activation_workspace_bytes + mem.runtime_reserve_bytes) / 1e9:.1f} GB per GPU "
            f"before KV, {mem.usable_bytes / 1e9:.1f} GB usable")
        # a pipelined instance splits its sequences, and so its KV memory, over its pp micro-batches (each
        # attention data-parallel rank has GPUs, and so KV memory, of its own)
        budget = max(0.0, mem.kv_budget_bytes) / pool.micro_batches
        return cls(setup, pool, g, budget, full, kv(1.0) - full, window, fits, reason, float(workload.isl.mean))

    @property
    def tokens_per_step(self) -> float:
        """Tokens a decode step emits per sequence: 1, or more with speculative decoding."""
        return 1.0 if self.pool.spec is None else self.pool.spec.tokens_per_step

    def _tokens(self, context) -> np.ndarray:
        """A context in tokens from the serving modes' one: with speculative decoding they count a
        request's output in steps (``serving.analyse``), E tokens each, after the prompt."""
        c = np.asarray(context, dtype=float)
        if self.pool.spec is None:
            return c
        return self.isl_mean + (c - self.isl_mean) * self.tokens_per_step

    def _step(self, decodes, context, chunk=None) -> np.ndarray:
        """Time of one engine step with ``decodes`` running sequences at a mean ``context`` (modes' domain)."""
        c = self._tokens(context)
        if self.pool.spec is None:
            # a step's prompt pieces are its rank's alone where the attention-DP ranks take their prompts apart
            groups = step_groups(self.setup, S=1, P=np.maximum(c - 1, 0), b=decodes, phase="decode", chunk=chunk,
                                 prompt_ranks=1.0 if chunk is not None and self.pool.coupled_ranks > 1 else None)
        else:
            groups = speculative_groups(self.setup, self.pool.spec, decodes, c, chunk=chunk)
        return step_time_s(groups, self.setup)

    @property
    def batch_cap(self) -> float:
        """The engine's share of the pool's ``max_batch`` (one micro-batch of a pipelined instance; every
        attention data-parallel rank has the whole cap: it runs a scheduler of its own), >= 1."""
        return max(1.0, self.pool.max_batch / self.pool.micro_batches)

    def kv_seq_bytes(self, tokens) -> np.ndarray:
        """KV bytes per GPU of sequences of ``tokens`` tokens (sliding-window layers capped at the window)."""
        c = np.asarray(tokens, dtype=float)
        return self.kv_full_bytes_per_token * c + self.kv_window_bytes_per_token * np.minimum(c, self.kv_window or c)

    @property
    def kv_capacity_tokens(self) -> float:
        """Tokens of full-attention KV one engine holds (what the budget holds at one token's bytes)."""
        return self.kv_budget_bytes / float(self.kv_seq_bytes(1.0))

    def prefill_s(self, new_tokens, cached_tokens=0.0, prompts=1.0) -> np.ndarray:
        """One step that prefills ``prompts`` prompts of ``new_tokens`` (after ``cached_tokens``) each,
        plus ``prompt_hold_s`` per prompt where the instance is held for a blocking KV save."""
        hold = np.asarray(prompts, dtype=float) * self.prompt_hold_s
        if np.all(np.asarray(prompts) == 1):
            return step_time_s(step_groups(self.setup, S=new_tokens, P=cached_tokens, b=1, phase="prefill"),
                               self.setup) + hold
        return self.step_s(0, 1, new_tokens, cached_tokens, prompts) + hold

    def held(self, hold_s: float) -> PoolModel:
        """This prefill instance held ``hold_s`` per prompt after its step (``Deployment.kv_transfer =
        "blocking"``), with step tables of its own (cached on this one)."""
        if hold_s == self.prompt_hold_s:
            return self
        key = ("held", float(hold_s))
        if key not in self._cache:
            self._cache[key] = replace(self, prompt_hold_s=float(hold_s), _cache={})
        return self._cache[key]

    def step_s(self, decodes, context, chunk_tokens, chunk_prefix, chunks=1.0) -> np.ndarray:
        """One engine step: ``decodes`` running sequences at a mean ``context`` plus ``chunks`` prompt
        pieces of ``chunk_tokens`` new tokens after ``chunk_prefix`` cached ones (arrays broadcast)."""
        return self._step(np.asarray(decodes, dtype=float), context, (chunk_tokens, chunk_prefix, chunks))

    def decode_s(self, batch, context) -> np.ndarray:
        return self._step(np.maximum(np.asarray(batch, dtype=float), 1.0), context)

    def hybrid_s(self, batch, context, chunk_tokens, chunk_prefix) -> np.ndarray:
        return self._step(np.maximum(np.asarray(batch, dtype=float), 1.0), context, (chunk_tokens, chunk_prefix))

    def kv_limit(self, workload: Workload) -> float:
        """Sequences one engine runs at once when KV memory binds (sliding-window layers capped at the
        window, as ``estimate`` does).

        Engines admit a request only when its prompt's KV fits beside the running sequences (vLLM's
        scheduler allocates the prompt's blocks before its first step), so with n sequences resident,
        each at the running sequences' mean context m (length-biased: long outputs stay resident
        longer, ``running_context``), a prompt of l tokens joins when
        n kv(m) + kv(l) <= M: the engine runs floor((M - kv(l)) / kv(m)) + 1 sequences, an integer
        (13 where M / kv(m) is 13.9), averaged over the prompt-length distribution. A lone request is
        always admitted. Cached per prompt- and output-length distribution (a plan asks often)."""
        key = ("kv_limit", workload.isl, workload.osl)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        # a resident sequence's context is length-biased (``running_context``; the output counted in steps)
        mean_resident = workload.isl.mean + (running_context(workload) - workload.isl.mean) * self.tokens_per_step
        vals, weights = workload.isl.points()
        room = np.maximum(self.kv_budget_bytes - self.kv_seq_bytes(vals), 0.0)
        limit = float(np.sum(weights * (np.floor(room / float(self.kv_seq_bytes(mean_resident))) + 1)))
        if len(self._cache) < 4096:
            self._cache[key] = limit
        return limit

    def batch_limit(self, workload: Workload) -> float:
        """Concurrent sequences: the engine cap, and the KV memory (``kv_limit``)."""
        return float(min(self.batch_cap, self.kv_limit(workload)))

    def decode_table(self, context: float, limit: float) -> tuple[np.ndarray, np.ndarray]:
        """(batch grid, decode step time s) at a mean context, up to ``limit + 1`` sequences."""
        key = ("decode", float(context), float(limit))
        if key not in self._cache:
            grid = batch_grid(limit)
            self._cache[key] = (grid, np.asarray(self.decode_s(grid, context), dtype=float))
        return self._cache[key]

    def decode_point(self, batch: float, context: float) -> float:
        """One decode step of ``batch`` sequences at ``context`` tokens, s (cached; computed as scalars, not from a
        table's array: numpy's scalar arithmetic can differ from its array loops in the last bit)."""
        key = ("decode_point", float(batch), float(context))
        if key not in self._cache:
            self._cache[key] = float(self.decode_s(batch, context))
        return self._cache[key]

    @staticmethod
    def prefill_batch_key(tokens: float, cached: float, most: float) -> tuple:
        return ("prefill_batch", float(tokens), float(cached), float(most))

    def prefill_batch_table(self, tokens: float, cached: float, most: float) -> tuple[np.ndarray, np.ndarray]:
        """(prompts, s): one prefill step of that many prompts of ``tokens`` new tokens after ``cached`` ones
        (``prefill_s``), on a geometric grid from 1 to ``most``. Cached; ``chunked_tables`` builds it with its own
        tables for the default token budget."""
        key = self.prefill_batch_key(tokens, cached, most)
        if key not in self._cache:
            prompts = prefill_batch_grid(most)
            self._cache[key] = (prompts, np.asarray(self.prefill_s(tokens, cached, prompts), dtype=float))
        return self._cache[key]

    @staticmethod
    def two_prompt_key(context: float, tokens: float, cached: float, limit: float) -> tuple:
        return ("two prompts", float(context), float(tokens), float(cached), float(limit))

    def two_prompt_table(self, context: float, tokens: float, cached: float, limit: float
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(batch grid, s): a step that carries two whole prompts of ``tokens`` new tokens after ``cached`` ones
        beside B running decodes at ``context``, over the batch grid up to ``limit``. Cached (a plan asks at its
        rate grid and at its trial counts); ``chunked_tables`` builds it with its own tables."""
        key = self.two_prompt_key(context, tokens, cached, limit)
        if key not in self._cache:
            grid = batch_grid(limit)
            self._cache[key] = (grid, np.asarray(self.step_s(grid, context, tokens, cached, 2.0), dtype=float))
        return self._cache[key]

    def chunked_tables(self, context: float, grid_limit: float, limits: np.ndarray, chunks: np.ndarray,
                       prompts_new: tuple[float, ...], prompt_cached: float) -> dict[str, np.ndarray]:
        """Sarathi iteration times per chunk budget C (rows) over a batch grid (columns), seconds.

        With B decodes running, a prompt of n new tokens is cut into k = ceil(n / (C - B)) chunks:
        k - 1 full iterations t(B, C - B) and one with the remainder. The chunks re-read the KV
        their earlier chunks wrote (mean prefix: cached + (k - 2)(C - B) / 2 for the full chunks, cached +
        (k - 1)(C - B) for the last), each prompt size at its own k. Tables: ``full`` (the mean prompt's
        full chunk) and ``decode_only`` iteration times, and per prompt size n (in the order given)
        ``prefill_<i>`` (all k iterations, s) and ``iters_<i>`` (k).
        Rows are cached per budget, so a search over budgets builds each once.
        """
        grid = batch_grid(grid_limit)
        whole = ("chunked tables", float(context), float(grid_limit), limits.tobytes(), chunks.tobytes(), prompts_new,
                 prompt_cached)
        if whole in self._cache:  # the same budgets again (a plan's trial counts after its rate grid)
            return self._cache[whole]
        keys = [("chunked", float(context), float(grid_limit), float(lim), float(c), prompts_new, prompt_cached)
                for lim, c in zip(limits.tolist(), chunks.tolist())]
        missing = [i for i, k in enumerate(keys) if k not in self._cache]
        if missing:
            C = chunks[missing][:, None]
            B = np.minimum(grid[None, :], limits[missing][:, None])
            room = np.maximum(C - B, 1.0)
            rows: dict[str, np.ndarray] = {}
            n_chunks = []
            for i, n in enumerate(prompts_new):
                k = np.maximum(np.ceil(n / room), 1.0)
                n_chunks.append(k)
                rows[f"iters_{i}"] = k
            # one vectorised call, stacked on a new axis: per prompt size its full chunks (the k - 1 of them sit at
            # prefixes 0, room, ..., (k - 2) room: mean (k - 2) room / 2) and its last chunk; the first size's full
            # chunk is the table's ``full`` step
            tokens, prefixes = [], []
            for n, k in zip(prompts_new, n_chunks):
                tokens += [np.minimum(room, C), n - (k - 1) * room]
                prefixes += [prompt_cached + np.maximum(k - 2, 0.0) * room / 2, prompt_cached + (k - 1) * room]
            tokens, prefixes = np.stack(tokens), np.stack(prefixes)
            decodes = np.broadcast_to(np.maximum(B[None], 1.0), tokens.shape)  # as ``hybrid_s`` takes them
            # with, in the same step computation (the same array operations on each entry as a table built alone),
            # the step of two whole mean prompts beside every batch of the grid (``two_prompt_table``) and the
            # prefill steps of the default token budget's prompts (``prefill_batch_table``), where not built yet
            two = self.two_prompt_key(context, prompts_new[0], prompt_cached, grid_limit)
            most = max(1.0, math.floor(DEFAULT_BUDGET_TOKENS / self.isl_mean)) if self.isl_mean > 0 else 0.0
            batch_key = self.prefill_batch_key(prompts_new[0], prompt_cached, most)
            parts = [(decodes.ravel(), np.full(tokens.size, float(context)), tokens.ravel(), prefixes.ravel(),
                      np.ones(tokens.size))]
            if two not in self._cache:
                parts.append((grid, np.full(grid.size, float(context)), np.full(grid.size, prompts_new[0]),
                              np.full(grid.size, prompt_cached), np.full(grid.size, 2.0)))
            prompts = prefill_batch_grid(most) if most >= 1 and batch_key not in self._cache else np.zeros(0)
            if prompts.size:  # as ``prefill_s`` takes them: no decodes, one token of context
                parts.append((np.zeros(prompts.size), np.ones(prompts.size), np.full(prompts.size, prompts_new[0]),
                              np.full(prompts.size, prompt_cached), prompts))
            steps = np.asarray(self._step(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                                          tuple(np.concatenate([p[i] for p in parts]) for i in (2, 3, 4))), dtype=float)
            times = steps[:tokens.size].reshape(tokens.shape)
            at = tokens.size
            if two not in self._cache:
                self._cache[two] = (grid, steps[at:at + grid.size])
                at += grid.size
            if prompts.size:
                self._cache[batch_key] = (prompts, steps[at:] + prompts * self.prompt_hold_s)
            rows["full"] = times[0]
            d_grid, d_table = self.decode_table(context, grid_limit)  # no prompt: a plain decode step
            rows["decode_only"] = np.interp(B, d_grid, d_table)
            for i, k in enumerate(n_chunks):
                rows[f"prefill_{i}"] = (k - 1) * times[2 * i] + times[2 * i + 1]
            rows = {name: np.broadcast_to(r, B.shape) for name, r in rows.items()}
            for j, i in enumerate(missing):
                self._cache[keys[i]] = {name: r[j] for name, r in rows.items()}
        names = self._cache[keys[0]].keys()
        out = {"grid": grid, **{name: np.stack([self._cache[k][name] for k in keys]) for name in names}}
        for table in out.values():
            table.flags.writeable = False
        if len(self._cache) < 4096:
            self._cache[whole] = out
        return out


@dataclass(frozen=True)
class PoolRows:
    """The pool models of a stacked analysis (``chunked.analyse_budgets``): row r of its (rows x rates)
    arrays belongs to ``pools[owner[r]]``. A plan analyses every (GPU, tp) configuration's chunk budgets in
    one call, since a call's cost is mostly its fixed part (numpy dispatch), not its cells. Each row's
    figures are those its pool gives alone: its own batch grid and step tables (``grid``, 2-d where the
    pools differ), its own limits."""

    pools: tuple[PoolModel, ...]
    owner: np.ndarray  # (rows,) index into ``pools``
    chains: np.ndarray | None = None
    """The step-chain group of each row where it is not its pool's (``disaggregated.analyse_pairs``: a chain per
    deployment, as each has it alone)."""

    @classmethod
    def of(cls, pm: PoolModel | PoolRows, rows: int) -> PoolRows:
        """``pm`` as rows: a lone pool model owns all ``rows``."""
        return pm if isinstance(pm, PoolRows) else cls((pm,), np.zeros(rows, dtype=int))

    @classmethod
    def each(cls, pms: list[PoolModel]) -> PoolRows:
        """One row per entry of ``pms`` (the same pool model in several rows is one pool)."""
        index: dict[int, int] = {}
        pools: list[PoolModel] = []
        owner = []
        for pm in pms:
            if id(pm) not in index:
                index[id(pm)] = len(pools)
                pools.append(pm)
            owner.append(index[id(pm)])
        return cls(tuple(pools), np.array(owner, dtype=int))

    def per_row(self, fn: Callable[[PoolModel], float]) -> float | np.ndarray:
        """fn(pool): a float where one pool owns every row, else a (rows, 1) column (broadcasts against
        (rows, rates) arrays; a lone pool's float keeps the caller's shapes as they were)."""
        if len(self.pools) == 1:
            return float(fn(self.pools[0]))
        return self.column(fn)

    @functools.cached_property
    def groups(self) -> list[tuple[PoolModel, np.ndarray]]:
        """(pool model, its rows) per pool, in pool order."""
        return [(pm, np.flatnonzero(self.owner == i)) for i, pm in enumerate(self.pools)]

    def column(self, fn: Callable[[PoolModel], float]) -> np.ndarray:
        """fn(pool) per row, as a (rows, 1) column (one pool: a (1, 1) array that broadcasts)."""
        if len(self.pools) == 1:
            return np.array([[float(fn(self.pools[0]))]])
        return np.array([float(fn(pm)) for pm in self.pools])[self.owner][:, None]

    def decode_steps(self, context: float, w: Workload, batch) -> np.ndarray:
        """Each row's decode step time (s) at ``batch`` ((rows, ...) for several pools), on its pool's table up
        to its batch limit (``decode_step_at``); several pools' rows in one lookup (a grid per row)."""
        if len(self.pools) == 1:
            pm = self.pools[0]
            return decode_step_at(pm, context, pm.batch_limit(w), batch)
        tables = [m.decode_table(context, m.batch_limit(w)) for m in self.pools]
        grids = np.stack([g for g, _ in tables])[self.owner]
        steps = np.stack([t for _, t in tables])[self.owner]
        b = np.asarray(batch, dtype=float)
        b = np.broadcast_to(b, (self.owner.size, *b.shape[1:]) if b.ndim else (self.owner.size,))
        return GridLookup(grids, b.reshape(b.shape[0], -1))(steps).reshape(b.shape)

    def map(self, fn: Callable[..., Any], *arrays) -> Any:
        """fn(pool, *its rows of ``arrays``) assembled in row order (arrays broadcast to (rows, ...)); one
        pool: fn(pool, *arrays) as they are. Where fn returns a tuple of arrays, a tuple of them."""
        if len(self.pools) == 1:
            got = fn(self.pools[0], *arrays)
            return tuple(np.asarray(g, dtype=float) for g in got) if isinstance(got, tuple) else np.asarray(
                got, dtype=float)
        arrays = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in arrays))
        shape = (self.owner.size, *arrays[0].shape[1:]) if arrays[0].ndim else (self.owner.size,)
        arrays = [np.broadcast_to(a, shape) for a in arrays]
        outs: list[np.ndarray] | None = None
        for pm, ix in self.groups:
            got = fn(pm, *(a[ix] for a in arrays))
            parts = got if isinstance(got, tuple) else (got,)
            if outs is None:
                outs = [np.empty(shape) for _ in parts]
            for o, g in zip(outs, parts):
                o[ix] = np.broadcast_to(g, o[ix].shape)
        assert outs is not None
        return tuple(outs) if len(outs) > 1 else outs[0]


def grid_take(grid: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The batches at grid columns ``cols``: ``grid`` one grid (P,), or one per row (rows x P) with ``cols``
    (W,) (a (rows, 1, W) result) or (rows, ..., W)."""
    if grid.ndim == 1:
        return grid[cols]
    cols = np.asarray(cols)
    if cols.ndim == 1:
        return grid[:, None, cols]
    g = grid.reshape(grid.shape[0], *([1] * (cols.ndim - 2)), grid.shape[1])
    return np.take_along_axis(np.broadcast_to(g, (*cols.shape[:-1], grid.shape[1])), cols, -1)


class GridLookup:
    """Piecewise-linear lookup of tables (rows x grid) at points ``x`` (rows x n): the bracketing
    grid cells are found once and reused for every table read at the same points; inf stays inf.
    ``grid`` is one grid for every row (P,) or one per row (rows x P, ``PoolRows``)."""

    def __init__(self, grid: np.ndarray, x: np.ndarray) -> None:
        x = np.atleast_2d(np.asarray(x, dtype=float))
        finite = np.isfinite(x)
        if grid.ndim == 2:
            first, last = grid[:, :1], grid[:, -1:]
            xc = np.clip(np.where(finite, x, first), first, last)
            # every row's own searchsorted, in one call: rows apart on a log scale (grids are positive)
            span = float(np.log(grid.max() / grid.min())) + 1.0
            offset = np.arange(grid.shape[0])[:, None] * span
            keys = (np.log(grid) + offset).ravel()
            hi = np.searchsorted(keys, (np.log(xc) + offset).ravel()).reshape(xc.shape)
            hi = np.clip(hi - np.arange(grid.shape[0])[:, None] * grid.shape[1], 1, grid.shape[1] - 1)
            rows = np.broadcast_to(np.arange(grid.shape[0])[:, None], hi.shape)
            self._lo, self._hi = hi - 1, hi
            self._frac = (xc - grid[rows, hi - 1]) / (grid[rows, hi] - grid[rows, hi - 1])
            self._finite = finite
            return
        xc = np.clip(np.where(finite, x, grid[0]), grid[0], grid[-1])
        hi = np.clip(np.searchsorted(grid, xc), 1, grid.size - 1)
        self._lo, self._hi = hi - 1, hi
        self._frac = (xc - grid[hi - 1]) / (grid[hi] - grid[hi - 1])
        self._finite = finite

    def __call__(self, table: np.ndarray) -> np.ndarray:
        table = np.atleast_2d(table)
        rows = np.broadcast_to(np.arange(table.shape[0])[:, None], self._lo.shape) if table.shape[0] > 1 else 0
        lo, hi = table[rows, self._lo], table[rows, self._hi]
        return np.where(self._finite, lo + (hi - lo) * self._frac, np.inf)


def interp_rows(grid: np.ndarray, table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Piecewise-linear lookup of ``table`` (rows x grid) at ``x`` (rows x n); inf stays inf."""
    return GridLookup(grid, x)(table)


def first_root(grid: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Least B on the grid's piecewise-linear interpolation where g(B) = B - F(B) turns >= 0.

    ``g`` is (..., grid): g at every grid point. Returns (...): the root, inf where g stays
    negative over the whole grid (the batch would outgrow it: unstable), and F(grid[0]) where g is
    already >= 0 at the first point (the root lies below it, where F is flat).
    """
    g, found, i, inside = _first_crossing(grid, g)
    below = grid[0] - g[..., 0]
    return np.where(found, np.where(i == 0, below, inside), np.inf)


def _first_crossing(b: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, ...]:
    """(g with NaN as -inf, whether g turns >= 0, the first column where it does, the batch there on the line
    between that column and the one before) for g at the batches ``b`` (last axis; ``b`` broadcasts to g)."""
    g = np.where(np.isnan(g), -np.inf, g)
    cross = g >= 0
    found = cross.any(axis=-1)
    i = np.argmax(cross, axis=-1)
    lo = np.maximum(i - 1, 0)
    b = np.broadcast_to(b, g.shape)

    def at(a: np.ndarray, j: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, j[..., None], -1)[..., 0]

    g_lo, g_hi, b_lo, b_hi = at(g, lo), at(g, i), at(b, lo), at(b, i)
    with np.errstate(invalid="ignore", divide="ignore"):
        inside = b_lo + (b_hi - b_lo) * (-g_lo) / np.where(g_hi > g_lo, g_hi - g_lo, 1.0)
    return g, found, i, inside


COARSE_ROOT_STRIDE = 4
"""Grid columns between the points of the coarse pass of ``coarse_first_root`` (~20% apart in the batch
for a limit of a few hundred sequences)."""


def coarse_first_root(grid: np.ndarray, excess: Callable[[np.ndarray], np.ndarray], upper=np.inf) -> np.ndarray:
    """``first_root`` of g(B) = B - F(B) without evaluating g at every grid point: g at every
    ``COARSE_ROOT_STRIDE``-th column (and the last), then, where it turns >= 0, at every column of
    the coarse interval that brackets the crossing. ``excess(cols)`` returns g at grid columns: cols of
    shape (W,) give (..., W); cols of shape (..., W) give (..., W).

    The same root as ``first_root`` on the whole grid unless g crosses zero and back between two coarse
    points before its first coarse crossing: a pair of roots within ~20% of each other in the batch,
    i.e. a load within a hair of the point where the least root vanishes and the batch runs away. Then
    this search returns the next root g reaches (one at or past the batch limit: unstable), or, where g
    rises, falls and rises again below the limit, that later, larger root. A plan's rate grid asks at ~40 rates x
    7 budgets x 128 columns; this evaluates ~40 columns a cell. ``upper`` (broadcast to the result): the
    batch beyond which a root does not count (a batch limit), where no coarse point crosses.
    """
    points = grid.shape[-1]
    coarse = np.unique(np.r_[np.arange(0, points, COARSE_ROOT_STRIDE), points - 1])
    g_c = excess(coarse)
    g_c = np.where(np.isnan(g_c), -np.inf, g_c)
    cross = g_c >= 0
    coarse_found = cross.any(axis=-1)
    # a grid per row (rows x P, ``PoolRows``): its rows line up with the results' first axis
    rows_grid = grid if grid.ndim == 1 else grid.reshape(grid.shape[0], *([1] * (g_c.ndim - 2)), points)
    # the fine window: the coarse interval that brackets the first crossing, or where none does, the two
    # around g's largest coarse value up to ``upper`` (a pair of roots between two coarse points straddles
    # g's peak; past a batch limit F is flat and g rises again, but a root there is unstable anyway)
    peak = np.argmax(np.where(rows_grid[..., coarse] <= np.asarray(upper)[..., None], g_c, -np.inf), axis=-1)
    j = np.where(coarse_found, np.argmax(cross, axis=-1), peak)
    below = rows_grid[..., 0] - g_c[..., 0]  # g >= 0 at the first point: the root lies below it, where F is flat
    start = coarse[np.maximum(j - 1, 0)]
    cols = np.minimum(start[..., None] + np.arange(2 * COARSE_ROOT_STRIDE + 1), points - 1)
    _, window_found, _, inside = _first_crossing(grid_take(grid, cols), excess(cols))
    return np.where(coarse_found | window_found, np.where(coarse_found & (j == 0), below, inside), np.inf)


def least_fixed_point(grid: np.ndarray, table: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Least B >= 0 with B = k * T(B), T the piecewise-linear curve through (grid, table row).

    ``table`` is rows x grid, ``k`` rows x n (or n); returns rows x n (see ``first_root``).
    """
    table = np.atleast_2d(table)
    k = np.atleast_2d(np.asarray(k, dtype=float))
    return first_root(grid, grid[None, None, :] - k[..., None] * table[:, None, :])


@dataclass(frozen=True)
class PrefillService:
    """Moments of one request's prefill time over the prompt-length distribution."""

    mean_s: float
    second_moment_s2: float
    quantile_s: float  # at the SLO percentile

    @property
    def cs2(self) -> float | np.ndarray:
        return np.maximum(0.0, self.second_moment_s2 / np.asarray(self.mean_s) ** 2 - 1)

    @classmethod
    def of(cls, pm: PoolModel | PoolRows, workload: Workload, p: float) -> PrefillService:
        """Cached per pool model; for several (``PoolRows``), their figures as (rows, 1) columns."""
        if isinstance(pm, PoolRows):
            each = [cls.of(m, workload, p) for m in pm.pools]
            if len(each) == 1:
                return each[0]
            return cls(*(np.array([getattr(e, a) for e in each])[pm.owner][:, None]  # type: ignore[arg-type]
                         for a in ("mean_s", "second_moment_s2", "quantile_s")))
        key = ("prefill", float(p), workload.isl, workload.prefix_hit)
        if key not in pm._cache:
            pm._cache[key] = cls._compute(pm, workload, p)
        return pm._cache[key]

    @staticmethod
    def excess_s(pm: PoolModel | PoolRows, workload: Workload, levels) -> np.ndarray:
        """The prefill time of the prompt at each of ``levels`` of the length distribution, less the
        mean prefill time (``PrefillService.of(...).quantile_s - mean_s``, all levels in one call); for several
        pool models (``PoolRows``, 1-d ``levels``), (rows, 1, levels)."""
        if isinstance(pm, PoolRows):
            if len(pm.pools) == 1:
                return PrefillService.excess_s(pm.pools[0], workload, levels)
            each = np.stack([PrefillService.excess_s(m, workload, levels) for m in pm.pools])
            return each[pm.owner][:, None, :]
        levels = np.asarray(levels, dtype=float)
        if workload.isl.samples is None and workload.isl.cv == 0:
            return np.zeros(levels.shape)
        q_isl = np.array([workload.isl.quantile(float(x)) for x in levels.ravel()]).reshape(levels.shape)
        q_cached = np.round(q_isl * workload.prefix_hit)
        return np.asarray(pm.prefill_s(q_isl - q_cached, q_cached), dtype=float) - PrefillService.of(
            pm, workload, float(levels.ravel()[0])).mean_s

    @classmethod
    def _compute(cls, pm: PoolModel, workload: Workload, p: float) -> PrefillService:
        vals, w = workload.isl.points()
        cached = np.round(vals * workload.prefix_hit)
        t = pm.prefill_s(vals - cached, cached)
        # the p-quantile prompt on its own, a scalar: numpy's scalar arithmetic (pow, exp) can differ from its
        # array loops in the last bit, so inside the points' array it would not be the figure it is alone
        q_isl = workload.isl.quantile(p)
        q_cached = round(q_isl * workload.prefix_hit)
        return cls(float(np.sum(w * t)), float(np.sum(w * t**2)), float(pm.prefill_s(q_isl - q_cached, q_cached)))


def z_score(p: float) -> float:
    return NormalDist().inv_cdf(p)


ERLANG_EXACT_SERVERS = 32
"""Up to this many servers ``erlang_c`` runs the exact recursion; beyond, Sakasegawa's approximation
(``wait_probability``), which is close for many servers."""


def erlang_c(offered, servers) -> np.ndarray:
    """P(an arrival waits) in M/M/c: Erlang's C for offered load a = lambda E[S] on c servers (c
    rounded to a whole number), by the Erlang-B recursion B_k = a B_(k-1) / (k + a B_(k-1)),
    C = B_c / (1 - rho (1 - B_c)); 1 where rho >= 1. Sakasegawa's approximation above
    ERLANG_EXACT_SERVERS servers."""
    a, c = np.broadcast_arrays(np.asarray(offered, dtype=float), np.maximum(np.round(np.asarray(servers, dtype=float)), 1))
    rho = a / c
    few = c <= ERLANG_EXACT_SERVERS
    erlang_b = np.ones_like(a)
    for k in range(1, int(c[few].max()) + 1 if few.any() else 1):
        erlang_b = np.where(k <= c, a * erlang_b / (k + a * erlang_b), erlang_b)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        exact = erlang_b / (1 - rho * (1 - erlang_b))
        approx = f.wait_probability({"lambda": a, "E_S": 1.0, "c_srv": c})
        return np.where(rho < 1, np.where(few, exact, approx), 1.0)


def queue_wait(rate, service: PrefillService, servers, p, batched=False,
               ca2: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(mean wait, p-quantile of the wait) of a G/G/c queue (``ca2``: the arrivals' squared cv, 1 for
    Poisson); inf when rho >= 1. ``batched``: queued prompts share a step with those that arrive while
    they wait (the wait stretches by 1 + rho). ``p`` a 1-d array of levels: the quantiles on a last axis."""
    rate = np.asarray(rate, dtype=float)
    args = {"lambda": rate, "E_S": service.mean_s, "c_s2": service.cs2, "c_srv": servers, "c_a2": ca2}
    rho = f.server_utilisation(args)
    # Allen-Cunneen's wait with the exact Erlang-C P_w in place of Sakasegawa's (which overstates it
    # for a few servers at light load: 0.16 against 0.12 for c = 2 at rho 0.28)
    approx = np.maximum(np.asarray(f.wait_probability(args), dtype=float), 1e-300)
    pw = erlang_c(rate * service.mean_s, servers)
    wq = np.where(rho < 1, f.mean_queue_wait(args) * pw / approx, np.inf) * np.where(batched, 1 + rho, 1.0)
    if ca2 > 0 and abs(ca2 - 1.0) > 1e-12:
        # bursty arrivals: more of them wait (GI/M/1's P_w on one server, the c servers' Erlang C scaled as it)
        pw = np.minimum(pw * gamma_arrival_wait_probability(rho, ca2) / np.maximum(rho, 1e-12), 1.0)
    pp = np.asarray(p, dtype=float)
    wq_, pw_, rho_ = (np.asarray(x, dtype=float)[..., None] if pp.ndim else x for x in (wq, pw, rho))
    wp = np.where(rho_ < 1, f.wait_percentile(W_q=np.where(rho_ < 1, wq_, 0), P_w=np.maximum(pw_, 1e-300), p=pp), np.inf)
    return wq, wp


def step_wait(rate, service: PrefillService, step_s, p: float, batched, busy_s=None,
              ca2: float = 1.0, slots: SlotQueue | None = None, bulk=None, shift=None, cells=None, other=None
              ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, p-quantile) of a prompt's wait for its own step on an instance that also decodes; with
    ``slots``, the p-quantile of its whole wait, for its step or for a batch slot (``with_slot_wait``), and the
    mean of the wait for its step of a prompt that finds a slot free: the prompt queue then runs at the rate of
    the prompts that start while a slot is free (``SlotQueue.free_prompt_rate``; stable as the whole rate is).

    An arrival finds a prompt step running with probability P_w (it then waits as in M/G/1), else a
    decode step of ``step_s``, whose rest it waits out (uniform). The M/G/1 wait, given that it is
    positive, is a Weibull of mean W_q / P_w whose shape matches its variability (``wait_cv2_mg1``:
    near uniform, the rest of one prompt, at light load with prompts of one length; exponential
    with exponential prompts or at heavy load); ``mixture_quantile`` solves for the p-quantile.
    ``batched`` (a bool array): prompts that queued are served in one step with those that arrived
    while they waited, which stretches a waiting prompt's time by (1 + rho) on average. ``busy_s``:
    how long one prompt keeps the queue busy when that exceeds its work (chunked: a prompt's last,
    part-filled step), which sets P_w = lambda busy_s. ``ca2``: the arrivals' squared cv (Kingman's
    G/G/1 mean wait; 1 for Poisson). ``bulk``: (where, P_w, mean and squared cv of a positive wait, tau, prompts
    a step holds) that replace M/G/1's where given: bulk service of whole prompts (``hybrid_bulk_wait``); there
    an arrival that finds a decode step also shares its own step with the J ~ Poisson(lambda t_d) prompts that
    arrive during that step (as many as the step holds beside it), each adding tau (``bulk_idle_tail``). With
    ``bulk`` only its cells' quantiles are computed. ``shift`` (not with ``bulk``): (mean, width) of the time a
    prompt that waited spends more in its own steps than one that did not, uniform over the width (chunked: it
    starts in its predecessor's last step, wherever that step's room ends), added to every positive wait:
    P(W > x) = (1 - P_w) max(0, 1 - x / t_d) + P_w E[exp(-((x - D)+ / s)^k)], D the shift.
    ``cells`` (a mask that broadcasts to the result): computed there alone, NaN elsewhere, each cell's figures those
    of the whole call (a plan's hybrid rows take each cell's wait from the FIFO or the bulk form, not both).
    ``other``: (share, s) where the prompt's rank steps with other attention data-parallel ranks that prefill on
    their own (``DPSteps``): that share of the time its own queue is empty goes to other ranks' prompt steps of
    that length, whose rest (uniform) it waits out as well; it joins the positive waits (P_w grows by it, and
    their mean and second moment by a uniform rest of such a step).
    """
    if cells is not None:
        return _step_wait_on(cells, rate, service, step_s, p, batched, busy_s, ca2, slots, bulk, shift, other)
    return _step_wait(rate, service, step_s, p, batched, busy_s, ca2, slots, bulk, shift, other=other)


def _step_wait_on(cells, rate, service: PrefillService, step_s, p: float, batched, busy_s, ca2: float,
                  slots: SlotQueue | None, bulk, shift, other=None) -> tuple[np.ndarray, np.ndarray]:
    """``step_wait`` at the cells of the mask ``cells`` alone (NaN elsewhere): every input cut to them, and the
    slot wait counted in the quantile wherever it is in the whole call (``matters``), so each cell's figures are
    the whole call's."""
    parts = [rate, step_s, batched, service.mean_s, service.second_moment_s2, service.quantile_s,
             *(() if busy_s is None else (busy_s,)), *(shift or ()), *(bulk or ()), *(other or ()),
             *(() if slots is None else slots.__dict__.values())]
    shape = np.broadcast_shapes(np.shape(cells), *(np.shape(a) for a in parts))
    cells = np.broadcast_to(cells, shape)
    mean_out, q_out = np.full(shape, np.nan), np.full(shape, np.nan)
    if not cells.any():
        return mean_out, q_out

    def on(a, dtype=float) -> np.ndarray:
        return np.broadcast_to(np.asarray(a, dtype=dtype), shape)[cells]

    matters = slots is not None and bool(np.any(slots.matters(p)))
    mean_out[cells], q_out[cells] = _step_wait(
        on(rate), PrefillService(on(service.mean_s), on(service.second_moment_s2), on(service.quantile_s)),
        on(step_s), p, on(batched, bool), None if busy_s is None else on(busy_s), ca2,
        None if slots is None else SlotQueue(*(on(x) for x in slots.__dict__.values())),
        None if bulk is None else (on(bulk[0], bool), *(on(a) for a in bulk[1:])),
        None if shift is None else tuple(on(a) for a in shift), matters,
        None if other is None else tuple(on(a) for a in other))
    return mean_out, q_out


def _step_wait(rate, service: PrefillService, step_s, p: float, batched, busy_s, ca2: float, slots: SlotQueue | None,
               bulk, shift, matters: bool | None = None, other=None) -> tuple[np.ndarray, np.ndarray]:
    """``step_wait`` over every cell; ``matters``: whether the slot wait counts in the quantiles (where None, as
    the slots say)."""
    rate = np.asarray(rate, dtype=float)
    ok = f.server_utilisation({"lambda": rate, "E_S": service.mean_s, "c_srv": 1}) < 1
    if slots is not None:
        # a prompt waits for its step only where it finds a slot free (``with_slot_wait``); while the slots are
        # all taken prompts start only as sequences leave, so the free time sees fewer starts than lambda
        rate = slots.free_prompt_rate(rate)
    args = {"lambda": rate, "E_S": service.mean_s, "c_s2": service.cs2, "c_srv": 1, "c_a2": ca2}
    rho = f.server_utilisation(args)
    wq = np.where(ok, f.mean_queue_wait(args), np.inf) * np.where(batched, 1 + rho, 1.0)
    pw = np.clip(np.asarray(f.wait_probability(args), dtype=float), 1e-12, 1.0)
    if ca2 > 0 and abs(ca2 - 1.0) > 1e-12:  # bursty (or smooth) arrivals: GI/M/1's P_w, Kingman's mean
        pw = gamma_arrival_wait_probability(rate * service.mean_s, ca2)
    theta = np.where(ok, wq / pw, 1.0)
    # the shape of a positive wait: nearly uniform (the rest of one prompt) at light load with prompts
    # of one length, exponential at heavy load or with exponential prompts
    # (the shape from the Poisson wait: Takacs' moments are M/G/1's)
    wq_poisson = np.where(ok, f.mean_queue_wait({**args, "c_a2": 1.0}), 1.0)
    cv2 = np.where(ok, f.wait_cv2_mg1({**args, "W_q": np.where(ok & (wq > 0), wq_poisson, 1.0)}), 1.0)
    if busy_s is not None:
        # chunked prompts that hold the queue beyond their work: a queued one starts in its
        # predecessor's last, part-filled step, so its wait is not the rest of one prompt (exponential)
        # (a probability: where lambda busy_s reaches 1 every arrival waits, and the M/G/1 wait over the
        # prompts' work, finite while rho < 1, is all of it)
        cv2 = np.where(np.asarray(busy_s) > service.mean_s * (1 + 1e-9), 1.0, cv2)
        pw = np.clip(rate * busy_s, pw, 1.0)
    t_d = np.maximum(np.asarray(step_s, dtype=float), 1e-12)
    join_tau = join_mean = join_most = None
    if bulk is not None:
        where, pw_b, theta_b, cv2_b, tau_b, per_step_b = bulk
        pw, theta, cv2 = np.where(where, pw_b, pw), np.where(where, theta_b, theta), np.where(where, cv2_b, cv2)
        join_tau, join_mean = np.where(where, tau_b, 0.0), np.where(where, rate * t_d, 0.0)
        join_most = np.maximum(np.asarray(per_step_b, dtype=float) - 1, 0.0)
        # the joiners' mean delay: tau E[min(J, n - 1)] where the step holds n < JOINERS + 1 prompts, else tau E[J]
        weights, shifts = joiner_weights(join_tau, join_mean, join_most)
        joined = np.where(join_most < JOINERS, (weights * shifts).sum(axis=0), join_tau * join_mean)
        wq = np.where(where, pw_b * theta_b + (1 - pw_b) * joined, wq)
    if other is not None:  # other ranks' prompt steps in the time the own queue is empty: waits of a uniform rest
        share, long_s = (np.asarray(a, dtype=float) for a in other)
        extra = (1 - pw) * np.clip(share, 0.0, 1.0)
        second = pw * theta**2 * (1 + cv2) + extra * long_s**2 / 3
        positive = pw * theta + extra * long_s / 2
        wq = wq + extra * long_s / 2
        pw = np.clip(pw + extra, 1e-12, 1.0)
        theta = np.where(ok, np.maximum(positive / pw, 1e-12), 1.0)
        cv2 = np.where(ok, np.maximum(second / pw / theta**2 - 1, 0.0), cv2)
    lags = np.zeros((1,) + np.broadcast(pw, theta).shape)
    if shift is not None:
        mid, width = (np.where(ok, np.asarray(a, dtype=float), 0.0) for a in shift)
        wq = wq + pw * mid
        lags = np.maximum(mid + width * SHIFT_POINTS.reshape(-1, *([1] * np.ndim(mid))), 0.0)
    mean = (1 - pw) * t_d / 2 + wq
    if matters is None:
        matters = slots is not None and bool(np.any(slots.matters(p)))
    if join_tau is None and not matters and shift is None:
        return np.where(ok, mean, np.inf), np.where(ok, mixture_quantile(pw, theta, t_d, p, cv2), np.inf)
    k, inv_gamma = weibull_shape(cv2)
    scale = np.maximum(theta, 1e-12) * inv_gamma
    if join_tau is not None:  # fixed over the slot wait's bisection
        join_w, join_shift = joiner_weights(join_tau, join_mean, join_most)

    tail_shape = np.broadcast_shapes(np.shape(pw), np.shape(t_d), np.shape(scale), np.shape(k), lags.shape[1:],
                                     *(() if join_tau is None else (join_w.shape[1:],)))

    def tail_over(sel=None):
        """P(W > x) at every cell, or at the cells of the mask ``sel`` alone (``with_slot_wait`` bisects only
        where requests wait for a slot)."""
        def pick(a, lead: int = 0):
            if sel is None:
                return a
            return np.broadcast_to(a, np.shape(a)[:lead] + tail_shape)[(slice(None),) * lead + (sel,)]

        pw_, t_, sc_, k_ = (pick(a) for a in (pw, t_d, scale, k))
        lags_ = pick(lags, 1)
        jw, js = (None, None) if join_tau is None else (pick(join_w, 1), pick(join_shift, 1))

        spare: list[np.ndarray] = []  # the shifted Weibull's (points x cells) array, reused across a bisection

        def tail(x):
            idle = np.maximum(0.0, 1 - x / t_) if join_tau is None else joined_idle_tail(x, t_, jw, js)
            if shift is None:
                return (1 - pw_) * idle + pw_ * np.exp(-((x / sc_) ** k_))
            return (1 - pw_) * idle + pw_ * shifted_weibull_tail(x, lags_, sc_, k_, spare)

        return tail

    tail = tail_over()
    tail.over, tail.cells = tail_over, tail_shape  # type: ignore[attr-defined]

    # beyond one decode step (and its joiners) only the Weibull is left: where it alone leaves (1 - p) / 2,
    # the tail does
    reach = t_d if join_tau is None else t_d + JOINERS * join_tau
    far = np.maximum(reach, lags.max(axis=0) + scale * np.log(np.maximum(2 * pw / (1 - p), 1.0)) ** (1 / k))
    if shift is not None:
        alone = decreasing_root(lambda x: tail(x) - (1 - p), np.zeros_like(far), far)
    elif join_tau is None:
        alone = mixture_quantile(pw, theta, t_d, p, cv2)
    else:  # the bulk cells' own quantile, by bisection on those cells alone (the others are not asked for)
        cells = np.broadcast_to(bulk[0], np.broadcast(pw, theta, t_d, far).shape)  # type: ignore[index]
        alone = np.zeros(cells.shape)
        pw_c, t_c, tau_c, mu_c, most_c, sc_c, k_c, far_c = (np.broadcast_to(a, cells.shape)[cells] for a in (
            pw, t_d, join_tau, join_mean, join_most, scale, k, far))
        weights, shifts = joiner_weights(tau_c, mu_c, most_c)  # fixed over the bisection

        def cell_tail(x):
            idle = joined_idle_tail(x, t_c, weights, shifts)
            return (1 - pw_c) * idle + pw_c * np.exp(-((x / sc_c) ** k_c)) - (1 - p)

        alone[cells] = decreasing_root(cell_tail, np.zeros_like(far_c), far_c)
    q = with_slot_wait(p, tail, far, alone, slots) if matters else alone  # type: ignore[arg-type]
    return np.where(ok, mean, np.inf), np.where(ok, q, np.inf)


def shifted_weibull_tail(x, lags, scale, k, spare: list[np.ndarray]) -> np.ndarray:
    """The mean over ``lags`` (first axis) of exp(-((max(x - lag, 0) / scale)^k)), computed in place in one array
    kept in ``spare`` (a bisection calls it a dozen times on the same shapes): the same operations as writing it
    out, and, since the array takes numpy's own layout for x - lags (column-major where the lags were cut by a
    mask), the mean sums in the same order too: the same result to the last bit."""
    shape = np.broadcast_shapes(np.shape(x), np.shape(lags), np.shape(scale), np.shape(k))
    if not spare or spare[0].shape != shape:
        spare[:] = [np.subtract(x, lags)]
    else:
        np.subtract(x, lags, out=spare[0])
    w = spare[0]
    np.maximum(w, 0.0, out=w)
    np.divide(w, scale, out=w)
    np.power(w, k, out=w)
    np.negative(w, out=w)
    np.exp(w, out=w)
    return w.mean(axis=0)


SHIFT_POINTS = (np.arange(8) + 0.5) / 8 - 0.5
"""Points (midpoint rule) of the uniform spread of ``step_wait``'s ``shift``, as fractions of its width."""


JOINERS = 4
"""Prompts arriving during one decode step that ``bulk_idle_tail`` weighs one by one (the rest lumped at 4)."""


def joiner_weights(tau, mean_joiners, most=JOINERS) -> tuple[np.ndarray, np.ndarray]:
    """(P(J = j), tau j) for j = 0 ... ``JOINERS`` (first axis), J = min(Poisson(``mean_joiners``), ``most``):
    the prompts that share a step with one that found a decode step, at most ``most`` of them (a budget of n
    whole prompts a step takes n - 1 beside it; the rest run in the next step) and at most ``JOINERS`` (the
    rest of the mass lumped there)."""
    tau, mu, most = np.broadcast_arrays(np.asarray(tau, dtype=float), np.asarray(mean_joiners, dtype=float),
                                        np.clip(np.floor(np.asarray(most, dtype=float)), 0, JOINERS))
    j = np.arange(JOINERS + 1.0).reshape(-1, *([1] * mu.ndim))
    log_fact = np.cumsum(np.log(np.maximum(j, 1.0)), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):  # mu = 0: no joiners (set below)
        pmf = np.exp(j * np.log(mu) - mu - log_fact)
    pmf = np.where(mu > 0, pmf, (j == 0).astype(float))
    below = np.where(j < most, pmf, 0.0)
    pmf = np.where(j == most, np.maximum(1 - below.sum(axis=0), 0.0), below)
    return pmf, tau * j


def bulk_idle_tail(x, t_d, tau, mean_joiners, most=JOINERS) -> np.ndarray:
    """P(U t_d + tau J > x): a prompt that arrives during a decode step waits its rest U t_d, and its own step
    carries the J ~ Poisson(``mean_joiners``) prompts that arrived during that decode step, each adding
    ``tau`` (J up to ``most`` and ``JOINERS``: ``joiner_weights``)."""
    x, t_d, tau, mu, most = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (x, t_d, tau, mean_joiners,
                                                                                        most)))
    return joined_idle_tail(x, t_d, *joiner_weights(tau, mu, most))


def joined_idle_tail(x, t_d, weights, shifts) -> np.ndarray:
    """``bulk_idle_tail`` from ``joiner_weights``' (weights, shifts), which a bisection computes once."""
    return (weights * np.clip(1 - (x - shifts) / t_d, 0.0, 1.0)).sum(axis=0)


def with_slot_wait(p: float, tail, far_s, alone_s, slots: SlotQueue, before_mean_s=None) -> np.ndarray:
    """p-quantile of a request's wait W (``tail(x)`` = P(W > x), ``far_s`` its (1 + p) / 2 quantile or
    more, ``alone_s`` its p-quantile) with its wait for a batch slot (``slots``: with probability P_a a
    Weibull of mean theta_a, P(A > a | A > 0) = exp(-(a / s)^k) (``SlotQueue.wait_shape``), long beside W).

    On one instance (``before_mean_s`` None) the two overlap: prompts wait in one FIFO queue, and
    while its head waits for a slot every prompt behind it waits for the same departures, so a prompt
    that waits for a slot waits for that alone:
      P(wait > x) = (1 - P_a) P(W > x) + P_a exp(-(x / s)^k),
    W there the wait of a prompt that finds a slot free, in a queue that sees only the prompts that start
    while a slot is free (``step_wait`` with ``slots``: ``SlotQueue.free_prompt_rate``).
    On a decode instance the slot wait follows the prefill (W, mean ``before_mean_s``), and adds to it:
      P(W + A > x) = (1 - P_a) P(W > x) + P_a exp(-(max(x - E[W], 0) / s)^k).
    Adding the two p-quantiles instead drops the slot wait wherever fewer than 1 - p of the requests
    wait for one (its p-quantile is 0), though they are part of the tail. Bisection from
    [0, far_s + E[W] + s ln(2 P_a / (1 - p))^(1 / k)], where the tail is below 1 - p."""
    finite = np.isfinite(slots.mean_s) & np.isfinite(slots.wait_given_wait_s)
    pa = np.where(finite & slots.matters(p), slots.wait_probability, 0.0)
    k, theta = slots.wait_shape()
    shift = 0.0 if before_mean_s is None else np.where(np.isfinite(before_mean_s), before_mean_s, 0.0)
    far = np.where(np.isfinite(far_s), far_s, 0.0)

    def excess_at(x, w_tail):  # P(wait > x) - (1 - p): decreasing in x
        return (1 - pa) * w_tail + pa * np.exp(-((np.maximum(x - shift, 0.0) / theta) ** k)) - (1 - p)

    def over_at(x, w_tail):
        return excess_at(x, w_tail) > 0

    segment = getattr(tail, "segment", None)
    if segment is not None:  # a table: bisect within its segment, where W's tail is a line
        pa, theta, shift, k = (np.asarray(a, dtype=float)[..., None] for a in np.broadcast_arrays(pa, theta, shift, k))
        q0, q1, l0, l1, past, last = segment(over_at)
        pa, theta, shift, k = pa[..., 0], theta[..., 0], shift[..., 0], k[..., 0]
        lo = np.where(past, last, q0)
        hi = np.where(past, last + shift + theta * np.log(np.maximum(2 * pa / (1 - p), 1.0)) ** (1 / k), q1)
        slope = (l1 - l0) / np.maximum(q1 - q0, 1e-300)

        def tail(x):  # noqa: F811 - the line on the segment
            return np.where(past, 0.0, 1 - l0 - slope * (x - q0))
    else:
        hi = far + shift + theta * np.log(np.maximum(2 * pa / (1 - p), 1.0)) ** (1 / k)
        hi = np.broadcast_to(hi, np.broadcast(hi, pa).shape).copy()
        lo = np.zeros_like(hi)
        need = np.broadcast_to(pa > 0, hi.shape)
        if getattr(tail, "cells", None) == hi.shape and need.any() and not need.all():
            # bisect only where requests wait for a slot (a plan's grids: ~1 cell in 10), each cell as before
            part = tail.over(need)  # type: ignore[attr-defined]
            pa_n, theta_n, shift_n, k_n = (np.broadcast_to(a, hi.shape)[need] for a in (pa, theta, shift, k))

            def excess_need(x):
                return (1 - pa_n) * part(x) + pa_n * np.exp(-((np.maximum(x - shift_n, 0.0) / theta_n) ** k_n)) - (1 - p)

            q = np.array(np.broadcast_to(alone_s, hi.shape), dtype=float)
            q[need] = decreasing_root(excess_need, lo[need], hi[need])
            return np.where(finite & np.isfinite(far_s), q, np.inf)
    q = np.where(pa > 0, decreasing_root(lambda x: excess_at(x, tail(x)), lo, hi), alone_s)
    return np.where(finite & np.isfinite(far_s), q, np.inf)


def quantile_table_tail(quantiles, levels):
    """P(X > x) of a positive X known by its quantiles at increasing ``levels`` (last axis of
    ``quantiles``): linear between them and from 0 at x = 0 to the first, 0 beyond the last. The
    tail on the segment that holds a probability (``segment``) is a line, so ``with_slot_wait`` can
    bisect within it without looking the table up at every step."""
    qs = np.maximum.accumulate(np.asarray(quantiles, dtype=float), axis=-1)
    qs = np.concatenate([np.zeros_like(qs[..., :1]), qs], axis=-1)
    lv = np.concatenate([[0.0], np.asarray(levels, dtype=float)])

    def tail(x):
        x = np.asarray(x, dtype=float)
        j = np.clip((qs < x[..., None]).sum(axis=-1), 1, lv.size - 1)[..., None]  # x in (q_{j-1}, q_j]
        q0, q1 = np.take_along_axis(qs, j - 1, -1)[..., 0], np.take_along_axis(qs, j, -1)[..., 0]
        l0, l1 = lv[j[..., 0] - 1], lv[j[..., 0]]
        cdf = l0 + (l1 - l0) * np.clip((x - q0) / np.maximum(q1 - q0, 1e-300), 0.0, 1.0)
        return np.where(x >= qs[..., -1], 0.0, 1 - cdf)

    def segment(over):
        """The table's points (q_{j-1}, q_j) and levels around the first point where ``over(q, P(X > q))``
        (decreasing along the table) turns False, and the tail as a line there; a row where it is
        True at the last point gets that point and a tail of 0 beyond."""
        tails = 1 - lv
        tails[-1] = 0.0
        ok = over(qs, np.broadcast_to(tails, qs.shape))
        j = np.clip(ok.sum(axis=-1), 1, lv.size - 1)[..., None]
        past = ok[..., -1]
        q0, q1 = np.take_along_axis(qs, j - 1, -1)[..., 0], np.take_along_axis(qs, j, -1)[..., 0]
        l0, l1 = lv[j[..., 0] - 1], lv[j[..., 0]]
        return q0, q1, l0, l1, past, qs[..., -1]

    tail.segment = segment
    return tail


GI_M_1_ITERATIONS = 60


def gamma_arrival_wait_probability(rho, ca2: float) -> np.ndarray:
    """P(an arrival waits) in the GI/M/1 queue with Gamma inter-arrivals of squared cv ``ca2`` at utilisation
    ``rho``: the least root of ``gamma_arrival_wait_probability``'s fixed point, iterated from rho (the map
    is increasing and contracting on [0, 1)); rho itself for Poisson arrivals."""
    rho = np.clip(np.asarray(rho, dtype=float), 1e-12, 1 - 1e-12)
    pw = rho.copy()
    for _ in range(GI_M_1_ITERATIONS):
        pw = np.asarray(f.gamma_arrival_wait_probability({"P_w": pw, "c_a2": ca2, "lambda": rho, "E_S": 1.0}),
                        dtype=float)
    return np.clip(pw, 1e-12, 1.0)


def excess_sum(e1, e2) -> np.ndarray:
    """Excess over the mean of the sum of two independent parts at a percentile, given each part's
    excess at that percentile: in quadrature when both are above their means (a long wait and a
    long prompt rarely coincide), else their plain sum."""
    e1, e2 = np.asarray(e1, dtype=float), np.asarray(e2, dtype=float)
    with np.errstate(invalid="ignore"):
        return np.where((e1 > 0) & (e2 > 0), np.hypot(e1, e2), e1 + e2)


def mixture_quantile(pw, theta, t_d, p: float, cv2=1.0) -> np.ndarray:
    """p-quantile of a wait that is, with probability ``pw``, Weibull of mean ``theta`` and squared cv
    ``cv2`` (1: exponential), and else uniform over one decode step ``t_d``:
    P(W > x) = (1 - pw) max(0, 1 - x / t_d) + pw exp(-(x / scale)^k).

    Beyond one decode step only the Weibull part is left (``weibull_tail_quantile``); within it the
    quantile is found by bisection (the tail is decreasing)."""
    pw, theta, t_d = (np.asarray(a, dtype=float) for a in (pw, theta, t_d))
    k, inv_gamma = weibull_shape(cv2)
    scale = np.maximum(theta, 1e-12) * inv_gamma
    x = np.asarray(f.weibull_tail_quantile(theta_w=scale, k=k, P_w=pw, p=p), dtype=float)
    inside = x < t_d
    if np.any(inside):
        def g(y):
            return (1 - pw) * np.maximum(0.0, 1 - y / t_d) + pw * np.exp(-((y / scale) ** k)) - (1 - p)

        x = np.where(inside, decreasing_root(g, np.zeros_like(x), np.broadcast_to(t_d, x.shape)), x)
    return x


_WEIBULL_K = np.geomspace(0.5, 12.0, 200)
_WEIBULL_INV_GAMMA = np.array([1 / math.gamma(1 + 1 / k) for k in _WEIBULL_K])
_WEIBULL_CV2 = np.array([math.gamma(1 + 2 / k) / math.gamma(1 + 1 / k) ** 2 - 1 for k in _WEIBULL_K])


def weibull_shape(cv2) -> tuple[np.ndarray, np.ndarray]:
    """(shape k, 1 / Gamma(1 + 1/k)) of the Weibull with squared cv ``cv2`` (clipped to 0.01 ... 3):
    its scale is the mean times the second value. cv2 = Gamma(1 + 2/k) / Gamma(1 + 1/k)^2 - 1."""
    c = np.clip(np.nan_to_num(np.asarray(cv2, dtype=float), nan=1.0), 0.01, 3.0)
    k = np.interp(c, _WEIBULL_CV2[::-1], _WEIBULL_K[::-1])
    return k, np.interp(k, _WEIBULL_K, _WEIBULL_INV_GAMMA)


def seen(grid: np.ndarray, table: np.ndarray, more=1.0) -> np.ndarray:
    """The step time a decoding request sees at a mean batch B: t_d(B + 1), since it decodes with
    itself plus the others, and the others of an M/G/infinity batch are Poisson with mean B (the
    size-biased batch). Matters at small batches, where one sequence more is a large share (an
    MoE at B = 1.5 touches twice the experts of B = 1). ``more`` (per row where the table has rows): the
    sequences the request adds to the batch the step is timed at, 1 / n where n attention data-parallel
    ranks step together at their mean batch (``Pool.coupled_ranks``: the routed experts serve them all)."""
    table = np.asarray(table, dtype=float)
    more = np.broadcast_to(np.asarray(more, dtype=float).reshape(-1), (1 if table.ndim == 1 else len(table),))
    if table.ndim == 1:
        return np.interp(grid + more[0], grid, table)
    if grid.ndim == 2:  # a grid per row (``PoolRows``)
        return np.stack([np.interp(g + a, g, row) for g, row, a in zip(grid, table, more)])
    return np.stack([np.interp(grid + a, grid, row) for row, a in zip(table, more)])


def decode_fixed_point(pm: PoolModel, context: float, rate, osl_mean: float, inflation, limit: float
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Solve B = rate * osl * TPOT(B), TPOT(B) = t_d(B + 1) * inflation (Little's law; ``seen``): the
    least root.

    Returns (B, TPOT); TPOT is inf where B would pass ``limit`` (KV memory or the batch cap) or no
    root exists (the decode cannot keep up: unstable).
    """
    rate = np.asarray(rate, dtype=float)
    grid, table = pm.decode_table(context, limit)
    table = seen(grid, table)
    k = np.asarray(f.littles_law_batch({"lambda": rate, "n_out": osl_mean, "TPOT": inflation}), dtype=float)
    batch = least_fixed_point(grid, table, np.broadcast_to(k, rate.shape).reshape(-1))[0].reshape(rate.shape)
    t_d = interp_rows(grid, table, np.minimum(batch, limit).reshape(-1))[0].reshape(rate.shape)
    stable = np.isfinite(batch) & (batch <= limit)
    return batch, np.where(stable, t_d * inflation, np.inf)


def decode_fixed_batches(rows: PoolRows, context: float, rate, osl_mean: float, w: Workload) -> np.ndarray:
    """``decode_fixed_point``'s B (inflation 1) of every row of ``rate`` (rows x n) on its own pool's table up to
    its batch limit, all pools in one root search: the same figures as each pool alone, to the last bit."""
    tables = [m.decode_table(context, m.batch_limit(w)) for m in rows.pools]
    grids = np.stack([g for g, _ in tables])[rows.owner][:, None, :]  # (rows, 1, P)
    seen_t = np.stack([seen(g, t) for g, t in tables])[rows.owner][:, None, :]
    rate = np.asarray(rate, dtype=float)
    k = np.asarray(f.littles_law_batch({"lambda": rate, "n_out": osl_mean, "TPOT": 1.0}), dtype=float)
    k = np.broadcast_to(k, rate.shape).reshape(rate.shape[0], -1)
    g, found, i, inside = _first_crossing(grids, grids - k[..., None] * seen_t)
    below = grids[..., 0] - g[..., 0]
    return np.where(found, np.where(i == 0, below, inside), np.inf).reshape(rate.shape)


def decode_step_at(pm: PoolModel, context: float, limit: float, batch) -> np.ndarray:
    """Tabulated decode step time at (possibly fractional) batch sizes, seconds."""
    grid, table = pm.decode_table(context, limit)
    b = np.asarray(batch, dtype=float)
    return interp_rows(grid, table, b.reshape(-1))[0].reshape(b.shape)


MAX_DECODE_LOAD = 0.99
"""Bound on the decode load in ``tpot_batch_variance`` (the batch's variance grows as 1 / (1 - rho_d))."""


def decode_load(lam, w: Workload, slope, rho=0.0) -> np.ndarray:
    """rho_d = lambda osl slope / (1 - rho): the feedback of the decode batch on its own lifetimes (each
    sequence more slows every step; a prompt's stalls, share ``rho``, stretch the lifetimes too), at most
    MAX_DECODE_LOAD."""
    return np.clip(lam * w.osl.mean * slope / np.maximum(1 - np.asarray(rho), 1e-3), 0.0, MAX_DECODE_LOAD)


PRODUCT_FORM_SPREADS = 6.0
"""Half-width of the batch states ``product_form_step_moments`` sums over, in standard deviations of the
negative binomial (plus ten states)."""
MAX_PRODUCT_FORM_STATES = 4096
"""Most batch states ``product_form_step_moments`` sums over per rate (a bound on the work per call)."""


def product_form_step_moments(pm: PoolModel | PoolRows, context: float, lam, osl_mean: float, limit, batch, rho_d
                              ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of the decode step a request sees, t(N + 1), over the batch N of a decode instance
    without prompts, s and s^2: the product form pi(n) ~ prod_{k <= n} lambda osl t(k) / k of the
    birth-death batch (births lambda, deaths n / (osl t(n))), over the instance's own step curve, with
    the queue for a slot beyond the L = floor(``limit``) sequences the KV memory (or the batch cap) holds:
    there the batch runs full, deaths L / (osl t(L)), a geometric tail of ratio lambda osl t(L) / L whose
    requests decode at t(L) once admitted (inf where it is 1 or more). It is insensitive to the
    output-length distribution (a processor-sharing queue). On a linear step it is the formula
    ``batch_step_variance`` (negative binomial) and the mean is t(B + 1); the real curve is concave where
    more sequences touch fewer new experts (an MoE at a small batch: there the line's spread is too wide,
    and t(B + 1) is above the mean, by Jensen's inequality) and convex where a step turns compute-bound.
    Qwen3-30B-A3B on an H100 with 6,000-token prompts and 13 slots, 0.6-0.9 of capacity: TPOT means
    11.67-16.19 ms against the simulation's 11.63-16.11 ms, where t(B + 1) at Little's B said 12.07-17.20.
    Summed over a window of states about the mean batch ``batch`` (``PRODUCT_FORM_SPREADS`` negative-binomial
    deviations; at the limit where ``batch`` is not finite).
    For several pool models (``pm`` a ``PoolRows``; ``lam``, ``batch``, ``rho_d`` rows x n; ``limit`` each row's, a
    (rows, 1) column) every row on its own pool's curve in one call: the same figures as each pool alone, to the
    last bit."""
    lam = np.asarray(lam, dtype=float)
    shape = np.broadcast_shapes(lam.shape, np.shape(batch), np.shape(rho_d))
    lam, b, rho = (np.broadcast_to(np.asarray(a, dtype=float), shape).reshape(-1) for a in (lam, batch, rho_d))
    if not isinstance(pm, PoolRows):
        top = float(max(math.floor(limit), 1))
        mean, var = _product_form(lam, b, rho, np.zeros(lam.size, dtype=int), [pm.decode_table(context, limit)],
                                  np.array([top]), osl_mean)
        return mean.reshape(shape), var.reshape(shape)
    # each pool's entries together, in the order a call per pool takes them (its rows in order, then the rates)
    owner = np.broadcast_to(pm.owner.reshape(-1, *([1] * (len(shape) - 1))), shape).reshape(-1)
    order = np.argsort(owner, kind="stable")
    per_row = np.broadcast_to(np.asarray(limit, dtype=float).reshape(-1), pm.owner.shape)
    limits = [float(per_row[ix[0]]) if ix.size else 1.0 for _, ix in pm.groups]  # a pool's limit is its rows'
    mean, var = _product_form(lam[order], b[order], rho[order], owner[order],
                              [m.decode_table(context, lim) for m, lim in zip(pm.pools, limits)],
                              np.array([float(max(math.floor(lim), 1)) for lim in limits]), osl_mean)
    out_mean, out_var = np.empty(lam.size), np.empty(lam.size)
    out_mean[order], out_var[order] = mean, var
    return out_mean.reshape(shape), out_var.reshape(shape)


def _product_form(lam, b, rho, pool, curves, tops, osl_mean: float) -> tuple[np.ndarray, np.ndarray]:
    """``product_form_step_moments`` of 1-d entries, entry e on the step curve ``curves[pool[e]]`` (batch grid,
    step s) with ``tops[pool[e]]`` slots; each pool's entries contiguous."""
    ok = lam > 0
    mean_out, var_out = np.full(lam.shape, np.inf), np.full(lam.shape, np.inf)
    if not ok.any():
        return mean_out, var_out
    pool, top = pool[ok], tops[pool[ok]]
    lam, b, rho = lam[ok], np.where(np.isfinite(b[ok]), np.minimum(b[ok], top), top), np.minimum(rho[ok], MAX_DECODE_LOAD)
    half = PRODUCT_FORM_SPREADS * np.sqrt(np.maximum(b, 1.0) / (1 - rho)) + 10
    lo = np.clip(np.floor(b - half), 0, top)
    widths = (np.minimum(np.minimum(np.ceil(b + half), top) - lo + 1, MAX_PRODUCT_FORM_STATES)).astype(np.int64)
    # each rate's own window of states, laid end to end (a plan's rate grid spans small and large batches)
    starts = np.cumsum(widths) - widths
    ends = starts + widths - 1
    row = np.repeat(np.arange(widths.size), widths)
    n = lo[row] + (np.arange(row.size) - starts[row])
    steps, seen_steps, log_pi = np.empty(n.size), np.empty(n.size), np.empty(n.size)
    t_top = np.empty(lam.size)
    state_pool = pool[row]
    for i, (grid, table) in enumerate(curves):
        states, entries = state_pool == i, pool == i
        if not entries.any():
            continue
        steps[states] = np.interp(np.maximum(n[states], 1.0), grid, table)  # t(n): the step of n sequences
        # t(n + 1): the step a request among them sees
        seen_steps[states] = np.interp(np.minimum(n[states] + 1, tops[i]), grid, table)
        t_top[entries] = float(np.interp(tops[i], grid, table))
    ratio = np.log(lam[row] * osl_mean * steps / np.maximum(n, 1.0))
    ratio[starts] = 0.0  # each window's first state is its reference
    for i in range(len(curves)):  # one running sum a pool, as a call per pool sums
        states = state_pool == i
        log_pi[states] = np.cumsum(ratio[states])
    log_pi -= log_pi[starts][row]
    pi = np.exp(log_pi - np.maximum.reduceat(log_pi, starts)[row])
    # the queue beyond the full batch: states top + 1, top + 2, ... at ratio r, each decoding at t(top)
    r = lam * osl_mean * t_top / top
    reaches = n[ends] >= top
    with np.errstate(divide="ignore", invalid="ignore"):
        queue = np.where(reaches, np.where(r < 1, pi[ends] * r / (1 - r), np.inf), 0.0)
    total = np.add.reduceat(pi, starts) + queue
    with np.errstate(invalid="ignore"):
        mean = (np.add.reduceat(pi * seen_steps, starts) + queue * t_top) / total
        var = (np.add.reduceat(pi * (seen_steps - mean[row]) ** 2, starts) + queue * (t_top - mean) ** 2) / total
    finite = np.isfinite(queue)
    mean_out[ok], var_out[ok] = np.where(finite, mean, np.inf), np.where(finite, var, np.inf)
    return mean_out, var_out


def tpot_tail(tpot_mean, rho, lam, x_mean, x_cv2: float, w: Workload, slope, batch, p: float,
              step_variance=None, extra_variance=None) -> tuple[np.ndarray, np.ndarray]:
    """(variance, p-quantile) of a request's TPOT, a lognormal with the mean ``tpot_mean``.

    The stalls: each prompt landing in a request's lifetime adds its step time ``x_mean`` (squared
    cv ``x_cv2``) and, because its sequence then decodes alongside for about half the lifetime,
    ``slope`` (one more sequence's step time) x osl / 2. The batch: the spread of the batch it decodes
    with, which grows with the decode load lambda osl slope / (1 - rho) (``tpot_batch_variance``):
    ``step_variance`` (the step's variance over the batch's distribution, s^2) where the caller has it
    from the step curve (``product_form_step_moments``), else that of a linear step (negative binomial).
    ``rho`` is the prompts' time share (the amplification of the mean TPOT). ``extra_variance``: more
    variance from elsewhere (whole prompts queued behind a request's own step: ``bulk_start_variance``).
    """
    x_eff = x_mean + slope * w.osl.mean / 2
    rho_eff = np.minimum(lam * x_eff, 0.999)
    stalls = f.tpot_stall_variance(**{"lambda": lam, "TPOT": tpot_mean, "E_X2": x_eff**2 + x_mean**2 * x_cv2,
                                      "c_a2": w.arrival_cv**2,
                                      "E_inv_n": inverse_osl(w), "rho_p": rho_eff})
    # the decode load: the feedback of the batch on its own lifetimes (a prompt's stalls stretch them too)
    rho_d = decode_load(lam, w, slope, rho)
    if step_variance is None:
        step_variance = f.batch_step_variance(t_slope=slope, B=batch, rho_d=rho_d)
    var = stalls + f.tpot_batch_variance(V_t=step_variance, rho_p=rho, rho_d=rho_d)
    if extra_variance is not None:
        var = var + extra_variance
    finite = np.isfinite(tpot_mean) & np.isfinite(var)
    q = f.lognormal_quantile(TPOT=np.where(finite, tpot_mean, 1.0), V_T=np.where(finite, var, 0.0), z=z_score(p))
    return var, np.where(finite, q, np.inf)


FULL_SHARE_MIN = 1e-4
"""Share of requests waiting for a slot below which TPOT is the lognormal alone (``full_batch_tpot_quantile``)."""


def full_batch_tpot_quantile(tpot_mean, var, tpot_full, full_share, p: float) -> np.ndarray:
    """p-quantile of TPOT when a share ``full_share`` of the requests (those that waited for a batch slot)
    decode beside a full batch, at its TPOT ``tpot_full``, and the rest follow a lognormal with the mean and
    variance that ``tpot_tail``'s (``tpot_mean``, ``var``) leaves them (``_rest_of_full_batch``), capped at
    ``tpot_full``:
      P(TPOT > y) = P_f [y < T_full] + (1 - P_f) P(T_n > y),
    so below T_full the p-quantile is T_n's at p / (1 - P_f), and T_full where P_f >= 1 - p. A request that
    waited starts only as a sequence leaves, and the queue behind it keeps the batch full for much of its
    life: in the simulation (Qwen3-30B-A3B, 6,000-token prompts, 13 slots, chunked at 0.8 of capacity) the
    24% of requests that waited more than 0.2 s for a slot decoded at 23.0 ms a token, 0.95 of the full
    batch's TPOT, and the rest at 18.6 ms, so the median TPOT (20.6 ms) lies above the mean (19.7 ms),
    which one lognormal cannot give (it said 17.9 ms; the mixture says 19.0). Taking the waiters out of the
    whole keeps the p90 where few wait: adding them on top of it put the chunked p90 TPOT at 0.6 of capacity
    9-12% high."""
    share, full = _full_share(full_share, tpot_full)
    below = share < 1 - p
    level = np.clip(np.where(below, p / np.maximum(1 - share, 1e-12), p), 1e-12, 1 - 1e-12)
    z = np.full(level.shape, z_score(p))
    moved = below & (share > 0)
    if moved.any():
        z[moved] = [z_score(x) for x in level[moved].tolist()]
    mean, var = _rest_of_full_batch(tpot_mean, var, full, share)
    finite = np.isfinite(mean) & np.isfinite(var)
    q = f.lognormal_quantile(TPOT=np.where(finite, mean, 1.0), V_T=np.where(finite, var, 0.0), z=z)
    q = np.where(finite, q, np.inf)
    return np.where(below, np.minimum(q, full), full)


def _full_share(full_share, tpot_full) -> tuple[np.ndarray, np.ndarray]:
    """(share, full batch's TPOT) of ``full_batch_tpot_quantile``: a share below FULL_SHARE_MIN is none, and
    so is any share where the full batch's TPOT is not finite (no ceiling: the lognormal alone)."""
    share = np.clip(np.nan_to_num(np.asarray(full_share, dtype=float), nan=1.0), 0.0, 1.0)
    full = np.asarray(tpot_full, dtype=float)
    ok = np.isfinite(full)
    share = np.where((share < FULL_SHARE_MIN) | ~ok, 0.0, share)
    return share, np.where(ok, full, np.inf)


def _rest_of_full_batch(tpot_mean, var, tpot_full, share) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the TPOT of the requests that did not wait for a slot: what is left of the whole
    (``tpot_mean``, ``var``) once the share that waited is taken out at ``tpot_full`` (total mean and total
    variance). Floors keep the rest a distribution where the whole is narrower than the split implies: its
    mean at least half the whole's, its variance at least a quarter of it (the total variance then comes out
    above the whole's, never below)."""
    mean, var = np.asarray(tpot_mean, dtype=float), np.asarray(var, dtype=float)
    full = np.where(np.isfinite(tpot_full), tpot_full, mean)
    rest = np.maximum(1 - share, 1e-12)
    mean_n = np.maximum((mean - share * full) / rest, 0.5 * mean)
    var_n = np.maximum((var - share * (1 - share) * (full - mean_n) ** 2) / rest, 0.25 * var)
    return mean_n, var_n


def full_batch_tpot_cdf(tpot_mean, var, tpot_full, full_share, x) -> np.ndarray:
    """P(TPOT <= x) of ``full_batch_tpot_quantile``'s mixture."""
    share, full = _full_share(full_share, tpot_full)
    mean_n, var_n = _rest_of_full_batch(tpot_mean, var, full, share)
    rest = np.where(x >= full, 1.0, lognormal_cdf(mean_n, var_n, x))
    return (1 - share) * rest + share * (x >= full)


def lognormal_cdf(mean, var, x) -> np.ndarray:
    """P(TPOT <= x) for the lognormal of ``tpot_tail``."""
    mean, var = np.asarray(mean, dtype=float), np.asarray(var, dtype=float)
    ok = np.isfinite(mean) & np.isfinite(var) & (mean > 0)
    m = np.where(ok, mean, 1.0)
    s2 = np.log1p(np.where(ok, var, 0.0) / m**2)
    z = (np.log(x) - np.log(m) + s2 / 2) / np.sqrt(np.maximum(s2, 1e-30))
    cdf = 0.5 * (1 + _erf(z / math.sqrt(2)))
    return np.where(ok, cdf, 0.0)


def _erf(x: np.ndarray) -> np.ndarray:
    """Error function, vectorised (Abramowitz-Stegun 7.1.26, |error| < 1.5e-7)."""
    sign = np.sign(x)
    x = np.abs(x)
    t = 1 / (1 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1 - poly * np.exp(-x * x))


def inverse_osl(w: Workload) -> float:
    """E[1 / (osl - 1)] over the output-length distribution (requests with one token have no gaps)."""
    vals, weights = w.osl.points()
    gaps = np.maximum(vals - 1, 1.0)
    return float(np.sum(weights / gaps))


GAP_RHO = np.concatenate([np.linspace(0.0, 0.9, 91), 1 - np.geomspace(0.1, 1e-4, 200)[1:], [1.0]])
"""Loads at which ``gap_amplification`` is tabulated (denser towards 1, where long outputs bend it)."""


@functools.lru_cache(maxsize=256)
def _gap_amplification_table(osl: Length) -> tuple[np.ndarray, np.ndarray]:
    """E[a_n] and E[a_n^2] at the loads GAP_RHO, a_n = (1 + rho + ... + rho^(n-1)) / n over the output
    lengths' n = osl - 1 gaps (0 for a request without a gap)."""
    vals, weights = osl.points()
    n = np.maximum(np.asarray(vals, dtype=float) - 1, 0.0)[None, :]
    r = GAP_RHO[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        total = np.where(r < 1, (1 - r**n) / (1 - r), n)
    a = np.where(n > 0, total / np.maximum(n, 1.0), 0.0)
    return a @ weights, a**2 @ weights


def gap_amplification(w: Workload, rho, power: int = 1) -> np.ndarray:
    """The mean over requests of ((1 + rho + ... + rho^(n-1)) / n)^power, n a request's gaps: how a delay at
    the start of a lifetime grows as each gap it lengthens admits more prompts (``bulk_start_stall``), per
    gap. Tabulated in rho per output-length distribution and interpolated (a plan asks on whole grids)."""
    table = _gap_amplification_table(w.osl)[power - 1]
    return np.interp(np.clip(np.asarray(rho, dtype=float), 0.0, 1.0), GAP_RHO, table)


SLOT_WAIT_SHARE = 0.01
"""Share of the requests beyond a p-quantile (1 - p) below which waits for a slot leave it as it is."""


@dataclass(frozen=True)
class SlotQueue:
    """The queue for a batch slot (KV memory or the batch cap) as a birth-death process whose death
    rate follows the load.

    With n sequences running a request holds its slot hold(n) = hold + hold_slope (n - 1 - B): every
    sequence more slows every step (B the mean batch, ``hold_s`` the mean hold, which a request has
    among the B others it finds on average, n = B + 1; the n-th state's steps are those of n sequences, so
    the chain reaches ``hold_full_s`` at n = c). A request waits only
    when all c = ``limit`` slots are taken, and then the batch runs full, at ``hold_full_s``: the
    TPOT ceiling of a full batch, where prompts start only as sequences leave. So the waits are set
    by the slow full batch, not by the mean hold; a queue at a fixed mean hold (M/G/c) misses this
    and under-predicts waits near the cap by about half. The occupancy is product form,
    pi(n) ~ prod_k lambda hold(k) / k, with a geometric queue beyond c at ratio r = lambda hold_full
    / c; an arrival waits with P_w = P(N >= c), times the M/D/c / M/M/c ratio of delay probabilities
    for holds less variable than exponential (``mdc``: the chain's departures are exponential, a fixed
    output length's holds nearly constant; weighted by 1 - c_s^2), then a time of mean W_q / P_w with W_q
    = f P(N >= c) / (c / hold_full - lambda), f the ``slot_wait_factor`` (Allen-Cunneen's (c_a^2 + c_s^2) / 2
    with Cosmetatos' correction for such holds): the mean wait is Cosmetatos', the delay probability
    Crommelin's. Against the simulation (Qwen3-30B-A3B, 6,000-token prompts, 13 and 22 slots, utilisation
    0.6-0.9) a wait for a slot averaged 0.51-0.74 of M/M/c's, where Allen-Cunneen's exponential had 0.50-0.57.
    A positive wait is exponential. A pure M/D/c's (fixed holds, single arrivals) is less variable (squared
    cv 0.7, in ``tests/test_serving_v2.py``), and so is the whole positive wait here (0.75-0.85, with the
    many short waits behind one departure), but its tail is not: beyond 0.2-0.5 s the simulated wait's
    excess has squared cv 0.9-1.1 (disaggregated at 0.8 and 0.9 of capacity, mixed at 0.9: the holds follow
    the batch, and stalls batch the arrivals), the exponential's; a Weibull of squared cv 0.7 put the p90
    TTFT of the disaggregated case at 0.8 of capacity 10% high and the mixed median at 0.9 of capacity 21%
    high (the exponential: P(wait > 1 s) 0.286 against 0.284 simulated, chunked at 0.9).
    A fractional c (the KV memory holds c sequences of the mean length) interpolates between its
    two neighbouring integers. Where the full batch cannot keep up (lambda hold_full >= c) and the
    mean batch comes within three Poisson spreads of the cap, every request waits (``full_load``).
    Where prompts stall the decodes (``stall_share``: ``stall_batch_share``), the requests that arrive
    during one stall busy period take their slots together, and P_w is that of the chain with batch
    arrivals (``_batched_slot_wait_probability``), not the product form.
    """

    mean_s: np.ndarray
    wait_probability: np.ndarray
    wait_given_wait_s: np.ndarray
    full_load: np.ndarray | float = 0.0
    """lambda hold_full / c: the slots' load at the full batch's hold, where the batch reaches its cap
    (0 where it does not); at 1 or more the full batch cannot keep up and the queue for a slot grows
    without bound (every request waits, for ever: ``mean_s`` inf, ``wait_probability`` 1), whatever the
    mean batch says."""

    def occupancy(self, batch_share) -> np.ndarray:
        """The slots' load as a binding resource: the batch's share of its slots (``batch_share``), or,
        where the full batch cannot keep up, ``full_load`` (1 or more)."""
        return np.where(np.asarray(self.full_load) >= 1, self.full_load, batch_share)

    def matters(self, p: float) -> np.ndarray:
        """Whether enough requests wait for a slot (1% of the 1 - p beyond the p-quantile) that the
        wait moves a p-quantile of TTFT (``with_slot_wait``)."""
        return np.asarray(self.wait_probability) >= SLOT_WAIT_SHARE * (1 - p)

    wait_cv2: np.ndarray | float = 1.0
    """Squared cv of a wait given that it is positive (1: exponential)."""

    def wait_shape(self) -> tuple[np.ndarray, np.ndarray]:
        """(Weibull shape k, scale s) of a positive wait: P(A > x | A > 0) = exp(-(x / s)^k)."""
        k, inv_gamma = weibull_shape(self.wait_cv2)
        ok = np.isfinite(self.wait_given_wait_s)
        return k, np.where(ok, self.wait_given_wait_s, 1.0) * inv_gamma

    def free_prompt_rate(self, lam) -> np.ndarray:
        """The rate (1/s) at which prompts start their prefill while a slot is free (``slot_free_prompt_rate``):
        ``lam`` where no request waits for a slot or the full batch is not reached, 0 where every request
        waits (none finds a slot free)."""
        lam = np.asarray(lam, dtype=float)
        pw = np.asarray(self.wait_probability, dtype=float)
        load = np.asarray(self.full_load, dtype=float)
        some = (pw > 0) & (load > 0) & (pw < 1) & np.isfinite(self.mean_s)
        free = f.slot_free_prompt_rate({"lambda": lam, "P_w": np.where(some, pw, 0.0),
                                        "rho_full": np.where(some, load, 1.0)})
        return np.where(some, free, np.where(pw >= 1, 0.0, lam))

    def quantile_s(self, p: float) -> np.ndarray:
        ok = np.isfinite(self.mean_s)
        pw = np.where(ok, self.wait_probability, 1.0)
        k, scale = self.wait_shape()
        q = f.weibull_tail_quantile(theta_w=scale, k=k, P_w=np.maximum(pw, 1e-300), p=p)
        return np.where(ok, q, np.inf)

    @classmethod
    def of(cls, lam, batch, limit, hold_s, hold_cs2, hold_slope_s=0.0, hold_full_s=None, ca2: float = 1.0,
           stall_share=0.0) -> SlotQueue:
        arrays = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (
            lam, batch, limit, hold_s, hold_cs2, hold_slope_s, hold_s if hold_full_s is None else hold_full_s,
            stall_share)))
        lam, batch, c, hold, cs2, slope, full, stall = (a.reshape(-1) for a in arrays)
        shape = arrays[0].shape
        c = np.maximum(c, 1.0)
        full = np.maximum(full, hold)
        finite = np.isfinite(hold) & np.isfinite(full) & np.isfinite(batch)
        # the full batch is a state the instance reaches only where its mean batch comes within three
        # Poisson spreads of the cap; a cap far above it is a bound, not a state (a full batch of hundreds,
        # a prompt joining at every departure, can lag the arrivals without ever being reached)
        reach = finite & (batch + 3 * np.sqrt(np.maximum(batch, 0.0)) >= c - 1)
        keeps_up = finite & (lam * full < c)
        stable = keeps_up | (finite & ~reach)
        # only loads whose full-batch occupancy could reach the cap need the sum over states
        rho_full = np.where(finite, lam * full / c, 0.0)
        # (a product-form bound; where prompts stall the decodes, the batches' dispersion z = 1 / (1 - rho_x)^2
        # makes c slots behave like c / z of them, as in Hayward's approximation for peaked traffic)
        z = 1 / np.maximum(1 - np.where(stall > STALL_BATCH_MIN, np.minimum(stall, 0.95), 0.0), 0.05) ** 2
        live = keeps_up & (rho_full ** (np.sqrt(2 * (c / z + 1)) - 1) > 1e-7)
        pw = np.zeros_like(lam)
        gap = np.where(keeps_up, c / np.where(finite, full, 1.0) - lam, np.inf)  # unreached: no wait
        factor = f.slot_wait_factor({"c_a2": ca2, "c_s2": cs2, "lambda": lam, "E_S": np.where(finite, full, 1.0),
                                     "c_srv": c})
        theta = np.where(stable, factor / np.maximum(gap, 1e-300), np.inf)
        fixed = np.ones_like(pw)
        if live.any():
            pw[live] = _slot_wait_probability(lam[live], batch[live], c[live], hold[live], slope[live], full[live],
                                              stall[live])
            fixed[live] = 1 - (1 - np.clip(cs2[live], 0.0, 1.0)) * (1 - delay_probability_ratio(rho_full[live], c[live]))
        # the chain's departures are exponential; holds of a fixed output length are nearly constant, which makes a
        # request less likely to find the slots taken (M/D/c against M/M/c: ``mdc``), in proportion to 1 - c_s^2
        # as Cosmetatos' mean; the mean wait stays the factor's, so a wait, given one, is that much longer
        # (only on the live entries, where the chain is solved: elsewhere the delay probability is 0, and a wait's
        # length is never read. Where stalls batch the arrivals the chain behaves like c / z slots; the ratio is
        # read at the c slots there are: 0.936 at 256 slots and rho 0.475, where 7.4 slots would give 0.952)
        pw = pw * fixed
        theta = theta / fixed
        pw = np.where(finite & ~stable, 1.0, pw)
        wq = np.where(stable, pw * theta, np.inf)
        load = np.where(reach, lam * full / c, 0.0)  # unreached (or a hold not finite): other loads bind
        return cls(wq.reshape(shape), pw.reshape(shape), theta.reshape(shape), load.reshape(shape), np.ones(shape))


STALL_BATCH_MIN = 1e-3
"""Stall share below which a slot's arrivals are taken as single (the product form)."""


def _slot_wait_probability(lam, batch, c, hold, slope, full, stall=None) -> np.ndarray:
    """P(all slots taken) of ``SlotQueue`` for 1-d arrays of entries: the product form, or where prompts
    stall the decodes (``stall``, rho_x > ``STALL_BATCH_MIN``) the chain with their arrivals in batches
    (``_batched_slot_wait_probability``)."""
    rows = np.zeros(lam.shape, dtype=bool) if stall is None else stall > STALL_BATCH_MIN
    out = np.empty_like(lam)
    # both forms run over states 1 ... max(c) for every entry at once: entries of similar slot counts together
    # (within a factor of 2), so one pool with thousands of slots does not widen every other pool's states in a
    # stacked analysis (``PoolRows``)
    size = np.floor(np.log2(np.maximum(c, 1.0)))
    for b in np.unique(size):
        plain, e = ~rows & (size == b), rows & (size == b)
        if plain.any():
            out[plain] = _product_form_wait_probability(lam[plain], batch[plain], c[plain], hold[plain],
                                                        slope[plain], full[plain])
        if e.any():
            out[e] = _batched_slot_wait_probability(lam[e], batch[e], c[e], hold[e], slope[e], full[e],
                                                    np.minimum(stall[e], 0.95))
    return out


def _batched_slot_wait_probability(lam, batch, c, hold, slope, full, rho) -> np.ndarray:
    """P(all slots taken) when the requests reach the slots in batches: those that arrive while the decodes
    stall for earlier prompts (share rho of the time) find the batch where the stall left it and take their
    slots together once it ends, so the batch jumps by the prompts of one stall busy period, taken as
    geometric, P(n) = (1 - q) q^(n - 1), with the Borel's index of dispersion (``stall_batch_q``), at
    lambda (1 - q) batches a second. Below the cap the batch is then overdispersed (the simulated one by
    1 / (1 - rho)^2 with fixed holds; this chain, whose departures are exponential, by (1 + 1 / (1 - rho)^2)
    / 2), which the product form, with the stalls only as a mean stretch of the hold, misses: against the
    simulation (Qwen3-30B-A3B, 6,000-token prompts, 13 slots, rho 0.16-0.23) the share of requests that
    wait more than 0.2 s for a slot was 0.023 / 0.079 / 0.188 / 0.435 at utilisation 0.6-0.9, the product
    form's 0.008 / 0.041 / 0.153 / 0.413, this chain's 0.013 / 0.059 / 0.191 / 0.467.

    Level crossing (one departure at a time, batches up): the rate down through the cut between n and
    n + 1 equals the rate up through it, pi(n + 1) mu(n + 1) = a(n) + lambda pi(n) [n >= m], with mu(k) =
    min(k, m) / hold(k) and a(n) = lambda (1 - q) sum_{j <= n, j < m} pi(j) q^(n - j) the batches that
    cross it. A full batch (n >= m) admits no one, so no stall groups the queue's arrivals (single,
    Poisson). Below the cap a(n) = a(n - 1) (q + lambda (1 - q) / mu(n)), a product like the product
    form's; beyond it the queue's mass sums to a(m - 1) / ((1 - q) mu_full (1 - r)), r = lambda hold_full /
    m. At q = 0 it is the product form. A fractional c interpolates between its two neighbouring integers.

    Two simplifications that would each raise the result, and which together overshoot: P_w is the time
    average P(N >= m), while the members of a batch that overflows the cap wait as well (the requests'
    average is 4-11% higher on the long-prompt grid); and the chain's departures are exponential, so its
    batch's dispersion is (1 + E[n^2]/E[n]) / 2, where the fixed holds of a fixed output length keep
    E[n^2]/E[n] = 1/(1 - rho)^2 (measured: 1.67 against 1.61 at rho 0.21). With both, the share waiting more
    than 0.2 s on the grid is 0.030 / 0.103 / 0.261 / 0.527 against 0.023 / 0.079 / 0.188 / 0.435 simulated
    (30-40% high everywhere), against -35% ... +7% as it is. What the chain leaves out that offsets them (the
    KV a batch's prompts reserve one by one as their prefills start, their holds' spread) is not measured yet."""
    q = f.stall_batch_q(rho_x=rho)
    lam_b = lam * (1 - q)
    m_lo = np.floor(c)
    rows = np.arange(lam.size)
    # one chain, the larger count's (m_lo + 1): below a cap the states hold at the linear hold whichever the cap,
    # so the smaller count's chain is its states below m_lo, which this one shares
    m_hi = m_lo + 1
    k = np.arange(1.0, float(m_hi.max()) + 1.0)  # states 1 ... max(m)
    # (entries x states) arrays, computed in place: the same operations in the same order as written out
    beyond = k[None, :] >= m_hi[:, None]
    hold_k = np.subtract((k - 1)[None, :], batch[:, None])
    hold_k *= slope[:, None]
    hold_k += hold[:, None]
    np.clip(hold_k, 1e-12, full[:, None], out=hold_k)  # the linear hold, at the full batch's from the cap on
    np.copyto(hold_k, full[:, None], where=beyond)
    mu = np.minimum(k[None, :], m_hi[:, None])
    mu /= hold_k
    # log a(n), n = 0 ... max(m) - 1
    log_a = np.empty(mu.shape)
    log_a[:, 0] = 0.0
    steps = np.divide(lam_b[:, None], mu[:, :-1], out=log_a[:, 1:])
    steps += q[:, None]
    np.log(steps, out=steps)
    np.cumsum(steps, axis=1, out=steps)
    log_a += np.log(lam_b)[:, None]
    log_pi = np.log(mu, out=mu)
    np.subtract(log_a, log_pi, out=log_pi)  # pi(1 ... max(m)), unnormalised (pi(0) = 1)
    out = []
    work = np.empty(log_pi.shape)
    for m in (m_lo, m_hi):
        above_cap = k[None, :] >= m[:, None]
        top = log_a[rows, m.astype(int) - 1]  # the queue beyond the cap starts from a(m - 1)
        np.copyto(work, log_pi)
        np.copyto(work, -np.inf, where=above_cap)
        shift = np.maximum(np.maximum(work.max(axis=1), top), 0.0)  # no overflow
        np.subtract(log_pi, shift[:, None], out=work)
        with np.errstate(over="ignore"):  # states beyond the cap, which are not summed
            np.exp(work, out=work)
        np.copyto(work, 0.0, where=above_cap)
        below = np.exp(-shift) + work.sum(axis=1)
        r = lam * full / m
        queue = np.exp(top - shift) * full / (m * (1 - q) * np.maximum(1 - r, 1e-300))
        out.append(np.where(r < 1, queue / (below + queue), 1.0))
    frac = c - m_lo
    return (1 - frac) * out[0] + frac * out[1]


def _product_form_wait_probability(lam, batch, c, hold, slope, full) -> np.ndarray:
    """P(all slots taken) of ``SlotQueue``'s product form for 1-d arrays of entries (vectorised over the
    states)."""
    m_lo = np.floor(c)
    frac = c - m_lo
    k = np.arange(1.0, float(m_lo.max()) + 2.0)  # states 1 ... max(m_lo) + 1
    hold_k = np.clip(hold[:, None] + slope[:, None] * (k[None, :] - 1 - batch[:, None]), 1e-12, full[:, None])
    log_pi = np.concatenate([np.zeros((lam.size, 1)), np.cumsum(np.log(lam[:, None] * hold_k / k[None, :]), axis=1)],
                            axis=1)  # log pi(0 ... max + 1), unnormalised, at the linear holds
    shift = log_pi.max(axis=1, keepdims=True)
    prefix = np.cumsum(np.exp(log_pi - shift), axis=1)  # prefix[:, j] = sum of pi(0 ... j)
    out = []
    for m in (m_lo, m_lo + 1):
        j = m.astype(int)
        rows = np.arange(lam.size)
        # the m-th slot is taken at the full-batch hold, and so is every queued state
        log_pm = log_pi[rows, j - 1] + np.log(lam * full / m) - shift[:, 0]
        r = lam * full / m
        tail = np.exp(log_pm) / np.maximum(1 - r, 1e-300)
        below = prefix[rows, j - 1]
        out.append(np.where(r < 1, tail / (below + tail), 1.0))
    return (1 - frac) * out[0] + frac * out[1]


BISECTION_STEPS = 10
"""Bisection steps for a wait quantile within its bracket (to 1/1024 of it), before the secant
through the last bracket (``decreasing_root``)."""


def decreasing_root(g, lo, hi, steps: int = BISECTION_STEPS) -> np.ndarray:
    """x in [lo, hi] (arrays) with g(x) = 0, for g decreasing with g(lo) > 0 >= g(hi): ``steps``
    bisections, then the secant through g at the final bracket's ends. Where g is smooth in the
    bracket the secant leaves an error of the order of the bracket squared; at a kink or a jump, at
    most the bracket, 2^-steps of the first."""
    lo, hi = np.broadcast_arrays(np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))
    for _ in range(steps):
        x = (lo + hi) / 2
        above = g(x) > 0
        lo, hi = np.where(above, x, lo), np.where(above, hi, x)
    g_lo, g_hi = g(lo), g(hi)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = g_lo / (g_lo - g_hi)
    share = np.where(np.isfinite(share), np.clip(share, 0.0, 1.0), 0.5)
    return lo + share * (hi - lo)


ATTAINMENT_LEVELS = np.array([0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999])
"""Percentile levels at which the TTFT distribution is tabulated for joint attainment."""


@dataclass(frozen=True)
class ModeArrays:
    """What a mode computes for an array of arrival rates (per queue it models)."""

    stable: np.ndarray
    utilisation: np.ndarray
    ttft_mean_s: np.ndarray
    ttft_p_s: np.ndarray
    tpot_mean_s: np.ndarray
    tpot_p_s: np.ndarray
    batch: np.ndarray
    kv_transfer_s: np.ndarray
    binding: np.ndarray  # which resource limits: text per rate
    tpot_var_s2: np.ndarray  # variance of a request's TPOT (lognormal)
    itl_p_s: np.ndarray  # p-quantile of every inter-token gap
    ttft_levels_s: np.ndarray | None = None  # TTFT at ATTAINMENT_LEVELS (levels x rates), joint SLOs only
    tpot_full_s: np.ndarray | None = None  # TPOT beside a full batch, of the requests that waited for a slot
    tpot_full_share: np.ndarray | None = None  # their share (``full_batch_tpot_quantile``; None: none)

    def rows(self, index) -> ModeArrays:
        """The arrays of rows ``index`` (first axis) of a stacked analysis (an int: one row's, as alone)."""
        return ModeArrays(*(None if x is None else np.asarray(x)[index] for x in self.__dict__.values()))

    def margin(self, slo: SLO) -> np.ndarray:
        """How far inside the SLO each rate is: the smallest of 1 - metric / target over the SLO's
        metrics and 1 - utilisation (negative outside; -inf where unstable). A capacity search
        interpolates its zero between two grid rates."""
        with np.errstate(all="ignore"):
            parts = [1 - self.utilisation, 1 - self.ttft_p_s / slo.ttft_s]
            if slo.itl_s is not None:
                parts.append(1 - self.itl_p_s / slo.itl_s)
            if slo.attainment == "joint":
                parts.append(self.attainment(slo) - slo.p)
            else:
                parts.append(1 - self.tpot_p_s / slo.tpot_s)
            m = np.min(np.stack(np.broadcast_arrays(*parts)), axis=0)
        return np.where(self.stable & np.isfinite(m), m, -np.inf)

    def meets(self, slo: SLO) -> np.ndarray:
        ok = self.stable & (self.ttft_p_s <= slo.ttft_s)
        if slo.itl_s is not None:
            ok = ok & (self.itl_p_s <= slo.itl_s)
        if slo.attainment == "joint":
            return ok & (self.attainment(slo) >= slo.p)
        return ok & (self.tpot_p_s <= slo.tpot_s)

    def attainment(self, slo: SLO) -> np.ndarray:
        """Share of requests that meet both the TTFT and the TPOT target (independence assumed, which
        under-counts: both grow with the same load)."""
        if self.ttft_levels_s is None:
            raise ValueError("joint attainment needs the TTFT levels (analyse with joint=True)")
        levels = np.concatenate([[0.0], ATTAINMENT_LEVELS])
        # P(TTFT <= a): the highest tabulated level whose TTFT is within the target (TTFT grows with the level)
        p_ttft = levels[np.sum(self.ttft_levels_s <= slo.ttft_s, axis=-2)]
        if self.tpot_full_share is None:
            p_tpot = lognormal_cdf(self.tpot_mean_s, self.tpot_var_s2, slo.tpot_s)
        else:
            p_tpot = full_batch_tpot_cdf(self.tpot_mean_s, self.tpot_var_s2, self.tpot_full_s, self.tpot_full_share,
                                         slo.tpot_s)
        return np.where(self.stable, p_ttft * p_tpot, 0.0)


class _Derived:
    """A value derived from what a model's fields were computed from (``Evaluation``'s analysis table), which
    equality ignores: two evaluations are equal where their fields are."""

    __slots__ = ("value",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Derived)


class Evaluation(BaseModel):
    """One deployment under one workload: latency statistics, utilisation and goodput."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, serialize_by_alias=True)

    mode: Mode
    stable: bool
    reason: str | None = None
    utilisation: float | None = Field(description="the binding resource's load, 1 = saturated")
    engine: str = Field(default="generic", description="the engine profile whose efficiencies the pools used "
                        "(generic: the GPU entries' own; calibration: the user's fit)")
    binding: str | None = Field(default=None, description="the resource that binds: prefill interference (mixed), "
                                "prefill chunks, decode bandwidth, batch cap, KV memory, prefill pool (disaggregated)")
    ttft_mean_s: float | None
    tpot_mean_s: float | None
    kv_transfer_s: float | None = Field(description="disaggregated: KV move per request (visible part)")
    decode_batch: float | None = Field(description="mean sequences decoding at once per instance (all streams of a "
                                        "pipelined one)")
    goodput_rps: float | None = Field(description="largest arrival rate whose SLO is met at the percentile")
    num_gpus: int
    ttft_by_percentile_s: dict[int, float] = Field(default_factory=dict)
    tpot_by_percentile_s: dict[int, float] = Field(default_factory=dict)
    itl_by_percentile_s: dict[int, float] = Field(
        default_factory=dict, description="inter-token latency: every gap between two output tokens, pooled")
    attainment_share: float | None = Field(
        default=None, alias="attainment",
        description="with an SLO: share of requests meeting TTFT and TPOT together (joint)")
    _joint: _Derived | None = PrivateAttr(default=None)  # the analysis that ``attainment(slo)`` reads

    def attainment(self, slo: SLO | Any = None) -> float:
        """Share of requests that meet both ``slo``'s TTFT and TPOT targets (joint attainment; its percentile
        does not enter): P(TTFT <= ttft_s) P(TPOT <= tpot_s) over the TTFT quantile table and the TPOT
        distribution (``ModeArrays.attainment``), 0 where the rate overloads the deployment. Without ``slo``,
        the share for the SLO the evaluation was asked with (``attainment_share``, serialised as
        ``attainment``)."""
        from ..arguments import as_model

        if slo is None:
            if self.attainment_share is None:
                raise InputError("slo", "this evaluation had no SLO: pass one (attainment(slo))")
            return self.attainment_share
        slo = as_model("slo", slo, SLO)
        if not self.stable:
            return 0.0
        if self._joint is None:
            raise InputError("slo", "this evaluation was not built by evaluate (no TTFT table to read)")
        return float(self._joint.value.attainment(slo)[0])

    def with_joint(self, joint: ModeArrays) -> Evaluation:
        """The evaluation with the one-rate analysis that ``attainment(slo)`` reads (``evaluate`` sets it)."""
        self._joint = _Derived(joint)
        return self

    def ttft_s(self, p: float = 90) -> float:
        return self._at(self.ttft_by_percentile_s, p, "ttft")

    def tpot_s(self, p: float = 90) -> float:
        return self._at(self.tpot_by_percentile_s, p, "tpot")

    def itl_s(self, p: float = 90) -> float:
        return self._at(self.itl_by_percentile_s, p, "itl")

    def _at(self, table: dict[int, float], p: float, name: str) -> float:
        """The percentile ``p`` (one of PERCENTILES); ``UnstableError`` when the rate overloads the deployment."""
        if not self.stable:
            raise UnstableError(name, f"the deployment is unstable at this rate ({self.reason})")
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not math.isfinite(p):
            raise InputError("p", f"a percentile is a number, got {p!r}")
        key = int(round(p))
        if key not in table:
            raise InputError("p", f"percentile {p} not computed; available: {sorted(table)}")
        return table[key]


PERCENTILES = (50, 90, 95, 99)


def rate_grid(upper: float, n: int = 96) -> np.ndarray:
    """Geometric grid of arrival rates up to ``upper`` (for goodput and capacity searches)."""
    return np.geomspace(max(upper, 1e-6) * 1e-3, max(upper, 1e-6), n)


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
