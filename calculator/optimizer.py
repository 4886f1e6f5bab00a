"""``plan``: search deployments (mode x GPU x tp x chunk budget, prefill/decode GPU pairs) for the
fewest GPUs, the lowest $/hour or the lowest $/token that meets an SLO at a rate.

For each single-pool configuration the per-instance capacity under the SLO is the largest rate on
a geometric grid whose percentile TTFT and TPOT meet it (one vectorised ``analyse`` call); Poisson
splitting over N identical instances then gives N = ceil(rate / capacity). For disaggregation the
decode pool's per-instance capacity comes the same way from TPOT alone, and the prefill pool's
instance count is the smallest N whose M/G/N queue keeps TTFT within the SLO after the KV move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hardware_db.loader import list_gpus, load_gpu, load_model
from hardware_db.schema import KVDtype, ModelSpec, WeightDtype

from .serving import analyse
from .serving.base import Deployment, Mode, Pool, PoolModel, PrefillService, queue_wait, rate_grid
from .serving.disaggregated import kv_transfer_s
from .serving.workload import SLO, Workload

Objective = Literal["gpus", "cost", "cost_per_token"]
TPS = (1, 2, 4, 8)
CHUNKS = (256, 512, 1024, 2048, 4096, 8192)
MAX_GPU_TYPES = 16
MAX_INSTANCES = 4096
NODE_GPUS = 8


class Candidate(BaseModel):
    model_config = ConfigDict(frozen=True)

    mode: Mode
    deployment: Deployment
    num_gpus: int
    nodes: int = Field(description="8-GPU nodes the pools occupy (each pool rounded up to whole nodes)")
    cost_per_hour: float
    cost_per_million_tokens: float
    ttft_p_s: float
    tpot_p_s: float
    utilisation: float
    capacity_rps: float = Field(description="rate the deployment sustains within the SLO")
    binding: str
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float


class ParetoPoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    label: str
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    workload: Workload
    slo: SLO
    objective: Objective
    feasible: bool
    reason: str | None = None
    nearest_feasible_slo: SLO | None = None
    best: Candidate | None = None
    candidates: tuple[Candidate, ...] = ()
    pareto: tuple[ParetoPoint, ...] = ()
    searched: int = 0

    def explain(self) -> str:
        if not self.feasible or self.best is None:
            return f"No deployment meets the SLO. {self.reason}"
        b = self.best
        lines = [
            f"Best: {_describe(b)} — {b.num_gpus} GPUs, ${b.cost_per_hour:,.2f}/h, "
            f"p{self.slo.percentile:g} TTFT {b.ttft_p_s:.3f} s (SLO {self.slo.ttft_s:g}), "
            f"TPOT {b.tpot_p_s * 1e3:.1f} ms (SLO {self.slo.tpot_s * 1e3:g}); what binds: {b.binding}, "
            f"utilisation {b.utilisation:.2f}.",
        ]
        for mode in ("mixed", "chunked", "disaggregated"):
            other = next((c for c in self.candidates if c.mode == mode), None)
            if other is None or other is b or other.mode == b.mode:
                continue
            lines.append(
                f"Best {mode}: {_describe(other)} needs {other.num_gpus} GPUs (${other.cost_per_hour:,.2f}/h); "
                f"it is limited by {other.binding}." + _why(other, b))
        missing = [m for m in ("mixed", "chunked", "disaggregated") if not any(c.mode == m for c in self.candidates)]
        if missing:
            lines.append(f"No feasible configuration for: {', '.join(missing)}.")
        return "\n".join(lines)


def _why(other: Candidate, best: Candidate) -> str:
    if other.mode == "mixed" and "prefill interference" in other.binding:
        return " Prefill interference: each long prefill stalls every running decode, so TPOT forces more instances."
    if other.mode == "disaggregated" and other.num_gpus > best.num_gpus:
        return " Disaggregation pays for two pools and the KV move; at this load they are not kept busy."
    return ""


def _describe(c: Candidate) -> str:
    d = c.deployment
    if d.mode == "disaggregated":
        p, q = d.prefill, d.decode
        return (f"disaggregated {p.instances}x {p.gpu} tp{p.tp} prefill + {q.instances}x {q.gpu} tp{q.tp} decode")  # type: ignore[union-attr]
    p = d.pool
    extra = f", chunk {d.chunk_tokens}" if d.mode == "chunked" else ""
    return f"{d.mode} {p.instances}x {p.gpu} tp{p.tp}{extra}"  # type: ignore[union-attr]


@dataclass(frozen=True)
class _Single:
    gpu: str
    tp: int
    pm: PoolModel


def _nodes(pool: Pool) -> int:
    per = pool.tp * pool.pp
    if per >= NODE_GPUS:
        return pool.instances * math.ceil(per / NODE_GPUS)
    return math.ceil(pool.instances / (NODE_GPUS // per))


def _capacity(model: ModelSpec, d: Deployment, w: Workload, slo: SLO, upper: float) -> tuple[float, int]:
    rates = rate_grid(upper, 64)
    a = analyse(model, d, w, rates, slo.p)
    ok = a.meets(slo)
    if not ok.any():
        return 0.0, -1
    i = int(np.flatnonzero(ok).max())
    return float(rates[i]), i


def _candidate(model: ModelSpec, d: Deployment, w: Workload, slo: SLO, capacity: float) -> Candidate | None:
    a = analyse(model, d, w, np.array([w.rate]), slo.p)
    if not bool(a.meets(slo)[0]):
        return None
    gpus = d.num_gpus
    cost = sum(p.num_gpus * load_gpu(p.gpu).price_usd_per_hour for p in d.pools)
    tokens_per_s = w.rate * w.osl.mean
    return Candidate(
        mode=d.mode, deployment=d, num_gpus=gpus, nodes=sum(_nodes(p) for p in d.pools), cost_per_hour=cost,
        cost_per_million_tokens=cost / (tokens_per_s * 3600) * 1e6, ttft_p_s=float(a.ttft_p_s[0]),
        tpot_p_s=float(a.tpot_p_s[0]), utilisation=float(a.utilisation[0]), capacity_rps=capacity,
        binding=_binding(a, slo), output_tokens_per_s_per_gpu=tokens_per_s / gpus,
        tokens_per_s_per_user=1.0 / float(a.tpot_mean_s[0]),
    )


def _binding(a, slo: SLO) -> str:
    """The constraint closest to its limit: the TTFT or TPOT target, or the mode's busiest resource."""
    shares = {"TTFT target": float(a.ttft_p_s[0]) / slo.ttft_s, "TPOT target": float(a.tpot_p_s[0]) / slo.tpot_s,
              str(a.binding[0]): float(a.utilisation[0])}
    name = max(shares, key=shares.get)  # type: ignore[arg-type]
    return f"{name} ({shares[name]:.0%} used; {a.binding[0]} is the busiest resource)" if name != str(a.binding[0]) else name


