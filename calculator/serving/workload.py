"""Traffic and latency targets: Poisson arrivals, length distributions, SLO percentiles."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..limits import MAX_SAMPLES

QUADRATURE_POINTS = 16


class Length(BaseModel):
    """A token-length distribution: fixed, (mean, coefficient of variation) or empirical samples."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mean: float = Field(ge=1, le=10_000_000, description="mean tokens")
    cv: float = Field(default=0.0, ge=0, le=10, description="coefficient of variation (std / mean)")
    samples: tuple[Annotated[int, Field(ge=1, le=10_000_000)], ...] | None = Field(
        default=None, min_length=3, max_length=MAX_SAMPLES, description="empirical lengths (mean and cv follow them)")

    @model_validator(mode="before")
    @classmethod
    def _coerce(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("a length must be a number, a (mean, cv) pair or a list of samples")
        if isinstance(v, (int, float)):
            return {"mean": v}
        if isinstance(v, dict) and v.get("samples") is not None:
            if not isinstance(v["samples"], (list, tuple)):
                raise ValueError("samples: give a list of token counts")
            if len(v["samples"]) < 3:
                raise ValueError("samples: give at least 3 samples")
            return cls._coerce(list(v["samples"]))
        if isinstance(v, (list, tuple)):
            if len(v) == 2:
                return {"mean": v[0], "cv": v[1]}
            if len(v) < 3:
                raise ValueError("give a number, a (mean, cv) pair, or at least 3 samples")
            if len(v) > MAX_SAMPLES:
                raise ValueError(f"samples: at most {MAX_SAMPLES} samples")
            if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 1 for x in v):
                raise ValueError("samples must be finite token counts >= 1")
            arr = np.asarray(v, dtype=float)
            return {"mean": float(arr.mean()), "cv": float(arr.std() / arr.mean()), "samples": tuple(int(x) for x in v)}
        return v

    @field_validator("mean")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Values and weights that integrate over the distribution (lognormal for (mean, cv))."""
        if self.samples is not None:
            vals, counts = np.unique(np.asarray(self.samples, dtype=float), return_counts=True)
            return vals, counts / counts.sum()
        if self.cv == 0:
            return np.array([self.mean]), np.array([1.0])
        probs = (np.arange(QUADRATURE_POINTS) + 0.5) / QUADRATURE_POINTS
        return self._lognormal_quantile(probs), np.full(QUADRATURE_POINTS, 1 / QUADRATURE_POINTS)

    def quantile(self, p: float) -> float:
        if self.samples is not None:
            return float(np.quantile(np.asarray(self.samples, dtype=float), p))
        if self.cv == 0:
            return self.mean
        return float(self._lognormal_quantile(np.array([p]))[0])

    def _lognormal_quantile(self, probs: np.ndarray) -> np.ndarray:
        sigma2 = math.log(1 + self.cv**2)
        mu = math.log(self.mean) - sigma2 / 2
        z = np.array([NormalDist().inv_cdf(float(q)) for q in probs])
        return np.maximum(1.0, np.round(np.exp(mu + math.sqrt(sigma2) * z)))

    @property
    def max(self) -> float:
        return float(max(self.samples)) if self.samples is not None else self.quantile(0.999)


class Workload(BaseModel):
    """Poisson arrivals at ``rate`` requests/s with prompt (isl) and output (osl) length distributions."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rate: float = Field(ge=1e-6, le=1e6, description="requests per second (Poisson)")
    isl: Length = Field(description="prompt tokens: a number, [mean, cv], or a list of samples")
    osl: Length = Field(description="output tokens: a number, [mean, cv], or a list of samples")
    prefix_hit: float = Field(default=0.0, ge=0, lt=1, description="fraction of the prompt served from the prefix cache")

    @field_validator("rate", "prefix_hit")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class SLO(BaseModel):
    """Latency targets met at a percentile of requests."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ttft_s: float = Field(gt=0, le=3600)
    tpot_s: float = Field(gt=0, le=60)
    percentile: float = Field(default=90, ge=50, le=99.9)

    @field_validator("ttft_s", "tpot_s", "percentile")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    @property
    def p(self) -> float:
        return self.percentile / 100
