"""``plan_schedule``: a day of traffic windows, planned window by window on GPU types fixed for the day.

Hardware cannot change hourly, instance counts can. For each window the planner (``plan``) finds
every layout that meets the SLO with the fewest instances; a *layout* is a deployment without its
instance counts (mode, GPU, tp/pp/dp/ep, chunk budget, scheduler). Three ways to run the day are
then compared, each with one layout held all day:

- **disaggregated, pools scaled independently**: the prefill and decode pools each take the
  instances the window needs (more prefill in hours heavy with long prompts, more decode in hours
  of long answers);
- **colocated with autoscaling**: a mixed or chunked layout, its instance count per window;
- **static for the peak**: one deployment that meets the SLO in every window (each pool with the
  instances of its busiest window) held all day, the layout with the fewest GPUs.

For the first two, the layout with the fewest GPU-hours over the day among those that meet the SLO in
every window. The low-load windows show where disaggregation loses: two pools of whole instances
cannot both be filled when the traffic is light.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hardware_db.schema import GPUSpec, ModelSpec

from . import budget
from .arguments import as_model, items, model_spec
from .errors import InputError
from .optimizer import Candidate, plan
from .serving.base import Deployment
from .serving.workload import SLO, Workload

MAX_WINDOWS = 48
"""Windows one schedule may have (a day in half hours)."""
STRATEGIES = ("disaggregated", "colocated", "static")


class Window(BaseModel):
    """A stretch of the day with one traffic shape."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    duration_s: float = Field(ge=1.0, le=7 * 86_400, description="how long this traffic lasts, seconds (1 s to a week)")
    workload: Workload
    label: str = Field(default="", max_length=64)


class WindowPlan(BaseModel):
    """One window under one strategy: the deployment it runs and its GPUs."""

    model_config = ConfigDict(frozen=True)

    label: str
    start_s: float
    duration_s: float
    rate_rps: float
    deployment: Deployment
    num_gpus: int
    prefill_instances: int | None = Field(description="disaggregated: prefill instances (else None)")
    decode_instances: int | None = Field(description="disaggregated: decode instances (else None)")
    instances: int | None = Field(description="colocated: instances (else None)")
    gpu_hours: float
    best_possible_gpus: int = Field(description="the fewest GPUs any layout needs in this window alone")


