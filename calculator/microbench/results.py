"""Result records of the microbenchmark: frozen pydantic models the CLI, the API and the report share.

Nothing here needs torch: a saved ``points.json`` loads back with ``ValidationReport.model_validate_json``.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hardware_db.schema import Efficiency, GPUSpec, ModelSpec

Phase = Literal["prefill", "decode"]
Split = Literal["fit", "held_out"]


def _version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string; () where it has none (sorts before every version)."""
    parts = version.split(".")[:2]
    return tuple(int(x) for x in parts) if len(parts) == 2 and all(x.isdigit() for x in parts) else ()


def repeats_kv(attention: str, transformers_version: str) -> bool:
    """Whether decode steps run with ``attention`` repeat each KV head over its query heads: transformers' own sdpa
    before 5.23 (an unknown version counts as before)."""
    return attention == "sdpa" and _version_tuple(transformers_version) < (5, 23)


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class MatmulSample(_Out):
    """One square matmul ``n x n @ n x n`` timed on the device: 2 n^3 FLOP per call."""

    dtype: str
    n: int
    time_s: float = Field(description="median of the timed repeats")
    flops_per_s: float


class Ceilings(_Out):
    """The two roofline ceilings measured on the device, and what they were measured with."""

    device: Literal["cpu", "cuda"]
    device_name: str = Field(description="CPU model name from /proc/cpuinfo, or the CUDA device name")
    device_details: str = Field(default="", description="CPU count, cache and ISA flags; or the GPU's SMs")
    threads: int = Field(description="torch intra-op threads (CPU); 0 on CUDA")
    dtype: str = Field(description="precision the benchmark models run in (bf16, else fp16)")
    matmul: tuple[MatmulSample, ...]
    matmul_flops_per_s: float = Field(description="best achieved matmul rate in ``dtype`` over the sizes")
    copy_bytes: int = Field(description="size of the copied buffer; traffic counts it read and written")
    copy_time_s: float
    memory_bytes_per_s: float = Field(description="2 x copy_bytes / copy_time_s")
    memory_total_bytes: float = Field(description="RAM (CPU) or device memory (CUDA)")


def sweep_time_s(sweeps_s: tuple[tuple[float, ...], ...]) -> float:
    """A point's time: the median of its repeats in the least disturbed of the grid sweeps."""
    return min(statistics.median(s) for s in sweeps_s)


class Measurement(_Out):
    """One timed grid point before it is predicted (``Point`` adds the predictions)."""

    model: str
    phase: Phase
    batch: int
    tokens: int
    grid_index: tuple[int, int] = Field(description="(tokens index, batch index) in the model's grid")
    sweeps_s: tuple[tuple[float, ...], ...] = Field(description="the timed repeats of each sweep over the grid")

    @property
    def measured_s(self) -> float:
        return sweep_time_s(self.sweeps_s)


class Point(_Out):
    """One measured latency and what the closed-form model predicts for it.

    Prefill: ``batch`` prompts of ``tokens`` tokens, no prefix. Decode: one step of ``batch`` sequences
    that each hold ``tokens`` cached tokens before the step (estimate's first decode step of isl=tokens).
    """

    model: str
    phase: Phase
    batch: int
    tokens: int
    grid_index: tuple[int, int] = Field(description="(tokens index, batch index) in the model's grid")
    split: Split = Field(description="fit: used to fit the constants; held_out: only evaluated")
    measured_s: float = Field(description="median of the timed repeats, in the least disturbed sweep")
    sweeps_s: tuple[tuple[float, ...], ...] = Field(description="the timed repeats of each sweep over the grid")
    predicted_s: float = Field(description="calculator.estimate with the fitted calibration")
    ceiling_s: float = Field(description="calculator.estimate at the bare ceilings: efficiencies 1, no latencies")
    bound: str = Field(description="what bounds the calibrated prediction (estimate's phase bound)")

    @property
    def rel_error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_s / self.measured_s - 1.0

    @property
    def label(self) -> str:
        what = f"{self.tokens}-token prompt" if self.phase == "prefill" else f"step at context {self.tokens}"
        return f"{self.model} {self.phase} batch {self.batch}, {what}"


class KVCheck(_Out):
    """KV bytes a transformers cache object holds after a prefill, against ``calculator.kv_cache_bytes``."""

    model: str
    cache: str = Field(description="transformers cache class")
    batch: int
    tokens: int
    measured_bytes: int = Field(description="sum of numel x element_size of the key and value tensors held")
    predicted_bytes: int = Field(description="batch x calculator.kv_cache_bytes(model, tokens, dtype)")
    convention_offset_bytes: int = Field(
        default=0,
        description="measured - predicted that the cache's own convention explains (0 unless noted)",
    )
    note: str = ""

    @property
    def exact(self) -> bool:
        """Measured equals predicted (plus the documented convention offset) to the byte."""
        return self.measured_bytes == self.predicted_bytes + self.convention_offset_bytes


class ParamCheck(_Out):
    """Parameters of the transformers model built from a ModelSpec, against ``param_count(ModelSpec)``."""

    model: str
    hf_params: int = Field(description="sum of numel over the transformers model's parameters")
    predicted_params: int

    @property
    def exact(self) -> bool:
        return self.hf_params == self.predicted_params


