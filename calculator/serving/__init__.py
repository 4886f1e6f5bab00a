"""The serving model: a deployment under Poisson traffic, one module per mode.

``evaluate`` exposes for one configuration the same computation that ``calculator.optimizer.plan``
searches over.
"""

from __future__ import annotations

import numpy as np

from hardware_db.loader import load_model
from hardware_db.schema import ModelSpec

from . import chunked, disaggregated, mixed
from .base import PERCENTILES, Deployment, Evaluation, ModeArrays, Pool, PoolModel, finite_or_none, rate_grid
from .workload import SLO, Length, Workload

ANALYSERS = {"mixed": mixed.analyse, "chunked": chunked.analyse, "disaggregated": disaggregated.analyse}

__all__ = ["SLO", "Deployment", "Evaluation", "Length", "Pool", "Workload", "analyse", "evaluate"]


def analyse(model: ModelSpec, d: Deployment, w: Workload, rates, p: float) -> ModeArrays:
    with np.errstate(all="ignore"):
        return _analyse(model, d, w, rates, p)


def _analyse(model: ModelSpec, d: Deployment, w: Workload, rates, p: float) -> ModeArrays:
    if d.mode == "disaggregated":
        pools = (PoolModel.build(model, d.prefill, w), PoolModel.build(model, d.decode, w))  # type: ignore[arg-type]
        return disaggregated.analyse(model, d, w, rates, p, pools)
    return ANALYSERS[d.mode](model, d, w, rates, p)


def evaluate(model: ModelSpec | str, deployment: Deployment, workload: Workload, slo: SLO | None = None) -> Evaluation:
    """TTFT/TPOT statistics, utilisation and goodput of a deployment at the workload's rate."""
    m = load_model(model) if isinstance(model, str) else model
    pools = [PoolModel.build(m, p, workload) for p in deployment.pools]
    bad = next((pm for pm in pools if not pm.fits), None)
    if bad is not None:
        return Evaluation(mode=deployment.mode, stable=False, reason=bad.reason, utilisation=None, ttft_mean_s=None,
                          tpot_mean_s=None, kv_transfer_s=None, decode_batch=None, goodput_rps=0.0,
                          num_gpus=deployment.num_gpus)
    rate = np.array([workload.rate])
    by_p = {pc: analyse(m, deployment, workload, rate, pc / 100) for pc in PERCENTILES}
    base = by_p[90]
    stable = bool(base.stable[0])
    goodput = _goodput(m, deployment, workload, slo) if slo is not None else None
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


def _goodput(m: ModelSpec, d: Deployment, w: Workload, slo: SLO) -> float:
    """Largest rate on a fine geometric grid at which the SLO holds at its percentile."""
    upper = 4 * max(w.rate, 1e-3)
    for _ in range(8):  # widen until the grid reaches a rate that fails
        rates = rate_grid(upper)
        ok = analyse(m, d, w, rates, slo.p).meets(slo)
        if not ok[-1]:
            break
        upper *= 8
    return float(rates[ok].max()) if ok.any() else 0.0
