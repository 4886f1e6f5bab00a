"""The planner's GPU counts, checked by simulation: enough, and not padded.

For 30 seeded random plans (model, GPU, lengths, rate, SLO, mode), the recommended deployment is
simulated (``calculator.serving.simulate``, same step times). It must meet its SLO in at least 95%
of the plans; and where it has more than one instance, the same deployment with one instance fewer
must miss the SLO in at least 70% of those plans (the count is tight, not rounded up for safety).
"""

from __future__ import annotations

import numpy as np

import calculator as pc
from calculator.serving.base import PoolModel
from calculator.serving.simulate import run_deployment

MODELS = ("llama-3.1-8b", "qwen3-8b", "mistral-7b", "qwen3-30b-a3b")
GPUS = ("h100-sxm", "a100-sxm-80gb", "h200-sxm")
PLANS = 30
REQUESTS = 1000


def _random_plans(seed: int = 7) -> list[tuple]:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < PLANS:
        model = str(rng.choice(MODELS))
        gpu = str(rng.choice(GPUS))
        isl, osl = int(rng.choice([300, 1000, 3000])), int(rng.choice([100, 300]))
        mode = str(rng.choice(["mixed", "chunked", "disaggregated"]))
        w = pc.Workload(rate=float(rng.uniform(2, 20)), isl=isl, osl=osl)
        slo = pc.SLO(ttft_s=float(rng.choice([0.5, 1.0, 2.0])), tpot_s=float(rng.choice([0.03, 0.05, 0.08])))
        plan = pc.plan(model, w, slo, gpus=[gpu], modes=[mode], tps=[1, 2])
        if plan.best is not None and plan.best.num_gpus <= 24:
            out.append((model, w, slo, plan.best.deployment))
    return out


def _meets(model: str, d: pc.Deployment, w: pc.Workload, slo: pc.SLO) -> bool:
    m = pc.load_model(model)
    pools = tuple(PoolModel.build(m, p, w) for p in d.pools)
    trace = run_deployment(m, d, w, pools, REQUESTS, seed=3)
    return trace.stable and trace.ttft_p(slo.percentile) <= slo.ttft_s and trace.tpot_p(slo.percentile) <= slo.tpot_s


def _fewer(d: pc.Deployment) -> list[pc.Deployment]:
    """The deployment with one instance fewer in each pool that has more than one."""
    out = []
    for name in ("pool", "prefill", "decode"):
        pool = getattr(d, name)
        if pool is not None and pool.instances > 1:
            out.append(d.model_copy(update={name: pool.model_copy(update={"instances": pool.instances - 1})}))
    return out


def test_plans_meet_their_slo_in_simulation_and_are_not_padded():
    met, tight, multi, report = 0, 0, 0, []
    for model, w, slo, d in _random_plans():
        ok = _meets(model, d, w, slo)
        met += ok
        smaller = _fewer(d)
        if smaller:
            multi += 1
            missed = all(not _meets(model, s, w, slo) for s in smaller)
            tight += missed
        report.append((model, d.mode, [p.instances for p in d.pools], ok))
    assert met >= 0.95 * PLANS, report
    assert multi >= 10 and tight >= 0.7 * multi, (tight, multi, report)
