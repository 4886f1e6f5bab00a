"""The serving model: a deployment under Poisson traffic, one module per mode.

``evaluate`` exposes for one configuration the same computation that ``calculator.optimizer.plan``
searches over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hardware_db.schema import GPUSpec, ModelSpec

from .. import budget
from .. import formulas as f
from ..arguments import as_model, gpu_spec, items, model_spec
from ..engines import DEFAULT_ENGINE, engine_gpu
from ..errors import InputError, UnknownIdError
from ..formula import quieted
from ..limits import MAX_GPU_TYPES
from . import chunked, disaggregated, mixed
from .closed import ClosedLoop
from .closed import closed_loop as _closed_loop
from .base import PERCENTILES, Deployment, Evaluation, ModeArrays, Pool, PoolModel, finite_or_none, rate_grid
from .workload import SLO, Length, Workload

ANALYSERS = {"mixed": mixed.analyse, "chunked": chunked.analyse, "disaggregated": disaggregated.analyse}

__all__ = ["SLO", "ClosedLoop", "Deployment", "Evaluation", "Length", "Pool", "Workload", "analyse", "closed_loop",
           "evaluate"]

MAX_CONCURRENCY = 16_384
"""Requests a closed loop may keep in flight (the largest batch cap a pool takes)."""


def analyse(model: ModelSpec, d: Deployment, w: Workload, rates, p: float,
            pools: tuple[PoolModel, ...] | None = None, joint: bool = False) -> ModeArrays:
    """The mode's statistics at each arrival rate in ``rates`` for the SLO percentile ``p`` (0-1).

    ``pools`` are the deployment's PoolModels when the caller already built them (their step-time
    tables are cached on them, so a search reuses them across calls). ``joint`` also tabulates the
    TTFT distribution for joint SLO attainment.
    """
    with np.errstate(all="ignore"):
        if pools is None:
            pools = tuple(PoolModel.build(model, pool, w) for pool in d.pools)
        e = pools[-1].tokens_per_step  # the pool that decodes
        if e > 1:  # speculative decoding: the modes count a request's output in steps of e tokens
            w = in_steps(w, e)
        if d.mode == "disaggregated":
            a = disaggregated.analyse(model, d, w, rates, p, pools, joint)  # type: ignore[arg-type]
        else:
            a = ANALYSERS[d.mode](model, d, w, rates, p, pools[0], joint)
        return served(per_token(a, e), pools[0])


def analyse_disaggregated(model: ModelSpec, ds: Sequence[Deployment], pools: Sequence[tuple[PoolModel, PoolModel]],
                          w: Workload, rates: Sequence[np.ndarray], p: float, joint: bool = False) -> list[ModeArrays]:
    """``analyse`` of several disaggregated deployments at once: ``ds[i]`` on its (prefill, decode) pool models
    ``pools[i]`` at the rates ``rates[i]`` (1-d, the same length for all), each one's arrays as ``analyse`` gives
    them alone (``disaggregated.analyse_pairs``; speculative decode pools, whose outputs count in steps of their
    own, in a call of their own). A plan sizes every decode pool and tries every pair this way."""
    out: list[ModeArrays | None] = [None] * len(ds)
    by_steps: dict[float, list[int]] = {}
    for i, (_, dec) in enumerate(pools):
        by_steps.setdefault(dec.tokens_per_step, []).append(i)
    with np.errstate(all="ignore"):
        for e, members in by_steps.items():
            w_e = in_steps(w, e) if e > 1 else w
            a = disaggregated.analyse_pairs(model, [ds[i] for i in members], [pools[i] for i in members], w_e,
                                            np.stack([np.asarray(rates[i], dtype=float) for i in members]), p, joint)
            for j, i in enumerate(members):
                out[i] = served(per_token(a.rows(j), e), pools[i][0])
    return out  # type: ignore[return-value]


def served(a: ModeArrays, entry: PoolModel) -> ModeArrays:
    """A mode's arrays with TTFT as a client measures it (``served_ttft``): plus the request path of the
    engine that takes the request (the pool it enters; its profile's ``request_overhead_us``, 0 unless an
    engine profile or a calibration sets it)."""
    t_req = entry.gpu.efficiency.request_overhead_us * 1e-6
    if t_req == 0:
        return a
    def add(x):
        return None if x is None else f.served_ttft(T_eng=x, t_req=t_req)
    return replace(a, ttft_mean_s=add(a.ttft_mean_s), ttft_p_s=add(a.ttft_p_s), ttft_levels_s=add(a.ttft_levels_s))


def per_token(a: ModeArrays, tokens_per_step: float) -> ModeArrays:
    """A mode's arrays with its TPOT per token rather than per step (speculative decoding); the
    inter-token gaps stay those of steps, since a step's tokens arrive together."""
    e = tokens_per_step
    if e == 1:
        return a
    return replace(a, tpot_mean_s=a.tpot_mean_s / e, tpot_p_s=a.tpot_p_s / e, tpot_var_s2=a.tpot_var_s2 / e**2,
                   tpot_full_s=None if a.tpot_full_s is None else a.tpot_full_s / e)


