"""Traffic and latency targets: Poisson arrivals, length distributions, SLO percentiles."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from .. import formulas as f
from ..limits import MAX_SAMPLES, MAX_TOKENS

QUADRATURE_POINTS = 16
MAX_ARRIVAL_CV = 10.0
"""Bound on the arrivals' coefficient of variation (BurstGPT's and the Azure traces' are 1-5)."""
MAX_GIVEN_CV = 10.0
"""Bound on a coefficient of variation given with a mean (one derived from samples is not bounded)."""


def _not_bool(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        # pydantic reports a ValueError under the field's name (a TypeError would escape it)
        raise ValueError("must be a number, not a bool")  # noqa: TRY004
    return v


Number = Annotated[float, BeforeValidator(_not_bool)]
Count = Annotated[int, BeforeValidator(_not_bool)]
Sample = Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)]  # strict: no bools, no floats
_LENGTH_FORMS = "a number of tokens, {'mean': m, 'cv': c}, {'samples': [...]} or a list of samples"


def _sample_array(v: Any) -> np.ndarray | None:
    """The samples as an integer array when every one is a valid token count (vectorised), else None
    (the ``samples`` field then reports the first bad one by index)."""
    if not isinstance(v, (list, tuple, np.ndarray)) or not 1 <= len(v) <= MAX_SAMPLES:
        return None
    if not isinstance(v, np.ndarray) and any(isinstance(x, (bool, np.bool_)) for x in v):
        return None  # numpy would read True as 1
    try:
        arr = np.asarray(v)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.min() < 1 or arr.max() > MAX_TOKENS:
        return None
    return arr


class Length(BaseModel):
    """A token-length distribution, in one of three explicit forms: a number (every request that
    long), ``{"mean": m, "cv": c}`` (lognormal with that mean and coefficient of variation, cv ≤ 10)
    or ``{"samples": [...]}`` (empirical; a bare list is samples too, of any length ≥ 1). With
    samples, ``mean`` and ``cv`` follow them (a dump carries all three and validates back)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mean: Number = Field(ge=1, le=MAX_TOKENS, description="mean tokens (with samples: their mean)")
    cv: Number = Field(default=0.0, ge=0, description=f"coefficient of variation (std / mean), ≤ {MAX_GIVEN_CV:g} "
                                                         "when given; with samples: theirs (unbounded)")
    samples: tuple[Sample, ...] | None = Field(
        default=None, min_length=1, max_length=MAX_SAMPLES,
        description=f"empirical lengths, integers in 1 ... {MAX_TOKENS:,}; mean and cv follow them")

    @model_validator(mode="before")
    @classmethod
    def _forms(cls, v: Any) -> Any:
        if isinstance(v, (bool, np.bool_, str, bytes)):
            raise ValueError(f"a length is {_LENGTH_FORMS}; got {v!r}")  # noqa: TRY004 (see _not_bool)
        if isinstance(v, (int, float, np.integer, np.floating)):
            return {"mean": v}
        if isinstance(v, (list, tuple, np.ndarray)):
            v = {"samples": v}
        if not isinstance(v, dict):
            return v
        if v.get("samples") is None:
            cv = v.get("cv")
            if isinstance(cv, (int, float)) and not isinstance(cv, bool) and cv > MAX_GIVEN_CV:
                raise ValueError(f"cv: a given cv must be ≤ {MAX_GIVEN_CV:g}, got {cv:g}")
            return v
        arr = _sample_array(v["samples"])
        if arr is None:
            if isinstance(v["samples"], np.ndarray):
                raise ValueError(f"samples: an array of integer token counts in 1 ... {MAX_TOKENS:,} "
                                 f"(at most {MAX_SAMPLES:,}), got a {v['samples'].dtype} array of shape "
                                 f"{v['samples'].shape}")
            bad = v["samples"]  # the samples field then says what is wrong with them (a tuple: strict mode)
            return {**v, "mean": 1.0, "cv": 0.0, "samples": tuple(bad) if isinstance(bad, list) else bad}
        tokens = arr.astype(float)
        mean = float(tokens.mean())
        derived = {"mean": mean, "cv": float(tokens.std() / mean)}
        for name, value in derived.items():
            given = v.get(name)
            if given is not None and not (isinstance(given, (int, float)) and not isinstance(given, bool)
                                          and math.isclose(given, value, rel_tol=1e-9, abs_tol=1e-12)):
                raise ValueError(f"{name}: follows the samples ({value:g}); give samples, or mean and cv, not both")
        return {**v, **derived, "samples": tuple(arr.tolist())}

    @property
    def longest_tokens(self) -> float:
        """What the context window must hold for this length: the longest sample, else the mean."""
        return float(max(self.samples)) if self.samples is not None else self.mean

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

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths >= 1 drawn from the distribution (samples: with replacement)."""
        if self.samples is not None:
            return rng.choice(np.asarray(self.samples, dtype=np.int64), n)
        if self.cv == 0:
            return np.full(n, max(1, round(self.mean)), dtype=np.int64)
        sigma2 = math.log(1 + self.cv**2)
        draws = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), n)
        return np.maximum(1, np.round(draws)).astype(np.int64)

    @property
    def max(self) -> float:
        return float(max(self.samples)) if self.samples is not None else self.quantile(0.999)