class PhaseError(_Out):
    """Absolute relative error |predicted / measured - 1| of one phase over one subset of the points."""

    phase: Phase
    subset: Literal["held_out", "fit", "all_at_ceilings"]
    n: int
    median_abs_rel_error: float
    max_abs_rel_error: float
    worst: str = Field(description="the point with the largest error")
    worst_predicted_s: float
    worst_measured_s: float
    reason: str = Field(description="why the model is off there, where a reason is known")


class Stalls(_Out):
    """What the stall guard saw (CPU): how long it waited for the machine, and what it measured again."""

    probe_baseline_s: float = Field(description="best time of the probe matmul (512^3, bf16)")
    waited_s: float
    remeasured: int = Field(description="points or ceilings timed again after a stall")
    unstable: int = Field(description="median still over 1.3x the fastest repeat after the retries")
    timeouts: int = Field(description="waits for the probe to recover that gave up")

    @property
    def busy(self) -> bool:
        """The machine did not settle: another process was competing for the cores, the numbers are unreliable."""
        return self.timeouts > 0 or self.unstable > 0

    @property
    def summary(self) -> str:
        return (f"stall guard: waited {self.waited_s:.1f} s in total for a probe matmul to come back within 1.3x of "
                f"its best ({self.probe_baseline_s * 1e3:.2f} ms); {self.remeasured} measurements taken again, "
                f"{self.unstable} still unsteady (median over 1.3x the fastest repeat), {self.timeouts} waits gave up"
                + ("; THE MACHINE WAS BUSY: rerun on an idle machine" if self.busy else ""))


class FitResult(_Out):
    """The fitted constants and how well they fit the points they were fitted to."""

    efficiency: Efficiency
    n_points: int
    rms_rel_error: float = Field(description="root-mean-square of predicted / measured - 1 on the fit half")
    method: str


class CatalogPhaseError(_Out):
    """|predicted / measured - 1| of one phase when every point is predicted on a catalog GPU entry as shipped:
    its datasheet peaks and default efficiencies, nothing fitted to this run."""

    phase: Phase
    n: int
    median_abs_rel_error: float
    max_abs_rel_error: float
    median_rel_error: float = Field(description="signed: below 0 the catalog entry predicts faster than measured")
    worst: str


class CatalogReference(_Out):
    """The measured run against a catalog GPU (``pdplan validate --gpu ID``): what a planner user gets untuned."""

    gpu: str = Field(description="the catalog GPU id")
    gpu_name: str
    engine: str = Field(description="the engine profile whose efficiencies were used (generic: the GPU entry's own)")
    peak_flops_per_s: float = Field(description="the entry's dense peak in the run's precision")
    memory_bytes_per_s: float = Field(description="the entry's memory bandwidth")
    predicted_s: tuple[float, ...] = Field(description="per point, in the order of ValidationReport.points")
    errors: tuple[CatalogPhaseError, ...]

    def error(self, phase: Phase) -> CatalogPhaseError:
        return next(e for e in self.errors if e.phase == phase)


class ValidationReport(_Out):
    """Everything one microbenchmark run measured, fitted and predicted."""

    date: str
    quick: bool
    seed: int
    wall_s: float
    versions: dict[str, str] = Field(description="python, torch, transformers, pdplan")
    ceilings: Ceilings
    device_spec: GPUSpec = Field(description="the measured device as a GPUSpec, with the fitted efficiency")
    models: tuple[ModelSpec, ...]
    points: tuple[Point, ...]
    kv_checks: tuple[KVCheck, ...]
    param_checks: tuple[ParamCheck, ...]
    fit: FitResult
    errors: tuple[PhaseError, ...]
    stalls: Stalls | None = Field(default=None, description="CPU only")
    decode_timing: Literal["eager", "cuda_graph"] = Field(
        default="eager", description="how decode steps were timed: transformers' eager forward, or the replay of "
                                     "a CUDA graph of it (as serving engines run decode)")
    reference: CatalogReference | None = Field(default=None, description="every point predicted on a catalog GPU entry")
    attention: str = Field(default="sdpa", description="the transformers attention the models ran: sdpa (transformers' "
                                                       "own, which before 5.23 repeats a GQA model's KV heads in a "
                                                       "one-token step) or pdplan_grouped_sdpa (each KV head read once)")
    notes: tuple[str, ...] = ()

    @property
    def efficiency(self) -> Efficiency:
        return self.fit.efficiency

    @property
    def repeats_kv(self) -> bool:
        """Whether its decode steps repeated each KV head over its query heads (transformers' sdpa before 5.23)."""
        return repeats_kv(self.attention, self.versions.get("transformers", ""))

    def error(self, phase: Phase, subset: str = "held_out") -> PhaseError:
        return next(e for e in self.errors if e.phase == phase and e.subset == subset)

    def points_of(self, phase: Phase | None = None, split: Split | None = None) -> list[Point]:
        return [p for p in self.points if (phase is None or p.phase == phase) and (split is None or p.split == split)]

    def median_abs_rel_error(self, phase: Phase, split: Split = "held_out") -> float:
        return statistics.median(abs(p.rel_error) for p in self.points_of(phase, split))
