"""The serving validation's records: the calibration, each load point measured and predicted, the report."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hardware_db.schema import Efficiency

from ..serving import Evaluation
from .client import RequestRecord
from .engine import EngineConfig


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StepTime(_Record):
    phase: str
    tokens: int = Field(description="prefill: prompt tokens; decode: mean context")
    batch: int
    seconds: float
    chunk: int | None = Field(default=None, description="prefill in pieces of this many tokens (a chunked instance's "
                              "budget), one step each")


NEIGHBOUR_BATCH = 16
"""Decodes in the step whose sensitivity to a busy neighbour the calibration measures."""


class Calibration(_Record):
    """What was measured unloaded and fitted: the only inputs of the predictions besides the workload."""

    config: str = Field(default="", description="the configuration whose engine instance was measured")
    steps: tuple[StepTime, ...]
    efficiency: Efficiency
    fit_rms_rel_error: float
    front_end_request_s: float = Field(description="client TTFT minus the engine's queue + prefill time, unloaded "
                                       "(HTTP, tokenising, detokenising: the API server's share of a request)")
    transfer_s: float | None = Field(description="1P1D: the KV connector's move of one prompt (save on the prefill "
                                     "instance, load on the decode instance), unloaded")
    save_s: float | None = Field(default=None, description="1P1D: the part of the move that holds the prefill "
                                 "instance (its engine's CPU time on a lone request minus the fitted prefill): the "
                                 "connector's save, the blocking KV transfer pdplan charges to the prefill pool")
    disaggregated_unloaded_ttft_s: float | None
    alone_decode_s: float | None = Field(default=None, description=f"decode step of {NEIGHBOUR_BATCH} sequences "
                                         "(median inter-token gap), measured just before ``neighbour_decode_s``")
    neighbour_decode_s: float | None = Field(default=None, description="the same decode step while a process on the "
                                             "front-end core streams memory (a copy larger than the shared cache): "
                                             "how much the engine's memory-bound steps slow when the API server and "
                                             "the client, which share the machine's cache and memory bus, are busy")
    compute_neighbour_decode_s: float | None = Field(default=None, description="the same decode step beside a "
                                                     "process that only computes (the control: it shares the "
                                                     "front-end core's time, not the memory system)")

    @property
    def neighbour_slowdown(self) -> float | None:
        """The decode step beside a memory-streaming neighbour over the step alone."""
        if self.alone_decode_s and self.neighbour_decode_s:
            return self.neighbour_decode_s / self.alone_decode_s
        return None

    @property
    def load_s(self) -> float:
        """1P1D: the rest of the move (the decode instance loads the KV): a delay in TTFT only."""
        return max((self.transfer_s or 0.0) - (self.save_s or 0.0), 0.0)

    def front_end_s(self, cfg: EngineConfig) -> float:
        """What a request's TTFT holds besides pdplan's prediction: one API server's share, or for 1P1D two
        (prefill and decode requests) and the decode instance's load of the KV."""
        return self.front_end_request_s + (self.front_end_request_s + self.load_s if cfg.disaggregated else 0.0)


def _pct(values: list[float], q: float) -> float | None:
    v = [x for x in values if math.isfinite(x)]
    return float(np.percentile(v, q)) if v else None


class Measured(_Record):
    requests: int
    failed: int
    first_error: str | None = None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    itl_p50_s: float | None
    itl_p90_s: float | None
    itl_p99_s: float | None
    itl_max_s: float | None
    throughput_rps: float | None = Field(description="completions per second from the 10th-percentile completion "
                                         "to the last first token (while prompts still wait: at overload, the "
                                         "engine's saturation rate, not the drain after the queue empties)")