def in_steps(w: Workload, tokens_per_step: float) -> Workload:
    """The workload with its output lengths counted in speculative steps (``tokens_per_step`` tokens
    each, at least one step)."""
    o = w.osl
    if o.samples is not None:
        osl = Length(samples=[max(1, round(s / tokens_per_step)) for s in o.samples])
    else:
        osl = Length(mean=max(1.0, o.mean / tokens_per_step), cv=o.cv)
    return w.model_copy(update={"osl": osl})


@quieted
def evaluate(model: ModelSpec | str, deployment: Deployment | Mapping[str, Any],
             workload: Workload | Mapping[str, Any], slo: SLO | Mapping[str, Any] | None = None,
             gpus: Sequence[GPUSpec | Mapping[str, Any]] | GPUSpec = (),
             calibration: Any = None, engine: str = "generic") -> Evaluation:
    """TTFT/TPOT statistics, utilisation and goodput of a deployment at the workload's rate.

    ``deployment``, ``workload`` and ``slo`` are the models or mappings of their fields. ``gpus``
    are inline GPU specs (one or a list) for pool ids that are not in the database (or override
    them). ``calibration`` (an ``Efficiency``, a mapping of its fields or a calibration YAML from
    ``pdplan validate`` or ``pdplan calibrate``) replaces the efficiencies of every pool's GPU; to
    calibrate one pool of two GPU types, pass that GPU's calibrated spec in ``gpus`` instead.
    ``engine`` names an engine profile (``list_engines()``) applied to every pool's GPU instead.
    Invalid arguments raise ``InputError`` naming the argument path
    (``deployment.prefill.tp``); a workload whose longest prompt and output exceed the model's
    context window is one.
    """
    m = model_spec(model)
    deployment = as_model("deployment", deployment, Deployment)
    workload = as_model("workload", workload, Workload)
    slo = None if slo is None else as_model("slo", slo, SLO)
    check_context(m, workload)
    pools = _pool_models(m, deployment, workload, gpus, calibration, engine)
    engine_used = "calibration" if calibration is not None else engine
    bad = next((pm for pm in pools if not pm.fits), None)
    if bad is not None:
        return Evaluation(mode=deployment.mode, stable=False, reason=bad.reason, utilisation=None,
                          binding="GPU memory (the weights)", ttft_mean_s=None,
                          tpot_mean_s=None, kv_transfer_s=None, decode_batch=None, goodput_rps=0.0,
                          num_gpus=deployment.num_gpus, engine=engine_used)
    rate = np.array([workload.rate])
    by_p = {}
    for pc in PERCENTILES:
        budget.check()
        by_p[pc] = analyse(m, deployment, workload, rate, pc / 100, tuple(pools), joint=slo is not None and pc == 90)
    base = by_p[int(round(slo.percentile))] if slo is not None and int(round(slo.percentile)) in by_p else by_p[90]
    if slo is not None and int(round(slo.percentile)) not in by_p:
        base = analyse(m, deployment, workload, rate, slo.p, tuple(pools), joint=True)
    stable = bool(base.stable[0])
    goodput = _goodput(m, deployment, workload, slo, tuple(pools)) if slo is not None else None
    util = float(base.utilisation[0])
    binding = str(base.binding[0])
    reason = None if stable else f"overloaded at {workload.rate:g} req/s: {binding} at utilisation {util:.2f} (>= 1)"
    attainment = None
    joint = analyse(m, deployment, workload, rate, 0.9 if slo is None else slo.p, tuple(pools), joint=True)
    if slo is not None and stable:
        attainment = float(joint.attainment(slo)[0])
    return Evaluation(
        mode=deployment.mode, stable=stable, reason=reason, utilisation=finite_or_none(util), binding=binding,
        ttft_mean_s=finite_or_none(float(base.ttft_mean_s[0])) if stable else None,
        tpot_mean_s=finite_or_none(float(base.tpot_mean_s[0])) if stable else None,
        kv_transfer_s=float(base.kv_transfer_s[0]) if deployment.mode == "disaggregated" else 0.0,
        decode_batch=finite_or_none(float(base.batch[0]) * deployment.pools[-1].streams) if stable else None,
        goodput_rps=goodput, num_gpus=deployment.num_gpus, attainment=attainment,
        ttft_by_percentile_s={pc: float(a.ttft_p_s[0]) for pc, a in by_p.items()} if stable else {},
        tpot_by_percentile_s={pc: float(a.tpot_p_s[0]) for pc, a in by_p.items()} if stable else {},
        itl_by_percentile_s={pc: float(a.itl_p_s[0]) for pc, a in by_p.items()} if stable else {},
        engine=engine_used,
    ).with_joint(joint)