def plan(
    model: ModelSpec | str,
    workload: Workload,
    slo: SLO,
    gpus: list[str] | None = None,
    modes: list[Mode] | None = None,
    objective: Objective = "gpus",
    tps: tuple[int, ...] = TPS,
    chunk_sizes: tuple[int, ...] = CHUNKS,
    weight_dtype: WeightDtype = "bf16",
    kv_dtype: KVDtype = "bf16",
    kv_link: Literal["scaleout", "scaleup"] = "scaleout",
) -> Plan:
    """Rank deployments that meet ``slo`` at ``workload.rate``; say why when none does."""
    m = load_model(model) if isinstance(model, str) else model
    gpu_ids = list(gpus) if gpus is not None else list_gpus()
    if not gpu_ids:
        raise ValueError("gpus: give at least one GPU id")
    if len(gpu_ids) > MAX_GPU_TYPES:
        raise ValueError(f"gpus: at most {MAX_GPU_TYPES} GPU types per plan, got {len(gpu_ids)}")
    for g in gpu_ids:
        load_gpu(g)  # unknown ids raise, naming the closest
    modes = list(modes) if modes is not None else ["mixed", "chunked", "disaggregated"]
    if not modes or any(x not in ("mixed", "chunked", "disaggregated") for x in modes):
        raise ValueError("modes: choose from mixed, chunked, disaggregated")
    if objective not in ("gpus", "cost", "cost_per_token"):
        raise ValueError("objective: choose gpus, cost or cost_per_token")
    if any(t not in (1, 2, 4, 8, 16) for t in tps):
        raise ValueError("tps: tensor-parallel degrees must be among 1, 2, 4, 8, 16")

    singles = []
    for g in gpu_ids:
        for tp in tps:
            pool = Pool(gpu=g, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
            pm = PoolModel.build(m, pool, workload)
            if pm.fits:
                singles.append(_Single(g, tp, pm))
    cands: list[Candidate] = []
    searched = 0
    for s in singles:
        service = PrefillService.of(s.pm, workload, slo.p)
        upper = 1.0 / service.mean_s
        configs: list[Deployment] = []
        if "mixed" in modes:
            configs.append(Deployment(mode="mixed", pool=s.pm.pool))
        if "chunked" in modes:
            configs += [Deployment(mode="chunked", pool=s.pm.pool, chunk_tokens=c) for c in chunk_sizes]
        for d in configs:
            searched += 1
            cap, _ = _capacity(m, d, workload, slo, upper)
            if cap <= 0:
                continue
            n = math.ceil(workload.rate / cap - 1e-9)
            if n > MAX_INSTANCES:
                continue
            for extra in range(3):  # grid rounding: step up until the exact rate check passes
                pool = d.pool.model_copy(update={"instances": n + extra})  # type: ignore[union-attr]
                c = _candidate(m, d.model_copy(update={"pool": pool}), workload, slo, cap * (n + extra))
                if c is not None:
                    cands.append(c)
                    break
    if "disaggregated" in modes:
        found, n_searched = _disaggregated(m, singles, workload, slo, kv_link)
        cands += found
        searched += n_searched

    key = {"gpus": lambda c: (c.num_gpus, c.cost_per_hour), "cost": lambda c: (c.cost_per_hour, c.num_gpus),
           "cost_per_token": lambda c: (c.cost_per_million_tokens, c.num_gpus)}[objective]
    cands.sort(key=key)
    pareto = _pareto(cands)
    if not cands:
        reason, nearest = _infeasible(m, singles, workload, slo, gpu_ids)
        return Plan(model=m.id, workload=workload, slo=slo, objective=objective, feasible=False, reason=reason,
                    nearest_feasible_slo=nearest, searched=searched)
    ranked = _best_of_each_mode_first(cands)
    return Plan(model=m.id, workload=workload, slo=slo, objective=objective, feasible=True, best=cands[0],
                candidates=tuple(ranked[:40]), pareto=pareto, searched=searched)


def _best_of_each_mode_first(cands: list[Candidate]) -> list[Candidate]:
    heads = []
    for mode in ("mixed", "chunked", "disaggregated"):
        c = next((c for c in cands if c.mode == mode), None)
        if c is not None:
            heads.append(c)
    rest = [c for c in cands if c not in heads]
    return sorted(heads, key=cands.index) + rest


def _disaggregated(m: ModelSpec, singles: list[_Single], w: Workload, slo: SLO, kv_link) -> tuple[list[Candidate], int]:
    """Decode capacity per decode config, prefill instance count per (prefill config, pair's KV time)."""
    decode_caps: list[tuple[_Single, float]] = []
    for s in singles:
        d = Deployment(mode="disaggregated", prefill=s.pm.pool, decode=s.pm.pool, kv_link=kv_link)
        relaxed = SLO(ttft_s=3600, tpot_s=slo.tpot_s, percentile=slo.percentile)
        upper = s.pm.batch_limit(w) / (w.osl.mean * float(s.pm.decode_s(1, w.isl.mean)))
        cap, _ = _capacity(m, d, w.model_copy(update={"rate": 1.0}), relaxed, upper)
        if cap > 0:
            decode_caps.append((s, cap))
    services = {(s.gpu, s.tp): PrefillService.of(s.pm, w, slo.p) for s in singles}
    out: list[Candidate] = []
    searched = 0
    n = np.arange(1, 513)
    for p in singles:
        service = services[(p.gpu, p.tp)]
        if service.quantile_s >= slo.ttft_s:
            continue
        for dec, cap in decode_caps:
            searched += 1
            proto = Deployment(mode="disaggregated", prefill=p.pm.pool, decode=dec.pm.pool, kv_link=kv_link)
            t_kv = kv_transfer_s(m, proto, w, p.pm, dec.pm, service.mean_s)
            _, wp = queue_wait(w.rate, service, n, slo.p)
            ok = (wp + service.quantile_s + t_kv <= slo.ttft_s) & (w.rate * service.mean_s / n < 1)
            if not ok.any():
                continue
            n_p = int(n[np.argmax(ok)])
            n_d = math.ceil(w.rate / cap - 1e-9)
            if n_d > MAX_INSTANCES:
                continue
            for extra in range(3):
                d = proto.model_copy(update={
                    "prefill": p.pm.pool.model_copy(update={"instances": n_p}),
                    "decode": dec.pm.pool.model_copy(update={"instances": n_d + extra})})
                c = _candidate(m, d, w, slo, min(cap * (n_d + extra), n_p / service.mean_s))
                if c is not None:
                    out.append(c)
                    break
    return out, searched


def _pareto(cands: list[Candidate]) -> tuple[ParetoPoint, ...]:
    pts = sorted(cands, key=lambda c: -c.tokens_per_s_per_user)
    frontier, best_gpu = [], -1.0
    for c in pts:
        if c.output_tokens_per_s_per_gpu > best_gpu:
            frontier.append(ParetoPoint(label=_describe(c), output_tokens_per_s_per_gpu=c.output_tokens_per_s_per_gpu,
                                        tokens_per_s_per_user=c.tokens_per_s_per_user))
            best_gpu = c.output_tokens_per_s_per_gpu
    return tuple(frontier)


def _infeasible(m: ModelSpec, singles: list[_Single], w: Workload, slo: SLO, gpu_ids: list[str]) -> tuple[str, SLO | None]:
    if not singles:
        return (f"{m.id} does not fit on any of {', '.join(gpu_ids)} at tp up to 8 "
                f"with the requested precision; try fp8 weights or larger GPUs"), None
    ctx = w.isl.mean + (w.osl.mean + 1) / 2
    floors = [(float(s.pm.decode_s(1, ctx)), s) for s in singles]
    tpot_floor, fs = min(floors, key=lambda x: x[0])
    ttfts = [(PrefillService.of(s.pm, w, slo.p).quantile_s, s) for s in singles]
    ttft_floor, ts = min(ttfts, key=lambda x: x[0])
    nearest = SLO(ttft_s=round(max(slo.ttft_s, 1.25 * ttft_floor), 4), tpot_s=round(max(slo.tpot_s, 1.25 * tpot_floor), 5),
                  percentile=slo.percentile)
    if slo.tpot_s < tpot_floor:
        return (f"TPOT {slo.tpot_s:g} s is below the batch-1 decode floor of {tpot_floor:.4f} s for {m.id} on "
                f"{fs.gpu} at tp={fs.tp}"), nearest
    if slo.ttft_s < ttft_floor:
        return (f"TTFT {slo.ttft_s:g} s is below the unloaded prefill time of {ttft_floor:.4f} s for {m.id} on "
                f"{ts.gpu} at tp={ts.tp} (p{slo.percentile:g} prompt)"), nearest
    return (f"each latency is reachable alone (TTFT floor {ttft_floor:.3f} s, TPOT floor {tpot_floor:.4f} s) "
            f"but no configuration meets both at {w.rate:g} req/s within {MAX_INSTANCES} instances"), nearest