class Strategy(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    layout: str = Field(description="the layout held all day")
    windows: tuple[WindowPlan, ...]
    gpu_hours: float
    scale_events: int = Field(description="instance-count changes between consecutive windows")


class Schedule(BaseModel):
    """The day under each strategy, and what each saves against the static peak deployment."""

    model_config = ConfigDict(frozen=True)

    model: str
    slo: SLO
    gpus: tuple[str, ...]
    strategies: tuple[Strategy, ...]
    savings_vs_static: dict[str, float] = Field(description="1 - strategy GPU-hours / static GPU-hours")
    low_load_loss: dict[str, float] = Field(description="per window where the disaggregated strategy needs more GPUs "
                                            "than the best colocated deployment of that window: its GPUs / those - 1")

    def strategy(self, name: str) -> Strategy:
        for s in self.strategies:
            if s.name == name:
                return s
        raise InputError("name", f"no strategy {name!r}; choose from {[s.name for s in self.strategies]}")


def _layout(d: Deployment) -> str:
    """A deployment without its instance counts, as a key."""
    def pool(p: Any) -> str:
        return p.model_copy(update={"instances": 1, "max_batch": 1}).model_dump_json()

    if d.mode == "disaggregated":
        assert d.prefill is not None and d.decode is not None
        return f"disaggregated|{pool(d.prefill)}|{pool(d.decode)}|{d.kv_link}"
    assert d.pool is not None
    extra = d.chunk_tokens if d.mode == "chunked" else d.scheduler
    return f"{d.mode}|{pool(d.pool)}|{extra}"


def _label(d: Deployment) -> str:
    def pool(p: Any) -> str:
        parts = [p.gpu] + [f"{k}{v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("dp", p.dp), ("ep", p.ep), ("cp", p.cp))
                           if v > 1 or k == "tp"]
        return ":".join(parts)

    if d.mode == "disaggregated":
        assert d.prefill is not None and d.decode is not None
        return f"disaggregated prefill {pool(d.prefill)}, decode {pool(d.decode)}"
    assert d.pool is not None
    return f"{d.mode} {pool(d.pool)}" + (f", chunk {d.chunk_tokens}" if d.mode == "chunked" else "")


def plan_schedule(model: ModelSpec | str, profile: Sequence[Window | Mapping[str, Any]], slo: SLO | Mapping[str, Any],
                  gpus: Sequence[str | GPUSpec] | str | GPUSpec, **plan_options: Any) -> Schedule:
    """Plan a day of traffic windows on ``gpus`` (fixed all day), each strategy with one layout and a count of
    instances per window (see the module docstring). ``plan_options`` go to ``plan`` (tps, weight_dtype, ...)."""
    m = model_spec(model)
    windows = [as_model(f"profile.{i}", w, Window) for i, w in enumerate(items("profile", profile, MAX_WINDOWS))]
    slo = as_model("slo", slo, SLO)
    if not windows:
        raise InputError("profile", "give at least one window")
    for bad in ("modes", "objective"):
        if bad in plan_options:
            raise InputError(bad, "plan_schedule compares the modes itself, by GPUs")
    per_window: list[dict[str, Candidate]] = []
    for i, w in enumerate(windows):
        budget.check()
        p = plan(m, w.workload, slo, gpus=gpus, **plan_options)
        if not p.feasible:
            raise InputError(f"profile.{i}", f"no deployment on {gpus} meets the SLO in window {w.label or i}: {p.reason}")
        found: dict[str, Candidate] = {}
        for c in p.candidates:
            found.setdefault(_layout(c.deployment), c)
        per_window.append(found)
    starts = [sum(w.duration_s for w in windows[:i]) for i in range(len(windows))]
    best_gpus = [min(c.num_gpus for c in f.values()) for f in per_window]

    def strategy(name: str, mode_ok: Any) -> Strategy | None:
        common = set.intersection(*({k for k, c in f.items() if mode_ok(c.mode)} for f in per_window))
        if not common:
            return None
        def hours(k: str) -> float:
            return sum(f[k].num_gpus * w.duration_s / 3600 for f, w in zip(per_window, windows, strict=True))
        key = min(sorted(common), key=hours)
        rows = [_window(w, start, f[key].deployment, f[key].num_gpus, best)
                for w, start, f, best in zip(windows, starts, per_window, best_gpus, strict=True)]
        return _strategy(name, _label(rows[0].deployment), rows)

    out = [s for s in (strategy("disaggregated", lambda mode: mode == "disaggregated"),
                       strategy("colocated", lambda mode: mode != "disaggregated")) if s is not None]
    # static: one deployment that meets the SLO in every window (each pool at its busiest window's
    # instances), the layout with the fewest GPUs
    static = _static(per_window)
    if static is not None:
        out.append(_strategy("static", _label(static), [_window(w, start, static, static.num_gpus, best)
                                                        for w, start, best in zip(windows, starts, best_gpus, strict=True)]))
    static_h = out[-1].gpu_hours if static is not None else None
    loss = {}
    dis = next((s for s in out if s.name == "disaggregated"), None)
    if dis is not None:
        for row, f in zip(dis.windows, per_window, strict=True):
            colocated = [c.num_gpus for c in f.values() if c.mode != "disaggregated"]
            if colocated and row.num_gpus > min(colocated):
                loss[row.label] = row.num_gpus / min(colocated) - 1
    return Schedule(model=m.id, slo=slo, gpus=tuple(g if isinstance(g, str) else g.id for g in (
        [gpus] if isinstance(gpus, (str, GPUSpec)) else gpus)), strategies=tuple(out),
        savings_vs_static={} if not static_h else {s.name: 1 - s.gpu_hours / static_h for s in out
                                                   if s.name != "static"}, low_load_loss=loss)


def _static(per_window: list[dict[str, Candidate]]) -> Deployment | None:
    common = set.intersection(*(set(f) for f in per_window))
    best: Deployment | None = None
    for key in sorted(common):
        ds = [f[key].deployment for f in per_window]
        def busiest(pools: list[Any]) -> Any:  # every window's instances and batch cap at once
            return pools[0].model_copy(update={"instances": max(q.instances for q in pools),
                                               "max_batch": max(q.max_batch for q in pools)})

        if ds[0].mode == "disaggregated":
            d = ds[0].model_copy(update={"prefill": busiest([x.prefill for x in ds]),
                                         "decode": busiest([x.decode for x in ds])})
        else:
            d = ds[0].model_copy(update={"pool": busiest([x.pool for x in ds])})
        if best is None or d.num_gpus < best.num_gpus:
            best = d
    return best


def _window(w: Window, start: float, d: Deployment, gpus: int, best: int) -> WindowPlan:
    dis = d.mode == "disaggregated"
    return WindowPlan(label=w.label or f"{start / 3600:g} h", start_s=start, duration_s=w.duration_s,
                      rate_rps=w.workload.rate, deployment=d, num_gpus=gpus,
                      prefill_instances=d.prefill.instances if dis and d.prefill else None,
                      decode_instances=d.decode.instances if dis and d.decode else None,
                      instances=None if dis or d.pool is None else d.pool.instances,
                      gpu_hours=gpus * w.duration_s / 3600, best_possible_gpus=best)


def _strategy(name: str, layout: str, rows: list[WindowPlan]) -> Strategy:
    def counts(r: WindowPlan) -> tuple[int | None, ...]:
        return (r.prefill_instances, r.decode_instances, r.instances)

    events = sum(counts(a) != counts(b) for a, b in itertools.pairwise(rows))
    return Strategy(name=name, layout=layout, windows=tuple(rows), gpu_hours=sum(r.gpu_hours for r in rows),
                    scale_events=events)


__all__ = ["Schedule", "Strategy", "Window", "WindowPlan", "plan_schedule"]