def closed_loop(model: ModelSpec | str, deployment: Deployment | Mapping[str, Any], isl: float, osl: float,
                concurrency: int, gpus: Sequence[GPUSpec | Mapping[str, Any]] | GPUSpec = (),
                calibration: Any = None, engine: str = "generic") -> ClosedLoop:
    """Mean TTFT, TPOT and throughput of one instance of a mixed (hybrid scheduler) or chunked ``deployment``
    under a closed-loop benchmark of ``concurrency`` requests always in flight, each of ``isl`` prompt and
    ``osl`` output tokens: what ``vllm bench serve --max-concurrency N`` measures (``serving.closed``).
    ``gpus``, ``calibration`` and ``engine`` as for ``evaluate``."""
    m = model_spec(model)
    deployment = as_model("deployment", deployment, Deployment)
    if deployment.mode == "disaggregated" or (deployment.mode == "mixed" and deployment.scheduler != "hybrid"):
        raise InputError("deployment.mode", "a closed loop is modelled for one instance that puts running decodes "
                                            "and new prompts in one step: mode mixed with the hybrid scheduler, or "
                                            "chunked")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise InputError("concurrency", f"must be a whole number of requests in 1 ... {MAX_CONCURRENCY}, "
                                        f"got {concurrency!r}")
    workload = as_model("workload", {"rate": 1.0, "isl": isl, "osl": osl}, Workload)
    check_context(m, workload)
    pm = _pool_models(m, deployment, workload, gpus, calibration, engine)[0]
    if not pm.fits:
        raise InputError("deployment.pool", pm.reason or "does not fit")
    budget_tokens = deployment.chunk_tokens if deployment.mode == "chunked" else deployment.max_batched_tokens
    return _closed_loop(pm, workload.isl.mean, workload.osl.mean, concurrency, int(budget_tokens))


def _pool_models(m: ModelSpec, d: Deployment, w: Workload,
                 gpus: Sequence[GPUSpec | Mapping[str, Any]] | GPUSpec, calibration: Any = None,
                 engine: str = "generic") -> list[PoolModel]:
    """The deployment's PoolModels; ``gpus`` are inline GPU specs for pool ids not in the database, and
    ``calibration`` (or else the ``engine`` profile) replaces every pool GPU's efficiencies."""
    given = [] if isinstance(gpus, (list, tuple)) and not gpus else items("gpus", gpus, MAX_GPU_TYPES,
                                                                          (GPUSpec, Mapping))
    custom = {spec.id: spec for spec in (as_model(f"gpus.{i}", g, GPUSpec) for i, g in enumerate(given))}
    names = ("prefill", "decode") if d.mode == "disaggregated" else ("pool",)
    if calibration is not None or engine not in (None, DEFAULT_ENGINE):
        adjusted: dict[str, GPUSpec] = {}
        for name, p in zip(names, d.pools):
            if p.gpu not in adjusted:
                spec = custom.get(p.gpu) or gpu_spec(p.gpu, f"deployment.{name}.gpu")
                adjusted[p.gpu] = engine_gpu(spec, engine, calibration)
        custom.update(adjusted)
    return [_pool_model(m, name, p, w, custom) for name, p in zip(names, d.pools)]


def _pool_model(m: ModelSpec, name: str, pool: Pool, w: Workload, custom: dict[str, GPUSpec]) -> PoolModel:
    """The pool's PoolModel; an unknown GPU id or a layout the model cannot take names the pool's field."""
    where = f"deployment.{name}"
    gpu = custom.get(pool.gpu) or gpu_spec(pool.gpu, f"{where}.gpu")
    try:
        return PoolModel.build(m, pool, w, gpu)
    except InputError as e:
        if isinstance(e, UnknownIdError):
            raise
        raise InputError(f"{where}.{e.field}", e.reason) from None


def check_context(m: ModelSpec, w: Workload, field: str = "workload") -> None:
    """``InputError`` when the longest prompt plus the longest output exceed the model's context window
    (for a (mean, cv) length its mean counts, for samples the longest sample)."""
    isl, osl = w.isl.longest_tokens, w.osl.longest_tokens
    if isl + osl <= m.max_position_embeddings:
        return

    def what(name: str, length: Length) -> str:
        return f"{'longest' if length.samples is not None else 'mean'} {name} {length.longest_tokens:,.0f}"

    where = (f"{field}.isl.samples" if w.isl.samples is not None
             else f"{field}.osl.samples" if w.osl.samples is not None else f"{field}.isl")
    raise InputError(where, f"{what('isl', w.isl)} + {what('osl', w.osl)} = {isl + osl:,.0f} tokens exceeds "
                            f"{m.id}'s context window of {m.max_position_embeddings:,} tokens")


def _goodput(m: ModelSpec, d: Deployment, w: Workload, slo: SLO, pools: tuple[PoolModel, ...]) -> float:
    """Largest rate on a fine geometric grid at which the SLO holds at its percentile."""
    upper = 4 * max(w.rate, 1e-3)
    for _ in range(8):  # widen until the grid reaches a rate that fails
        budget.check()
        rates = rate_grid(upper)
        ok = analyse(m, d, w, rates, slo.p, pools, joint=slo.attainment == "joint").meets(slo)
        if not ok[-1]:
            break
        upper *= 8
    return float(rates[ok].max()) if ok.any() else 0.0
