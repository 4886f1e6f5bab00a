"""Shared pieces of the serving model: deployment specs, a pool's step-time functions, results.

Each mode module (mixed, chunked, disaggregated) turns a deployment, a workload and an array of
arrival rates into a ``ModeArrays`` of TTFT/TPOT statistics; ``evaluate`` and the optimizer only
read those arrays. All step times come from ``calculator.phases`` (the same roofline as
``estimate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_db.loader import load_gpu
from hardware_db.schema import GPUSpec, KVDtype, ModelSpec, WeightDtype

from .. import formulas as f
from ..estimate import memory_breakdown
from ..kv_cache import kv_bytes_per_gpu
from ..phases import Setup, step_groups, step_time_s
from .workload import SLO, Workload

Mode = Literal["mixed", "chunked", "disaggregated"]
DEFAULT_BATCH_CAP = 512
FIXED_POINT_ITERATIONS = 60


class Pool(BaseModel):
    """Identical instances of one GPU type, each spanning tp x pp GPUs."""

    model_config = ConfigDict(frozen=True)

    gpu: str = Field(min_length=1, max_length=64)
    tp: int = Field(default=1, ge=1, le=64)
    pp: int = Field(default=1, ge=1, le=64)
    instances: int = Field(default=1, ge=1, le=10_000)
    max_batch: int = Field(default=DEFAULT_BATCH_CAP, ge=1, le=16_384, description="engine cap on concurrent sequences")
    weight_dtype: WeightDtype = "bf16"
    kv_dtype: KVDtype = "bf16"

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.instances


class Deployment(BaseModel):
    """How a model is served: one pool (mixed, chunked) or a prefill and a decode pool (disaggregated)."""

    model_config = ConfigDict(frozen=True)

    mode: Mode
    pool: Pool | None = Field(default=None, description="mixed / chunked: the one pool")
    prefill: Pool | None = Field(default=None, description="disaggregated: the prefill pool")
    decode: Pool | None = Field(default=None, description="disaggregated: the decode pool")
    chunk_tokens: int = Field(default=2048, ge=64, le=65_536, description="chunked: token budget per iteration")
    kv_link: Literal["scaleout", "scaleup"] = Field(
        default="scaleout", description="disaggregated: NIC between nodes, or the scale-up link inside one node")
    layerwise_kv_overlap: bool = Field(default=False, description="disaggregated: send each layer's KV as it is computed")

    @model_validator(mode="after")
    def _pools(self) -> Deployment:
        if self.mode == "disaggregated":
            if self.prefill is None or self.decode is None or self.pool is not None:
                raise ValueError("disaggregated: give prefill and decode pools (and no pool)")
        elif self.pool is None or self.prefill is not None or self.decode is not None:
            raise ValueError(f"{self.mode}: give one pool (and no prefill/decode pools)")
        return self

    @property
    def pools(self) -> tuple[Pool, ...]:
        return (self.pool,) if self.pool is not None else (self.prefill, self.decode)  # type: ignore[return-value]

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)


@dataclass(frozen=True)
class PoolModel:
    """Step-time functions of one instance of a pool for one model (vectorised over numpy arrays)."""

    setup: Setup
    pool: Pool
    gpu: GPUSpec
    kv_capacity_tokens: float  # KV tokens one instance can hold
    fits: bool
    reason: str | None

    @classmethod
    def build(cls, model: ModelSpec, pool: Pool, workload: Workload, gpu: GPUSpec | None = None) -> PoolModel:
        g = gpu or load_gpu(pool.gpu)
        setup = Setup(model, g, tp=pool.tp, pp=pool.pp, weight_dtype=pool.weight_dtype, kv_dtype=pool.kv_dtype)
        seq = int(workload.isl.mean + workload.osl.mean)
        mem = memory_breakdown(setup, seq, 0, 1)
        per_token = float(kv_bytes_per_gpu(model, 1.0, pool.kv_dtype, tp=pool.tp, pp=pool.pp))
        capacity = max(0.0, mem.kv_budget_bytes) / per_token
        fits = mem.kv_budget_bytes > float(kv_bytes_per_gpu(model, seq, pool.kv_dtype, tp=pool.tp, pp=pool.pp))
        reason = None if fits else (
            f"{model.id} does not fit on {g.id} at tp={pool.tp} pp={pool.pp} ({pool.weight_dtype}): "
            f"{(mem.weights_bytes + mem.activation_workspace_bytes + mem.runtime_reserve_bytes) / 1e9:.1f} GB per GPU "
            f"before KV, {mem.usable_bytes / 1e9:.1f} GB usable")
        return cls(setup, pool, g, capacity, fits, reason)

    def prefill_s(self, new_tokens, cached_tokens=0.0) -> np.ndarray:
        return step_time_s(step_groups(self.setup, S=new_tokens, P=cached_tokens, b=1, phase="prefill"), self.setup)

    def decode_s(self, batch, context) -> np.ndarray:
        b = np.maximum(np.asarray(batch, dtype=float), 1.0)
        return step_time_s(step_groups(self.setup, S=1, P=np.asarray(context) - 1, b=b, phase="decode"), self.setup)

    def hybrid_s(self, batch, context, chunk_tokens, chunk_prefix) -> np.ndarray:
        b = np.maximum(np.asarray(batch, dtype=float), 1.0)
        groups = step_groups(self.setup, S=1, P=np.asarray(context) - 1, b=b, phase="decode",
                             chunk=(chunk_tokens, chunk_prefix))
        return step_time_s(groups, self.setup)

    def batch_limit(self, workload: Workload) -> float:
        """Concurrent sequences: the engine cap, and the KV tokens at the mean sequence's midpoint."""
        mean_resident = workload.isl.mean + workload.osl.mean / 2
        return float(min(self.pool.max_batch, self.kv_capacity_tokens / mean_resident))


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
    def of(cls, pm: PoolModel, workload: Workload, p: float) -> PrefillService:
        vals, w = workload.isl.points()
        cached = np.round(vals * workload.prefix_hit)
        t = pm.prefill_s(vals - cached, cached)
        q_isl = workload.isl.quantile(p)
        q_cached = round(q_isl * workload.prefix_hit)
        return cls(float(np.sum(w * t)), float(np.sum(w * t**2)), float(pm.prefill_s(q_isl - q_cached, q_cached)))