def summarise(recs: list[RequestRecord]) -> Measured:
    ok = [r for r in recs if r.ok]
    bad = [r for r in recs if not r.ok]
    ttft = [r.ttft_s for r in ok]
    tpot = [r.tpot_s for r in ok]
    itl = [g for r in ok for g in r.itl_s]
    done = np.sort([r.done_s for r in ok])
    thr = None
    if len(done) >= 20:
        # completions while prompts were still waiting: from the 10th percentile completion to the last first
        # token (after it the queue is empty and the engine drains); at overload, the saturation rate
        start, end = done[len(done) // 10], max(r.token_s[0] for r in ok)
        inside = done[(done >= start) & (done <= end)]
        span = inside[-1] - inside[0] if len(inside) else 0.0
        thr = float((len(inside) - 1) / span) if len(inside) >= 10 and span > 0 else None
    err = next((r.error or f"{len(r.token_s)} of {r.output_tokens} tokens" for r in bad), None)
    return Measured(requests=len(recs), failed=len(bad), first_error=err,
                    ttft_p50_s=_pct(ttft, 50), ttft_p90_s=_pct(ttft, 90), tpot_p50_s=_pct(tpot, 50),
                    tpot_p90_s=_pct(tpot, 90), itl_p50_s=_pct(itl, 50), itl_p90_s=_pct(itl, 90),
                    itl_p99_s=_pct(itl, 99), itl_max_s=max(itl) if itl else None, throughput_rps=thr)


class Predicted(_Record):
    stable: bool
    utilisation: float | None
    binding: str | None
    ttft_p50_s: float | None = Field(description="pdplan's TTFT plus the measured front end")
    ttft_p90_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    itl_p50_s: float | None
    itl_p90_s: float | None

    @staticmethod
    def of(e: Evaluation, front_end_s: float) -> Predicted:
        def at(table: dict[int, float], p: int, add: float = 0.0) -> float | None:
            # None where there is no finite figure (JSON has no infinity: a report must read back as written)
            return table[p] + add if e.stable and p in table and math.isfinite(table[p]) else None

        return Predicted(stable=e.stable, utilisation=e.utilisation, binding=e.binding,
                         ttft_p50_s=at(e.ttft_by_percentile_s, 50, front_end_s),
                         ttft_p90_s=at(e.ttft_by_percentile_s, 90, front_end_s),
                         tpot_p50_s=at(e.tpot_by_percentile_s, 50), tpot_p90_s=at(e.tpot_by_percentile_s, 90),
                         itl_p50_s=at(e.itl_by_percentile_s, 50), itl_p90_s=at(e.itl_by_percentile_s, 90))


class EngineStats(_Record):
    """What one engine instance did during a load point, from its own counters: how busy its core was,
    how many steps it ran and how many tokens they carried."""

    busy_share: float = Field(description="CPU time of the engine core / wall time (1: its core never idle)")
    steps_per_s: float
    tokens_per_step: float
    mean_step_s: float | None = Field(description="the busy time per step (CPU time / steps)")
    preemptions: float


class LoadPoint(_Record):
    config: str
    config_name: str
    rate_rps: float = Field(description="the offered Poisson rate")
    fraction_of_capacity: float = Field(description=(
        "the fraction of the predicted capacity the run offered this point at (its plan: 0.3, 0.6, 0.8 and 1.5, "
        "quick 0.5 and 1.5); it chooses the points the accuracy bounds cover (up to 0.8), and reanalysis keeps "
        "it, so a version that predicts a lower capacity does not move its hardest points out of them"))
    arrival_rate_rps: float | None = Field(default=None, description=(
        "the rate the point's requests were sent at: (requests - 1) / (last send - first send). A free Poisson "
        "sample of 200 requests strays from the offered rate by ~7% (one standard deviation), which near capacity "
        "moves latency by tens of percent, so pdplan predicts at this rate (conditioned arrivals meet the offered "
        "rate up to the client's timer). None in reports before 2026-12-05 that were not reanalysed"))
    arrival_rate_replayed: bool = Field(default=False, description=(
        "the arrival rate was not recorded by the run but replayed from its seed (``reanalysis.replayed_arrivals``)"))
    load_average: float = Field(description="the 1-minute load average, the larger of before and after the point")
    measured: Measured
    predicted: Predicted
    predicted_capacity_rps: float = Field(description="pdplan's capacity from the instance's calibration, as the pdplan "
                                          "that made the predictions gives it (the run placed its offered rates at "
                                          "the planned fractions of the capacity it predicted then)")
    engines: tuple[EngineStats, ...] = Field(default=(), description="per instance (1P1D: prefill, then decode)")
    check_decode_s: float | None = Field(default=None, gt=0, description=(
        f"the instance's decode step of {NEIGHBOUR_BATCH} sequences at a 32-token prompt (median inter-token gap, "
        "the calibration's own shape), measured unloaded just before this point on the instance that decodes (1P1D: "
        "its decode instance). None: not measured (runs before 2026-12-07, whose last unloaded decode step before "
        "the points is the neighbour test's; 1P1D in the first run of 2026-12-07)"))
    check_prefill_s: float | None = Field(default=None, gt=0, description=(
        "the lone prompt of the run's length (the engine's own prefill time) on the instance that prefills, "
        "measured unloaded just before this point. None: not measured"))
    capacity_at_check_rps: float | None = Field(default=None, ge=0, description=(
        "pdplan's capacity with the step times at the check before this point (``predict.at_check``): what the "
        "saturation is compared with. None where no check applies (then ``predicted_capacity_rps``)"))

    @property
    def capacity_for_saturation_rps(self) -> float:
        """The capacity this point's measured throughput is compared with: at the check before it, else as
        calibrated."""
        return self.predicted_capacity_rps if self.capacity_at_check_rps is None else self.capacity_at_check_rps

    @property
    def predicted_at_rps(self) -> float:
        """The rate pdplan's figures for this point are for: the arrivals' own, else the offered one."""
        return self.rate_rps if self.arrival_rate_rps is None else self.arrival_rate_rps


class ServingReport(_Record):
    date: str
    quick: bool
    engine: str
    engine_version: str
    machine: str
    machine_details: str
    matmul_gflops: float
    copy_gb_s: float
    dtype: str = Field(default="bf16", description="the precision the model was served in: bf16 where the CPU "
                       "computes it natively, else fp32 (emulated bf16 runs ~30x slower)")
    isl: int
    osl: int
    requests_per_point: int
    seed: int | None = Field(default=None, description="the run's seed (model weights, prompts, arrivals); None in "
                             "reports before 2026-12-05, which ran with the default, 0")
    arrivals: Literal["free", "conditioned"] = Field(default="free", description=(
        "how the run drew each point's Poisson arrivals: free exponential gaps (``client.poisson_arrivals``; "
        "reports before 2026-12-07's afternoon), whose sample rate strays from the offered one, or conditioned on "
        "spanning exactly (n - 1) / rate (``client.conditioned_arrivals``), whose sample rate is the offered one"))
    calibration: Calibration = Field(description="the last co-located instance's (1P1D uses it)")
    calibrations: tuple[Calibration, ...] = Field(default=(), description="every co-located instance's, in order")
    points: tuple[LoadPoint, ...]
    curves: tuple[Curve, ...] = ()
    wall_s: float
    memory_total_bytes: float | None = Field(default=None, description="the machine's RAM (the measured device's "
                                             "memory); None in reports before 2026-12-04")
    predicted_by: str | None = Field(default=None, description="the pdplan that made the predictions when it is "
                                     "not the one that ran the engine (``pdplan validate --serving --reanalyse``)")
    cores: tuple[int, ...] | None = Field(default=None, description=(
        "the cores the run had (its processes placed on them by ``engine.core_layout``); None in reports before "
        "2026-12-07's evening, which ran on 2 cores in the layout ``core_layout`` gives for 2"))


class Curve(_Record):
    """pdplan's predicted percentiles of one configuration over a grid of rates below its capacity."""

    config: str
    rate_rps: tuple[float, ...]
    ttft_p50_s: tuple[float | None, ...]
    ttft_p90_s: tuple[float | None, ...]
    tpot_p50_s: tuple[float | None, ...]
    tpot_p90_s: tuple[float | None, ...]


ServingReport.model_rebuild()