class Workload(BaseModel):
    """Arrivals at ``rate`` requests/s (Poisson, or burstier with ``arrival_cv`` > 1) with prompt (isl) and output
    (osl) length distributions."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rate: Number = Field(ge=1e-6, le=1e6, description="requests per second (Poisson)")
    isl: Length = Field(description="prompt tokens: a number, {mean, cv}, {samples} or a list of samples")
    osl: Length = Field(description="output tokens: a number, {mean, cv}, {samples} or a list of samples")
    prefix_hit: Number = Field(default=0.0, ge=0, lt=1, description="fraction of the prompt served from the prefix cache")
    arrival_cv: Number = Field(default=1.0, ge=0, le=MAX_ARRIVAL_CV, description="coefficient of variation of the "
                               "inter-arrival times: 1 is Poisson, above 1 bursty (Gamma inter-arrivals), 0 evenly spaced")

    @classmethod
    def from_trace(cls, path: Any, format: str = "auto", window: tuple[float, float] | None = None,
                   cache_tokens: int | None = None, rate_scale: float = 1.0) -> Workload:
        """The workload of a request trace (Azure, Mooncake, BurstGPT or ``timestamp_s,isl,osl`` CSV): its mean
        rate (times ``rate_scale``), its lengths as samples, its burstiness and, for traces with block hashes,
        the prefix-hit ratio of a cache of ``cache_tokens`` (``calculator.traces``)."""
        from ..traces import workload_from_trace

        return workload_from_trace(path, format, window, cache_tokens, rate_scale)[0]  # type: ignore[arg-type]

    @field_validator("rate", "prefix_hit", "arrival_cv")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class SLO(BaseModel):
    """Latency targets met at a percentile.

    TTFT is arrival to first token; TPOT is one request's mean gap between its output tokens
    ((last - first token) / (osl - 1)); ITL is every single gap, pooled over all tokens. With
    ``attainment="per_metric"`` the p-th percentile of TTFT and of TPOT must each be within target;
    with ``"joint"`` (DistServe's SLO attainment) at least p% of requests must meet both at once.
    ``itl_s``, when given, bounds the p-th percentile of ITL as well (what a streaming reader sees:
    in mixed serving a prompt's step is one long gap).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ttft_s: Number = Field(gt=0, le=3600, description="time to first token target, s")
    tpot_s: Number = Field(gt=0, le=60, description="time per output token target (a request's mean gap), s")
    percentile: Number = Field(default=90, ge=50, le=99.9)
    itl_s: Number | None = Field(default=None, gt=0, le=60, description="inter-token latency target (every gap), s")
    attainment: Literal["per_metric", "joint"] = Field(
        default="per_metric", description="per_metric: each percentile within target; joint: p% of requests meet both")

    @field_validator("ttft_s", "tpot_s", "percentile", "itl_s")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    @property
    def p(self) -> float:
        return self.percentile / 100


def running_context(w: Workload) -> float:
    """Mean context of a decoding sequence at a random step, tokens (``running_context``): the prompt and
    the output so far, length-biased, since a long output stays in the batch for more steps. With outputs
    of cv 0.5 a running sequence has emitted 1.25 x osl / 2 tokens, not osl / 2."""
    return float(f.running_context(n_in=w.isl.mean, n_out=w.osl.mean, cv2_osl=w.osl.cv**2))