def z_score(p: float) -> float:
    return NormalDist().inv_cdf(p)


def queue_wait(rate, service: PrefillService, servers, p: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean wait, p-quantile of the wait) of an M/G/c queue; inf when rho >= 1."""
    rate = np.asarray(rate, dtype=float)
    args = {"lambda": rate, "E_S": service.mean_s, "c_s2": service.cs2, "c_srv": servers}
    rho = f.server_utilisation(args)
    wq = np.where(rho < 1, f.mean_queue_wait(args), np.inf)
    pw = f.wait_probability(args)
    wp = np.where(rho < 1, f.wait_percentile(W_q=np.where(rho < 1, wq, 0), P_w=np.maximum(pw, 1e-300), p=p), np.inf)
    return wq, wp


def decode_fixed_point(step_s, rate, osl_mean: float, inflation, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """Solve B = rate * osl * TPOT(B), TPOT(B) = step_s(B) * inflation (Little's law), from below.

    The step time is convex and increasing in B, so the iteration rises monotonically to the least
    fixed point when one exists; it is declared unstable when B passes ``limit``.
    """
    rate = np.asarray(rate, dtype=float)
    b = np.ones_like(rate)
    for _ in range(FIXED_POINT_ITERATIONS):
        tpot = step_s(np.minimum(b, limit)) * inflation
        b_new = np.asarray(f.littles_law_batch({"lambda": rate, "n_out": osl_mean, "TPOT": tpot}), dtype=float)
        if np.allclose(b_new, b, rtol=1e-6, atol=1e-9):
            b = b_new
            break
        b = b_new
    tpot = step_s(np.minimum(b, limit)) * inflation
    converged = np.isclose(f.littles_law_batch({"lambda": rate, "n_out": osl_mean, "TPOT": tpot}), b, rtol=1e-3)
    stable = converged & (b <= limit)
    return b, np.where(stable, tpot, np.inf)


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

    def meets(self, slo: SLO) -> np.ndarray:
        return self.stable & (self.ttft_p_s <= slo.ttft_s) & (self.tpot_p_s <= slo.tpot_s)


class Evaluation(BaseModel):
    """One deployment under one workload: latency statistics, utilisation and goodput."""

    model_config = ConfigDict(frozen=True)

    mode: Mode
    stable: bool
    reason: str | None = None
    utilisation: float | None = Field(description="busiest resource's load (prefill or decode), 1 = saturated")
    ttft_mean_s: float | None
    tpot_mean_s: float | None
    kv_transfer_s: float | None = Field(description="disaggregated: KV move per request (visible part)")
    decode_batch: float | None = Field(description="mean sequences decoding at once per instance")
    goodput_rps: float | None = Field(description="largest arrival rate whose SLO is met at the percentile")
    num_gpus: int
    ttft_by_percentile_s: dict[int, float] = Field(default_factory=dict)
    tpot_by_percentile_s: dict[int, float] = Field(default_factory=dict)

    def ttft_s(self, p: float = 90) -> float:
        return self._at(self.ttft_by_percentile_s, p, "ttft")

    def tpot_s(self, p: float = 90) -> float:
        return self._at(self.tpot_by_percentile_s, p, "tpot")

    def _at(self, table: dict[int, float], p: float, name: str) -> float:
        if not self.stable:
            raise ValueError(f"{name}: the deployment is unstable at this rate ({self.reason})")
        key = int(round(p))
        if key not in table:
            raise ValueError(f"p: percentile {p} not computed; available: {sorted(table)}")
        return table[key]


PERCENTILES = (50, 90, 95, 99)


def rate_grid(upper: float, n: int = 96) -> np.ndarray:
    """Geometric grid of arrival rates up to ``upper`` (for goodput and capacity searches)."""
    return np.geomspace(max(upper, 1e-6) * 1e-3, max(upper, 1e-6), n)


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
