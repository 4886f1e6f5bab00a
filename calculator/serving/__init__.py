"""The serving model: a deployment under Poisson traffic, one module per mode.

``evaluate`` exposes for one configuration the same computation that ``calculator.optimizer.plan``
searches over.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hardware_db.loader import load_model
from hardware_db.schema import GPUSpec, ModelSpec

from . import chunked, disaggregated, mixed
from .base import PERCENTILES, Deployment, Evaluation, ModeArrays, Pool, PoolModel, finite_or_none, rate_grid
from .workload import SLO, Length, Workload

ANALYSERS = {"mixed": mixed.analyse, "chunked": chunked.analyse, "disaggregated": disaggregated.analyse}

__all__ = ["SLO", "Deployment", "Evaluation", "Length", "Pool", "Workload", "analyse", "evaluate"]


def analyse(model: ModelSpec, d: Deployment, w: Workload, rates, p: float,
            pools: tuple[PoolModel, ...] | None = None) -> ModeArrays:
    """The mode's statistics at each arrival rate in ``rates`` for the SLO percentile ``p`` (0-1).

    ``pools`` are the deployment's PoolModels when the caller already built them (their step-time
    tables are cached on them, so a search reuses them across calls).
    """
    with np.errstate(all="ignore"):
        if pools is None:
            pools = tuple(PoolModel.build(model, pool, w) for pool in d.pools)
        if d.mode == "disaggregated":
            return disaggregated.analyse(model, d, w, rates, p, pools)  # type: ignore[arg-type]
        return ANALYSERS[d.mode](model, d, w, rates, p, pools[0])


def evaluate(model: ModelSpec | str, deployment: Deployment, workload: Workload, slo: SLO | None = None,
             gpus: Sequence[GPUSpec] = ()) -> Evaluation:
    """TTFT/TPOT statistics, utilisation and goodput of a deployment at the workload's rate.

    ``gpus`` are inline GPU specs for pool ids that are not in the database (or override them).
    """
    m = load_model(model) if isinstance(model, str) else model
    custom = {g.id: g for g in gpus}
    pools = [PoolModel.build(m, p, workload, custom.get(p.gpu)) for p in deployment.pools]
    bad = next((pm for pm in pools if not pm.fits), None)
    if bad is not None:
        return Evaluation(mode=deployment.mode, stable=False, reason=bad.reason, utilisation=None, ttft_mean_s=None,
                          tpot_mean_s=None, kv_transfer_s=None, decode_batch=None, goodput_rps=0.0,
                          num_gpus=deployment.num_gpus)
    rate = np.array([workload.rate])
    by_p = {pc: analyse(m, deployment, workload, rate, pc / 100, tuple(pools)) for pc in PERCENTILES}
    base = by_p[90]
    stable = bool(base.stable[0])
    goodput = _goodput(m, deployment, workload, slo, tuple(pools)) if slo is not None else None
    reason = None if stable else (
        f"overloaded at {workload.rate:g} req/s: utilisation {float(base.utilisation[0]):.2f} of the "
        f"{str(base.binding[0])} (>= 1 or the KV cache cannot hold the decode batch)")
    return Evaluation(
        mode=deployment.mode, stable=stable, reason=reason,
        utilisation=finite_or_none(float(base.utilisation[0])),
        ttft_mean_s=finite_or_none(float(base.ttft_mean_s[0])) if stable else None,
        tpot_mean_s=finite_or_none(float(base.tpot_mean_s[0])) if stable else None,
        kv_transfer_s=float(base.kv_transfer_s[0]) if deployment.mode == "disaggregated" else 0.0,
        decode_batch=finite_or_none(float(base.batch[0])) if stable else None,
        goodput_rps=goodput, num_gpus=deployment.num_gpus,
        ttft_by_percentile_s={pc: float(a.ttft_p_s[0]) for pc, a in by_p.items()} if stable else {},
        tpot_by_percentile_s={pc: float(a.tpot_p_s[0]) for pc, a in by_p.items()} if stable else {},
    )


def _goodput(m: ModelSpec, d: Deployment, w: Workload, slo: SLO, pools: tuple[PoolModel, ...]) -> float:
    """Largest rate on a fine geometric grid at which the SLO holds at its percentile."""
    upper = 4 * max(w.rate, 1e-3)
    for _ in range(8):  # widen until the grid reaches a rate that fails
        rates = rate_grid(upper)
        ok = analyse(m, d, w, rates, slo.p, pools).meets(slo)
        if not ok[-1]:
            break
        upper *= 8
    return float(rates[ok].max()) if ok.any() else 0.0
