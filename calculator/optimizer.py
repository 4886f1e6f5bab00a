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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hardware_db.loader import list_gpus, load_gpu
from hardware_db.schema import GPUSpec, KVDtype, ModelSpec, WeightDtype

from . import budget
from .arguments import as_model, choice, flag, gpu_spec, integer, items, model_spec
from .engines import engine_gpu
from .errors import InputError
from .formula import quieted
from .kv_cache import kv_cache_bytes
from .limits import MAX_CHUNK_BUDGETS, MAX_GPU_TYPES
from .precision import KV_DTYPES, WEIGHT_DTYPES
from .serving import analyse, analyse_disaggregated, check_context, chunked, in_steps, per_token, served
from .serving.base import (
    Deployment,
    Mode,
    ModeArrays,
    Pool,
    PoolModel,
    PoolRows,
    PrefillService,
    SLOT_WAIT_SHARE,
    Scheduler,
    rate_grid,
)
from .speculation import Speculation

SCHEDULERS = ("hybrid", "prefill_first")
from .serving.disaggregated import kv_move_s, prefill_capacity, prefill_time
from .serving.workload import SLO, Workload

Objective = Literal["gpus", "cost", "cost_per_token"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
MODES: tuple[str, ...] = get_args(Mode)
TPS = (1, 2, 4, 8)
TP_CHOICES = (1, 2, 4, 8, 16)
MAX_TP = max(TP_CHOICES)
CHUNKS = (256, 512, 1024, 2048, 4096, 8192)
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 64, 65_536
MAX_INSTANCES = 4096
MAX_PREFILL_INSTANCES = 512
MAX_POOL_INSTANCES = 10_000  # Pool.instances' upper bound
MAX_CANDIDATES = 40
NODE_GPUS = 8
PIPELINE_STAGES = (2, 4)
DPS = (8, 16, 32)
DP_CHOICES = (2, 4, 8, 16, 32, 64)
CPS = (2, 4, 8)
"""Context-parallel degrees the planner tries (at the largest fitting tp) for long prompts."""
CP_MIN_PROMPT_TOKENS = 32_768
"""Mean prompt length from which context parallelism is tried: below it a tp <= 8 prefill is short."""
CP_CHOICES = (2, 4, 8, 16)
MAX_DP = max(DP_CHOICES)
"""Attention data-parallel degrees the planner tries for mixture-of-experts models (tp 1, experts over
all dp GPUs: DeepSeek-style DEP; 16 and 32 span nodes, so their all-to-all crosses the NIC)."""


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
    kv_transfer_s: float = Field(default=0.0, description="disaggregated: KV move per request inside the TTFT")


class ParetoPoint(BaseModel):
    """One configuration at one load: what each GPU produces against what each user sees."""

    model_config = ConfigDict(frozen=True)

    label: str
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float = Field(description="1 / mean TPOT")
    meets_slo: bool = Field(description="whether this point meets the plan's TTFT and TPOT targets")


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    workload: Workload
    slo: SLO
    objective: Objective
    engine: str = Field(default="generic", description="the engine profile whose efficiencies every candidate used "
                        "(generic: the GPU entries' own; calibration: the user's fit)")
    modes: tuple[Mode, ...] = ("mixed", "chunked", "disaggregated")
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
            f"p{self.slo.percentile:g} TTFT {b.ttft_p_s:.3f} s (SLO {self.slo.ttft_s:g} s), "
            f"TPOT {b.tpot_p_s * 1e3:.1f} ms (SLO {self.slo.tpot_s * 1e3:g} ms); what binds: {b.binding}, "
            f"utilisation {b.utilisation:.2f}.",
        ]
        for mode in ("mixed", "chunked", "disaggregated"):
            other = next((c for c in self.candidates if c.mode == mode), None)
            if other is None or other is b or other.mode == b.mode:
                continue
            lines.append(
                f"Best {mode}: {_describe(other)} needs {other.num_gpus} GPUs (${other.cost_per_hour:,.2f}/h); "
                f"it is limited by {other.binding}." + _why(other, b))
        missing = [m for m in self.modes if not any(c.mode == m for c in self.candidates)]
        if missing:
            lines.append(f"No feasible configuration for: {', '.join(missing)}.")
        return "\n".join(lines)


def _why(other: Candidate, best: Candidate) -> str:
    if other.mode == "mixed" and "prefill interference" in other.binding:
        return " Prefill interference: each long prefill stalls every running decode, so TPOT forces more instances."
    if other.mode == "disaggregated" and other.num_gpus > best.num_gpus:
        pre, dec = other.deployment.prefill, other.deployment.decode
        return (f" Its two pools are each sized alone ({pre.num_gpus} prefill + {dec.num_gpus} decode GPUs)"  # type: ignore[union-attr]
                f" and every request's KV move adds {other.kv_transfer_s * 1e3:.0f} ms to its TTFT.")
    return ""


def _describe(c: Candidate) -> str:
    return describe_deployment(c.deployment, instances=True)


def _layout(p: Pool) -> str:
    spec = f" +{p.spec.kind} x{p.spec.tokens}" if p.spec is not None else ""
    if p.dp > 1:
        return f"dp{p.dp} ep{p.ep}" + (f" tp{p.tp}" if p.tp > 1 else "") + (f" pp{p.pp}" if p.pp > 1 else "") + spec
    return (f"tp{p.tp}" + (f" cp{p.cp}" if p.cp > 1 else "") + (f" ep{p.ep}" if p.ep > 1 else "")
            + (f" pp{p.pp}" if p.pp > 1 else "") + spec)


@dataclass(frozen=True)
class _Single:
    gpu: str
    tp: int
    pp: int
    pm: PoolModel


def _nodes(pool: Pool) -> int:
    per = pool.tp * pool.pp * pool.dp * pool.cp
    if per >= NODE_GPUS:
        return pool.instances * math.ceil(per / NODE_GPUS)
    return math.ceil(pool.instances / (NODE_GPUS // per))


CAPACITY_GRID_POINTS = 40

CAP_TAIL_SHARE = 0.001
"""The largest share of requests a recommended batch cap may leave waiting for a slot (``_candidate_from``)."""


def _first_miss(rates: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Per row, the least grid rate at which the SLO is missed (inf where every grid rate meets it).
    Latency only grows with load, so a deployment is taken at no rate beyond it: where the closed form
    switches between two forms of a wait (a prompt that rides in the step in progress, or one that
    queues), it can meet an SLO at a rate above one at which it misses it."""
    missed, col = _first_miss_column(ok)
    return np.where(missed, rates[col], np.inf)


def _first_miss_column(ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: whether any grid rate misses the SLO, and the first column that does (0 where none)."""
    miss = ~np.atleast_2d(ok)
    return miss.any(axis=-1), np.argmax(miss, axis=-1)


def _largest_meeting(rates: np.ndarray, ok: np.ndarray, margin: np.ndarray | None = None) -> np.ndarray:
    """Per row, the largest rate below which the SLO is met at every grid rate (0 where the first
    misses it): the grid rate before the first miss (``_first_miss``), refined towards that miss where
    the SLO ``margin`` (``ModeArrays.margin``) crosses zero (linear in log-rate), so a capacity is not
    quantised down by the grid's spacing."""
    missed, col = _first_miss_column(ok)
    last = np.where(missed, col - 1, rates.size - 1)
    found = last >= 0
    last = np.maximum(last, 0)
    lo = np.where(found, rates[last], 0.0)
    if margin is None:
        return lo
    margin = np.atleast_2d(margin)
    nxt = np.minimum(last + 1, rates.size - 1)
    m_lo = np.take_along_axis(margin, last[..., None], -1)[..., 0]
    m_hi = np.take_along_axis(margin, nxt[..., None], -1)[..., 0]
    with np.errstate(all="ignore"):
        frac = np.where(np.isfinite(m_hi) & (m_lo > m_hi), m_lo / (m_lo - m_hi), 0.0)
        refined = lo * (rates[nxt] / np.maximum(rates[last], 1e-300)) ** np.clip(frac, 0.0, 1.0)
    return np.where(found & (last < rates.size - 1), refined, lo)


def _instances(rate: float, capacity: float) -> int:
    """Identical instances under Poisson splitting: N = ceil(rate / per-instance capacity)."""
    return math.ceil(rate / capacity - 1e-9) if capacity > 0 else MAX_INSTANCES + 1


def _with_instances(pool: Pool, n: int, whole_nodes: bool) -> Pool:
    """The pool at n instances; with ``whole_nodes``, as many instances as its whole 8-GPU nodes hold."""
    per = pool.tp * pool.pp * pool.dp * pool.cp
    if whole_nodes and per < NODE_GPUS:
        n = math.ceil(n / (NODE_GPUS // per)) * (NODE_GPUS // per)
    return pool.model_copy(update={"instances": n})


def _candidate_from(d: Deployment, a: ModeArrays, i, w: Workload, slo: SLO, capacity: float,
                    pools: tuple[PoolModel, ...], whole_nodes: bool) -> Candidate:
    """A candidate from element ``i`` of the mode's arrays (computed at this deployment's rate per instance).

    The decode pool's batch cap is set to 2 B + z sqrt(B) + 1: the ``max_num_seqs`` to configure.
    B + z sqrt(B) is the batch's (1 - s)-quantile if it were Poisson, s the smaller of CAP_TAIL_SHARE and
    SLOT_WAIT_SHARE (1 - p), the share of requests waiting for a slot at which the closed form counts the
    slot wait in the p-quantile of TTFT (z = 3.09 up to p90, 3.72 at p99: at 3.09 a p99 TTFT moved by
    up to 17% when evaluated at the cap); bursts of prompts stretch every lifetime at once,
    so the real batch is overdispersed (in simulation a cap at B + 3.1 sqrt(B) + 1 doubled the p90
    TTFT), hence the second B; below a mean of POISSON_CAP_BELOW the cap is at least the (1 - s)-quantile
    of a Poisson batch of mean 2 B (``_poisson_tail_cap``). On a pool that prefills, B counts the slots
    of prompts in prefill too, lambda E[TTFT] (an upper bound: it counts the wait for the first step;
    gemma-3-27b at 20,000-token prompts holds 1.1 such slots beside a decode batch of 0.3, and a cap of 5
    moved the p90 TTFT by 1%). Where that reaches the KV limit the cap is the limit rounded up: KV
    memory binds, and a cap below it would be a second, tighter limit than the one analysed (a
    fractional limit averages over the prompt lengths: at 402.6, a cap of 402 moved a p99 TTFT by 10%).
    """
    ttft_p, tpot_p, tpot_mean = float(a.ttft_p_s[i]), float(a.tpot_p_s[i]), float(a.tpot_mean_s[i])
    util, batch, busiest = float(a.utilisation[i]), float(a.batch[i]), str(a.binding[i])
    share = min(CAP_TAIL_SHARE, SLOT_WAIT_SHARE * (1 - slo.p))
    z = NormalDist().inv_cdf(1 - share)
    cap_pool = pools[-1]  # the pool that decodes
    held = batch  # slots in use: the decode batch, and on a pool that prefills the prompts in prefill
    if d.mode != "disaggregated":
        ttft_mean = float(a.ttft_mean_s[i])
        held += w.rate / d.pool.engines * ttft_mean if math.isfinite(ttft_mean) else 0.0  # type: ignore[union-attr]
    wanted = max(math.ceil(2 * held + z * math.sqrt(held) + 1), _poisson_tail_cap(2 * held, share), 1)
    e = cap_pool.tokens_per_step  # speculative decoding: the modes' KV limit counts outputs in steps
    limit = cap_pool.batch_limit(in_steps(w, e) if e > 1 else w)
    batch_cap = int(min(wanted, max(math.ceil(limit), 1), cap_pool.batch_cap))
    max_batch = batch_cap * cap_pool.pool.micro_batches  # per engine above; max_num_seqs is per instance (DP rank)
    if d.mode == "disaggregated":
        d = d.model_copy(update={"decode": d.decode.model_copy(update={"max_batch": max_batch})})  # type: ignore[union-attr]
    else:
        d = d.model_copy(update={"pool": d.pool.model_copy(update={"max_batch": max_batch})})  # type: ignore[union-attr]
    gpus = sum(_nodes(p) * NODE_GPUS for p in d.pools) if whole_nodes else d.num_gpus
    cost = sum(pm.gpu.price_usd_per_hour * (_nodes(pool) * NODE_GPUS if whole_nodes else pool.num_gpus)
               for pm, pool in zip(pools, d.pools))
    tokens_per_s = w.rate * w.osl.mean
    capacity = max(capacity, w.rate)  # it meets the SLO at the rate: the refined grid may sit just below it
    return Candidate(
        mode=d.mode, deployment=d, num_gpus=gpus, nodes=sum(_nodes(p) for p in d.pools), cost_per_hour=cost,
        cost_per_million_tokens=cost / (tokens_per_s * 3600) * 1e6, ttft_p_s=ttft_p, tpot_p_s=tpot_p,
        utilisation=util, capacity_rps=capacity, binding=_binding(ttft_p, tpot_p, util, busiest, slo),
        output_tokens_per_s_per_gpu=tokens_per_s / gpus, tokens_per_s_per_user=1.0 / tpot_mean,
        kv_transfer_s=float(a.kv_transfer_s[i]),
    )


POISSON_CAP_BELOW = 30.0
"""Mean batches below which ``_candidate_from`` also takes the Poisson tail itself (its normal
approximation is short there: at a mean of 0.14, P(N >= 2) is 0.009, not 0.001)."""


def _poisson_tail_cap(mean: float, share: float) -> int:
    """The least n with P(N >= n) < ``share`` for N ~ Poisson(``mean``), for means below
    POISSON_CAP_BELOW (0 above: the normal form of ``_candidate_from`` holds there)."""
    if mean >= POISSON_CAP_BELOW:
        return 0
    term = math.exp(-mean)  # P(N = 0)
    below, n = term, 1  # below = P(N < n)
    while 1 - below >= share:
        term *= mean / n
        below += term
        n += 1
    return n


def _binding(ttft_p: float, tpot_p: float, util: float, busiest: str, slo: SLO) -> str:
    """The constraint closest to its limit: the TTFT or TPOT target, or the mode's busiest resource."""
    shares = {"TTFT target": ttft_p / slo.ttft_s, "TPOT target": tpot_p / slo.tpot_s, busiest: util}
    name = max(shares, key=shares.get)  # type: ignore[arg-type]
    return f"{name} ({shares[name]:.0%} used; {busiest} is the busiest resource)" if name != busiest else name


RATE_BAND = np.array([1.0, 0.97, 0.9])
"""Loads, as shares of a candidate's rate per instance, at which it must also meet the SLO. Latency grows
with load, so below the rate this is met wherever it is met at the rate, except where the closed form
switches between two forms of a prompt's wait and is not monotone there: Llama-3.1-8B on one H100,
1,200-token prompts, mixed, p99 TTFT 295 ms at 18.26 req/s and 231 ms at 18.27 (simulated: 318-328 ms at
both), which planned one GPU for a 250 ms target at 18.27 req/s and two at 18.26. The first entry is the
rate itself (its analysis makes the candidate)."""

ROUNDING_STEPS = (-1, 0, 1, 2)
"""Instance counts tried around ceil(rate / capacity) (the capacity comes from a rate grid ~11%
apart); the fewest that meets the SLO at the exact rate wins."""


@dataclass(frozen=True)
class _Points:
    """Pareto material of one configuration: its stable loads (tokens/s per GPU, per user, whether
    the SLO holds, the rate per instance; ``rates`` None for a disaggregated candidate)."""

    per_gpu: np.ndarray
    per_user: np.ndarray
    meets: np.ndarray
    deployment: Deployment
    rates: np.ndarray | None


def _grid_points(protos: list[Deployment], rates: np.ndarray, a: ModeArrays, slo: SLO, w: Workload) -> list[_Points]:
    """The stable points of every configuration's rate grid."""
    stable = np.atleast_2d(a.stable)
    tpot = np.atleast_2d(a.tpot_mean_s)
    meets = np.atleast_2d(a.meets(slo))
    out = []
    for row, d in enumerate(protos):
        keep = stable[row]
        out.append(_Points((rates * w.osl.mean / d.num_gpus)[keep], 1.0 / tpot[row, keep], meets[row, keep], d,
                           rates[keep]))
    return out


@dataclass
class _Group:
    """One configuration's deployments analysed together: their capacity per instance (``caps``), the
    least grid rate that misses the SLO (``misses``), the instance counts tried and what they give."""

    pm: PoolModel
    protos: list[Deployment]
    caps: np.ndarray
    misses: np.ndarray
    stacked: bool  # its rows are in the stacked chunked analysis (else the prefill-first mixed mode's own)
    trial_n: np.ndarray | None = None
    per_instance: np.ndarray | None = None
    trials: ModeArrays | None = None


def _stacked_budgets(singles: list[_Single], w: Workload, slo: SLO, budgets: np.ndarray, whole: np.ndarray,
                     rates: list[np.ndarray | None]) -> list[ModeArrays | None]:
    """``chunked.analyse_budgets`` of every configuration's budget rows (``budgets``, ``whole``) at its rates
    (``rates[i]``: rows x n, per instance of ``singles[i]``'s pool, or None to skip it), the configurations stacked
    into one call per output unit (speculative twins count outputs in steps of their own): per configuration its
    arrays as ``served`` and ``per_token`` give them (None where skipped). A call's cost is mostly its fixed part
    (numpy dispatch, ~3 ms): Llama-3.1-70B over 4 GPU types (16 configurations, 7 budgets, 40 rates) took 144 ms
    in calls per configuration and takes 87 ms stacked, the same figures to 1e-12."""
    out: list[ModeArrays | None] = [None] * len(singles)
    joint = slo.attainment == "joint"
    by_steps: dict[float, list[int]] = {}
    for i, s in enumerate(singles):
        if rates[i] is not None:
            by_steps.setdefault(s.pm.tokens_per_step, []).append(i)
    for e, members in by_steps.items():
        budget.check()
        w_steps = in_steps(w, e) if e > 1 else w
        pools = PoolRows(tuple(singles[i].pm for i in members), np.repeat(np.arange(len(members)), budgets.size))
        # rates per instance, divided by the pool's streams here (``analyse_budgets`` divides by ``instances``)
        lam = np.concatenate([rates[i] / singles[i].pm.pool.streams for i in members])
        with np.errstate(all="ignore"):
            a = chunked.analyse_budgets(pools, w_steps, lam, slo.p, np.tile(budgets, len(members)),
                                        1, np.tile(whole, len(members)), joint)
        for j, i in enumerate(members):
            out[i] = served(per_token(a.rows(slice(j * budgets.size, (j + 1) * budgets.size)), e), singles[i].pm)
    return out


def _single_pool_candidates(m: ModelSpec, singles: list[_Single], w: Workload, slo: SLO, modes: list[Mode],
                            chunks: np.ndarray, whole_nodes: bool, points: list[_Points], scheduler: Scheduler = "hybrid"
                            ) -> tuple[list[Candidate], int]:
    """Mixed and chunked candidates on every (GPU, tp, pp): capacity per instance on a rate grid (all
    chunk budgets of all configurations in one array: ``_stacked_budgets``), then the fewest instances that
    meet the SLO at the workload's rate (all trial counts in one array: one instance at rate / N behaves as
    N instances at rate)."""
    joint = slo.attainment == "joint"
    out: list[Candidate] = []
    searched = 0
    # the hybrid mixed mode is the chunked analysis with one whole-prompt row: one call for both
    rows: list[tuple[str, float, bool]] = []
    if "mixed" in modes and scheduler == "hybrid":
        rows.append(("mixed", float(Deployment.model_fields["max_batched_tokens"].default), True))
    if "chunked" in modes:
        rows += [("chunked", float(c), False) for c in chunks]
    budgets = np.array([r[1] for r in rows])
    whole = np.array([r[2] for r in rows], dtype=bool)
    ones = [s.pm.pool.model_copy(update={"instances": 1}) for s in singles]
    grids = [rate_grid(1.0 / PrefillService.of(s.pm, w, slo.p).mean_s, CAPACITY_GRID_POINTS) for s in singles]
    stacked = _stacked_budgets(singles, w, slo, budgets, whole,
                               [np.broadcast_to(g, (len(rows), g.size)) if rows else None for g in grids])
    groups: list[list[_Group]] = []
    for s, one, rates, grid in zip(singles, ones, grids, stacked):
        budget.check()
        mine: list[_Group] = []
        if rows:
            protos = [Deployment(mode="mixed", pool=one, scheduler=scheduler) if kind == "mixed" else
                      Deployment(mode="chunked", pool=one, chunk_tokens=int(c)) for kind, c, _ in rows]
            met_grid = grid.meets(slo)
            caps, misses = _largest_meeting(rates, met_grid, grid.margin(slo)), _first_miss(rates, met_grid)
            points.extend(_grid_points(protos, rates, grid, slo, w))
            mine.append(_Group(s.pm, protos, caps, misses, True))
        if "mixed" in modes and scheduler != "hybrid":
            d = Deployment(mode="mixed", pool=one, scheduler=scheduler)
            a = analyse(m, d, w, rates, slo.p, (s.pm,), joint)
            met_grid = a.meets(slo)
            caps, misses = _largest_meeting(rates, met_grid, a.margin(slo)), _first_miss(rates, met_grid)
            points.extend(_grid_points([d], rates, a, slo, w))
            mine.append(_Group(s.pm, [d], caps, misses, False))
        for g in mine:
            searched += len(g.protos)
            n = np.array([_instances(w.rate, c) for c in g.caps])
            trial_n = np.maximum(n[:, None] + np.array(ROUNDING_STEPS)[None, :], 1)
            if whole_nodes and one.tp * one.pp * one.dp * one.cp < NODE_GPUS:
                per_node = NODE_GPUS // (one.tp * one.pp * one.dp * one.cp)
                trial_n = np.ceil(trial_n / per_node) * per_node
            g.trial_n, g.per_instance = trial_n, w.rate / np.minimum(trial_n, MAX_INSTANCES)
            if not g.stacked:  # each count at its exact rate and at the loads just below it (RATE_BAND)
                with np.errstate(all="ignore"):
                    g.trials = analyse(m, g.protos[0], w, (g.per_instance[..., None] * RATE_BAND).reshape(-1), slo.p,
                                       (s.pm,), joint)
        groups.append(mine)
    # every configuration's trial counts, at their rates and the loads just below (RATE_BAND), in one call
    band = [next(((g.per_instance[..., None] * RATE_BAND).reshape(len(g.protos), -1) for g in mine if g.stacked), None)
            for mine in groups]
    for mine, trials in zip(groups, _stacked_budgets(singles, w, slo, budgets, whole, band)):
        for g in mine:
            if g.stacked:
                g.trials = trials
    for mine in groups:
        budget.check()
        for g in mine:
            a = g.trials
            met = np.atleast_2d(a.meets(slo)).reshape(*g.trial_n.shape, RATE_BAND.size).all(axis=-1)
            # met at the exact rate and just below it, and below every grid rate at which it is missed (``_first_miss``)
            ok = met & (g.trial_n <= MAX_INSTANCES) & (g.per_instance < g.misses[:, None])
            for row, d in enumerate(g.protos):
                if not ok[row].any():
                    continue
                col = int(np.argmax(ok[row]))
                pool = d.pool.model_copy(update={"instances": int(g.trial_n[row, col])})
                idx = (row, col * RATE_BAND.size) if np.ndim(a.stable) == 2 else col * RATE_BAND.size
                out.append(_candidate_from(d.model_copy(update={"pool": pool}), a, idx, w, slo,
                                           float(g.caps[row]) * pool.instances, (g.pm,), whole_nodes))
    return out, searched


def _gpu_specs(gpus: Any) -> list[GPUSpec]:
    """The candidate GPUs: None for the whole database; one id or spec, or a list of them (at most
    MAX_GPU_TYPES), each at most once."""
    if gpus is None:
        return [load_gpu(g) for g in list_gpus()]
    specs = [gpu_spec(g, f"gpus.{i}") for i, g in enumerate(items("gpus", gpus, MAX_GPU_TYPES, (str, GPUSpec)))]
    seen: set[str] = set()
    for i, g in enumerate(specs):
        if g.id in seen:
            raise InputError(f"gpus.{i}", f"{g.id!r} is given twice; each GPU id at most once")
        seen.add(g.id)
    return specs


@quieted
def plan(
    model: ModelSpec | str,
    workload: Workload | Mapping[str, Any],
    slo: SLO | Mapping[str, Any],
    gpus: Sequence[str | GPUSpec | Mapping[str, Any]] | str | GPUSpec | None = None,
    modes: Sequence[Mode] | Mode | None = None,
    objective: Objective = "gpus",
    tps: Sequence[int] | int = TPS,
    chunk_sizes: Sequence[int] | int = CHUNKS,
    weight_dtype: WeightDtype = "bf16",
    kv_dtype: KVDtype = "bf16",
    kv_link: Literal["scaleout", "scaleup"] = "scaleout",
    whole_nodes: bool = False,
    scheduler: Scheduler = "hybrid",
    dps: Sequence[int] | int = DPS,
    cps: Sequence[int] | int = CPS,
    spec: Speculation | Mapping[str, Any] | None = None,
    calibration: Any = None,
    engine: str = "generic",
    _verify_nearest: bool = True,
) -> Plan:
    """Rank deployments that meet ``slo`` at ``workload.rate``; say why when none does.

    ``workload`` and ``slo`` are the models or mappings of their fields. ``gpus`` are database ids
    or inline ``GPUSpec`` records (a custom GPU; it wins over a database entry with the same id), at
    most 16; a lone id or spec is one GPU type (a string is never read as a list of characters);
    ``None`` searches the whole database. ``modes``, ``tps`` and ``chunk_sizes`` likewise take one
    value or a list. ``whole_nodes`` bills every pool by whole 8-GPU nodes (and fills them with
    instances). ``scheduler`` is the mixed mode's policy: ``"hybrid"`` (vLLM V1, SGLang, TensorRT-LLM)
    or ``"prefill_first"`` (vLLM V0). Invalid arguments raise ``InputError`` naming the argument (``gpus.1``,
    ``workload.isl.samples``), among them a workload whose longest prompt and output exceed the
    model's context window. The search checks ``pc.deadline``'s budget between configurations.
    Pipeline stages (pp 2, 4) are tried only for GPU types on which the model does not fit at the
    largest tp: in serving, pp only adds stage hand-offs when tp alone suffices. For a
    mixture-of-experts model, ``dps`` are the attention data-parallel degrees tried (tp 1, ep = dp;
    an empty list tries none). ``cps`` are the context-parallel degrees tried when the mean prompt is
    at least CP_MIN_PROMPT_TOKENS (an empty list tries none). ``spec`` (a ``Speculation``) is tried on
    every pool that decodes, beside the same pool without it; the ranking keeps whichever wins.
    ``calibration`` (an ``Efficiency``, a mapping or a calibration YAML from ``pdplan validate`` or
    ``pdplan calibrate``) replaces the efficiencies of every candidate GPU; ``engine`` names an engine
    profile (``list_engines()``) applied to every candidate GPU instead (``generic``: their own).
    """
    m = model_spec(model)
    workload = as_model("workload", workload, Workload)
    slo = as_model("slo", slo, SLO)
    given = _gpu_specs(gpus)
    specs = [engine_gpu(g, engine, calibration) for g in given]
    engine_used = "calibration" if calibration is not None else engine
    gpu_ids = [g.id for g in specs]
    modes = list(MODES) if modes is None else [choice(f"modes.{i}", x, MODES)
                                               for i, x in enumerate(items("modes", modes, len(MODES)))]
    choice("objective", objective, OBJECTIVES)
    choice("scheduler", scheduler, SCHEDULERS)
    tps = tuple(choice(f"tps.{i}", integer(f"tps.{i}", t, 1, MAX_TP), TP_CHOICES)
                for i, t in enumerate(items("tps", tps, len(TP_CHOICES), (int, np.integer))))
    dps = () if isinstance(dps, (list, tuple)) and not dps else tuple(
        choice(f"dps.{i}", integer(f"dps.{i}", d, 2, MAX_DP), DP_CHOICES)
        for i, d in enumerate(items("dps", dps, len(DP_CHOICES), (int, np.integer))))
    cps = () if isinstance(cps, (list, tuple)) and not cps else tuple(
        choice(f"cps.{i}", integer(f"cps.{i}", c, 2, max(CP_CHOICES)), CP_CHOICES)
        for i, c in enumerate(items("cps", cps, len(CP_CHOICES), (int, np.integer))))
    chunk_sizes = tuple(integer(f"chunk_sizes.{i}", c, MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS)
                        for i, c in enumerate(items("chunk_sizes", chunk_sizes, MAX_CHUNK_BUDGETS, (int, np.integer))))
    choice("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    choice("kv_dtype", kv_dtype, KV_DTYPES)
    choice("kv_link", kv_link, ("scaleout", "scaleup"))
    whole_nodes = flag("whole_nodes", whole_nodes)
    check_context(m, workload)

    singles = _singles(m, specs, tps, workload, weight_dtype, kv_dtype, dps, cps)
    if spec is not None:
        spec = as_model("spec", spec, Speculation)
        singles += _speculative_twins(m, singles, spec, workload)
    cands: list[Candidate] = []
    points: list[_Points] = []  # Pareto material: every stable (configuration, load) on the rate grids
    chunks = np.asarray(sorted(set(chunk_sizes)), dtype=float)
    found, searched = _single_pool_candidates(m, singles, workload, slo, modes, chunks, whole_nodes, points, scheduler)
    cands += found
    if "disaggregated" in modes:
        found, n_searched = _disaggregated(m, singles, workload, slo, kv_link, whole_nodes, objective)
        cands += found
        searched += n_searched

    key = {"gpus": lambda c: (c.num_gpus, c.cost_per_hour), "cost": lambda c: (c.cost_per_hour, c.num_gpus),
           "cost_per_token": lambda c: (c.cost_per_million_tokens, c.num_gpus)}[objective]
    cands.sort(key=key)
    pareto = _pareto(points, cands)
    if not cands:
        reason, start = _infeasible(m, singles, workload, slo, gpu_ids)
        nearest = None
        for factor in NEAREST_SLO_FACTORS if start is not None and _verify_nearest else ():
            budget.check()
            trial = _slo_or_none(start.ttft_s * factor, start.tpot_s * factor, slo)
            # the same search at the looser SLO: the same GPUs (the whole database again where none were given: it
            # may hold more types than a list may name), deployments and efficiencies
            if trial is not None and plan(m, workload, trial, None if gpus is None else given, modes, objective, tps,
                                          chunk_sizes, weight_dtype, kv_dtype, kv_link, whole_nodes, scheduler, dps=dps,
                                          cps=cps, spec=spec, calibration=calibration, engine=engine,
                                          _verify_nearest=False).feasible:
                nearest = trial
                break
        return Plan(model=m.id, workload=workload, slo=slo, objective=objective, modes=tuple(modes), feasible=False,
                    engine=engine_used,
                    reason=reason,
                    nearest_feasible_slo=nearest, searched=searched)
    ranked = _best_of_each_mode_first(cands)
    return Plan(model=m.id, workload=workload, slo=slo, objective=objective, modes=tuple(modes), feasible=True,
                engine=engine_used,
                best=cands[0],
                candidates=tuple(ranked[:MAX_CANDIDATES]), pareto=pareto, searched=searched)


def _singles(m: ModelSpec, specs: list[GPUSpec], tps: tuple[int, ...], w: Workload, weight_dtype: WeightDtype,
             kv_dtype: KVDtype, dps: tuple[int, ...] = DPS, cps: tuple[int, ...] = CPS) -> list[_Single]:
    """One PoolModel per (GPU, tp[, pp]) on which the model and one sequence's KV fit, and for a
    mixture-of-experts model that does not fit one GPU per (GPU, dp) with attention data-parallelism
    and ep = dp, and for long prompts per (GPU, cp) at the widest tp."""
    out = []
    for gpu in specs:
        g = gpu.id
        for tp in sorted(set(tps)):
            budget.check()
            if m.num_attention_heads % tp:
                continue  # heads must split evenly over the tensor-parallel group
            pm = PoolModel.build(m, Pool(gpu=g, tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype), w, gpu)
            if pm.fits:
                out.append(_Single(g, tp, 1, pm))
        top_tp = max(t for t in tps if m.num_attention_heads % t == 0) if any(
            m.num_attention_heads % t == 0 for t in tps) else None
        if top_tp is not None and not any(s.gpu == g for s in out):
            for pp in PIPELINE_STAGES:
                budget.check()
                pool = Pool(gpu=g, tp=top_tp, pp=pp, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
                if pp > m.num_layers:
                    break
                pm = PoolModel.build(m, pool, w, gpu)
                if pm.fits:
                    out.append(_Single(g, top_tp, pp, pm))
                    break
        # attention-DP + EP pays when the experts do not fit one GPU (each rank then holds only its share);
        # a mixture-of-experts model that fits one GPU is served best by more whole instances
        fits_one = any(s.gpu == g and s.tp == 1 and s.pm.pool.pp == 1 for s in out)
        for dp in [d for d in dps if d <= m.moe.num_experts] if m.moe is not None and not fits_one else ():
            budget.check()
            pool = Pool(gpu=g, tp=1, dp=dp, ep=dp, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
            pm = PoolModel.build(m, pool, w, gpu)
            if pm.fits:
                out.append(_Single(g, 1, 1, pm))
        # long prompts: context parallelism at the largest tensor-parallel degree that fits
        widest = max((s.tp for s in out if s.gpu == g and s.pm.pool.pp == 1 and s.pm.pool.dp == 1), default=None)
        for cp in cps if widest is not None and w.isl.mean >= CP_MIN_PROMPT_TOKENS else ():
            budget.check()
            pm = PoolModel.build(m, Pool(gpu=g, tp=widest, cp=cp, weight_dtype=weight_dtype, kv_dtype=kv_dtype), w, gpu)
            if pm.fits:
                out.append(_Single(g, widest, 1, pm))
    return out


def _speculative_twins(m: ModelSpec, singles: list[_Single], spec: Speculation, w: Workload) -> list[_Single]:
    """Each single pool again with speculative decoding, where the draft's memory still lets it fit."""
    out = []
    for s in singles:
        budget.check()
        pm = PoolModel.build(m, s.pm.pool.model_copy(update={"spec": spec}), w, s.pm.gpu)
        if pm.fits:
            out.append(_Single(s.gpu, s.tp, s.pp, pm))
    return out


def _best_of_each_mode_first(cands: list[Candidate]) -> list[Candidate]:
    """The ranking with the best of each mode moved to the front (in rank order). Positions, not
    ``==``: comparing pydantic records field by field over thousands of candidates costs milliseconds."""
    heads = []
    for mode in ("mixed", "chunked", "disaggregated"):
        i = next((i for i, c in enumerate(cands) if c.mode == mode), None)
        if i is not None:
            heads.append(i)
    first = set(heads)
    return [cands[i] for i in sorted(heads)] + [c for i, c in enumerate(cands) if i not in first]


PARTNERS_PER_DECODE_POOL = 3
PAIRS_TRIED_PER_DECODE_POOL = 12
"""Pairs built in full per decode pool, cheapest first: beyond that its partners are dearer and fail
for the same reason (the closed-form sizing of each side missed something the full pair sees)."""
PREFILL_BUDGET_TOKENS = int(Deployment.model_fields["max_batched_tokens"].default)
"""The token budget of a prefill step the planner sizes prefill pools with (the engines' default)."""
"""Prefill pools kept per decode pool (the cheapest by the objective): the rest are dominated."""


def _disaggregated(m: ModelSpec, singles: list[_Single], w: Workload, slo: SLO, kv_link, whole_nodes: bool,
                   objective: Objective) -> tuple[list[Candidate], int]:
    """xPyD candidates. The decode side needs the fewest instances whose TPOT meets the SLO at the
    rate, and whose wait for a decode slot leaves room in the TTFT; the prefill side the fewest whose M/G/N wait + prefill + the pair's KV move meet the TTFT.
    Both are found without the other, so every pair is sized in closed form; full candidates are
    built for the cheapest prefill partners of each decode pool."""
    decode_side: list[tuple[_Single, Pool, float]] = []
    # every decode pool's capacity alone (a prefill pool too large to queue, so only decode limits it: it must
    # meet the TPOT, and the TTFT with the prompt's own step, its KV move and the wait for a decode slot; a
    # pair only adds to it), all in one call (``analyse_disaggregated``)
    ones = [s.pm.pool.model_copy(update={"instances": 1}) for s in singles]
    alone = [Deployment(mode="disaggregated", decode=one, kv_link=kv_link,
                        prefill=s.pm.pool.model_copy(update={"instances": MAX_POOL_INSTANCES, "spec": None}))
             for s, one in zip(singles, ones)]
    grids = [rate_grid(s.pm.batch_limit(w) / (w.osl.mean * s.pm.decode_point(1.0, w.isl.mean)),
                       CAPACITY_GRID_POINTS) for s in singles]
    budget.check()
    at_one = w.model_copy(update={"rate": 1.0})
    graded = analyse_disaggregated(m, alone, [(s.pm, s.pm) for s in singles], at_one, grids, slo.p,
                                   slo.attainment == "joint")
    sized: list[tuple[int, list[Pool], float, float]] = []
    for i, (one, rates, a) in enumerate(zip(ones, grids, graded)):
        ok = a.meets(slo)
        cap, first_miss = float(_largest_meeting(rates, ok, a.margin(slo))[0]), float(_first_miss(rates, ok)[0])
        n_d = _instances(w.rate, cap)
        if n_d > MAX_INSTANCES:
            continue
        sized.append((i, [_with_instances(one, n_d + e, whole_nodes) for e in ROUNDING_STEPS if n_d + e >= 1],
                      cap, first_miss))
    # one decode instance at rate / N is N instances at rate (the prefill side is ignored here); each count at its
    # rate and the loads just below it (RATE_BAND), and below the grid's first miss (``_first_miss``); all pools'
    # counts in one call (rows padded to the most counts with their last)
    most = max((len(t) for _, t, _, _ in sized), default=0)
    per_instance = [np.array([w.rate / t.instances for t in trials]) for _, trials, _, _ in sized]
    budget.check()
    tried = analyse_disaggregated(
        m, [alone[i] for i, _, _, _ in sized], [(singles[i].pm, singles[i].pm) for i, _, _, _ in sized], w,
        [(np.pad(r, (0, most - r.size), mode="edge")[:, None] * RATE_BAND).reshape(-1) for r in per_instance],
        slo.p)
    for (i, trials, cap, first_miss), r, a in zip(sized, per_instance, tried):
        cells = r.size * RATE_BAND.size
        met = (a.stable & (a.tpot_p_s <= slo.tpot_s) & (a.ttft_p_s <= slo.ttft_s))[:cells].reshape(r.size, -1)
        ok = met.all(axis=-1) & (r < first_miss)
        if ok.any():
            decode_side.append((singles[i], trials[int(np.argmax(ok))], cap))
    price = {"gpus": lambda pm, n: float(n), "cost": lambda pm, n: pm.gpu.price_usd_per_hour * n,
             "cost_per_token": lambda pm, n: pm.gpu.price_usd_per_hour * n}[objective]
    pairs: list[tuple[float, int, _Single, Pool, _Single, Pool, float, float]] = []
    searched = 0
    # the KV a decode instance receives per request: every tensor-parallel rank holds its own MLA latent
    kv_received = [float(kv_cache_bytes(m, w.isl.mean, dec.pm.pool.kv_dtype, tp=dec.pm.pool.tp))
                   for dec, _, _ in decode_side]
    # p-quantile of arrival to end of prefill for N prefill instances (batched steps): from the fewest that keep
    # up with the rate to four times as many (by then the queue is gone, and a TTFT that is still missed stays
    # missed); every prefill pool in one call (``prefill_time`` of ``PoolRows``, rows padded with their last N)
    sides: list[tuple[_Single, PrefillService, float, np.ndarray]] = []
    for p in singles:
        budget.check()
        if p.pm.pool.spec is not None:
            continue  # a prefill pool does not decode: its speculative twin is the same pool
        service = PrefillService.of(p.pm, w, slo.p)
        if service.quantile_s >= slo.ttft_s:
            continue
        pool_rps = prefill_capacity(p.pm, w, PREFILL_BUDGET_TOKENS) * p.pm.pool.streams
        fewest = max(1, math.floor(w.rate / pool_rps)) if pool_rps > 0 else MAX_PREFILL_INSTANCES
        n = np.arange(fewest, min(MAX_PREFILL_INSTANCES, 4 * fewest + 16) + 1)
        if n.size:
            sides.append((p, service, pool_rps, n))
    if sides:  # a row per (pool, N): each pool's cells as it has them alone (rows of one width would pad)
        budget.check()
        servers = np.concatenate([n * p.pm.pool.streams for p, _, _, n in sides])[:, None]
        pres = PoolRows.each([p.pm for p, _, _, n in sides for _ in range(n.size)])
        with np.errstate(all="ignore"):
            _, waits, busy_all = prefill_time(pres if len(sides) > 1 else sides[0][0].pm, w,
                                              np.full(servers.shape, w.rate), servers, PREFILL_BUDGET_TOKENS, [slo.p])
        ends = np.cumsum([n.size for _, _, _, n in sides])
    for row, (p, service, pool_rps, n) in enumerate(sides):
        budget.check()
        cut = slice(ends[row] - n.size, ends[row])
        prefill_q, busy = waits[cut, 0, 0], busy_all[cut, 0]
        stable = (busy < 1) & np.isfinite(prefill_q)
        for j, (dec, dec_pool, cap) in enumerate(decode_side):
            budget.check()
            searched += 1
            t_kv = kv_move_s(m, kv_received[j], p.pm, dec.pm, kv_link, False, service.mean_s)
            ok = (prefill_q + t_kv <= slo.ttft_s) & stable
            if not ok.any():
                continue
            pre_pool = _with_instances(p.pm.pool, int(n[np.argmax(ok)]), whole_nodes)
            key = price(p.pm, pre_pool.num_gpus) + price(dec.pm, dec_pool.num_gpus)
            capacity = min(cap * dec_pool.instances, pre_pool.instances * pool_rps)
            pairs.append((key, j, p, pre_pool, dec, dec_pool, capacity, t_kv))
    # each decode pool's cheapest partners, up to PAIRS_TRIED_PER_DECODE_POOL of them, at the workload's rate in
    # one call; then in price order the first PARTNERS_PER_DECODE_POOL of each that meet the SLO
    ranked = sorted(pairs, key=lambda x: x[0])
    listed: dict[int, int] = {}
    trial = []
    for pair in ranked:
        listed[pair[1]] = listed.get(pair[1], 0) + 1
        if listed[pair[1]] <= PAIRS_TRIED_PER_DECODE_POOL:
            trial.append(pair)
    budget.check()
    # the pairs analysed, validated (from validated pools, which pydantic does not validate again: ~3 us a
    # Deployment, where model_construct, which fills the defaults field by field, takes ~11)
    ds = [Deployment(mode="disaggregated", prefill=pre_pool, decode=dec_pool, kv_link=kv_link)
          for _, _, _, pre_pool, _, dec_pool, _, _ in trial]
    pools = [(p.pm, dec.pm) for _, _, p, _, dec, _, _, _ in trial]
    analysed = analyse_disaggregated(m, ds, pools, w, [np.array([w.rate])] * len(trial), slo.p,
                                     slo.attainment == "joint")
    out: list[Candidate] = []
    kept: dict[int, int] = {}
    for (_, j, _, pre_pool, _, dec_pool, capacity, _), pms, a in zip(trial, pools, analysed):
        if kept.get(j, 0) >= PARTNERS_PER_DECODE_POOL:
            continue
        if bool(a.meets(slo)[0]):
            d = Deployment(mode="disaggregated", prefill=pre_pool, decode=dec_pool, kv_link=kv_link)
            out.append(_candidate_from(d, a, 0, w, slo, capacity, pms, whole_nodes))
            kept[j] = kept.get(j, 0) + 1
    return out, searched


PARETO_STEP = 1.25
"""A frontier point is kept when it gives at least 25% more tokens/s per GPU than the previous one."""


def _pareto(points: list[_Points], cands: list[Candidate]) -> tuple[ParetoPoint, ...]:
    """The frontier of output tokens/s per GPU against tokens/s per user over every single-pool
    configuration at every load on its rate grid, and the disaggregated candidates.

    Points are taken from the most tokens/s per user down (ties: the most per GPU first, then the
    search order); each kept point beats the last kept one's tokens/s per GPU by PARETO_STEP. The
    next kept point is the first whose running maximum of tokens/s per GPU passes the threshold, so
    the scan is one binary search per kept point (all points before it stay under the threshold).
    """
    blocks = [*points, *(_Points(np.array([c.output_tokens_per_s_per_gpu]), np.array([c.tokens_per_s_per_user]),
                                 np.array([True]), c.deployment, None) for c in cands if c.mode == "disaggregated")]
    if not blocks:
        return ()
    budget.check()
    per_gpu = np.concatenate([b.per_gpu for b in blocks])
    per_user = np.concatenate([b.per_user for b in blocks])
    block = np.repeat(np.arange(len(blocks)), [b.per_gpu.size for b in blocks])
    start = np.cumsum([0] + [b.per_gpu.size for b in blocks])
    order = np.lexsort((-per_gpu, -per_user))  # stable: equal points keep the search order
    running = np.maximum.accumulate(per_gpu[order])
    frontier: list[ParetoPoint] = []
    best_gpu, i = -1.0, 0
    while i < order.size:
        budget.check()
        k = int(order[i])
        b, j = blocks[block[k]], k - start[block[k]]
        label = describe_deployment(b.deployment) + (
            f" at {float(b.rates[j]):.3g} req/s per instance" if b.rates is not None else "")
        frontier.append(ParetoPoint(label=label, output_tokens_per_s_per_gpu=float(per_gpu[k]),
                                    tokens_per_s_per_user=float(per_user[k]), meets_slo=bool(b.meets[j])))
        best_gpu = float(per_gpu[k])
        i = int(np.searchsorted(running, best_gpu * PARETO_STEP, side="right"))
    return tuple(frontier)


def describe_deployment(d: Deployment, instances: bool = False) -> str:
    """'mixed 3x h100-sxm tp4', 'chunked h200-sxm tp2, chunk 512', 'disaggregated ... prefill + ... decode'."""
    def pool(p: Pool) -> str:
        return (f"{p.instances}x " if instances or d.mode == "disaggregated" else "") + f"{p.gpu} {_layout(p)}"

    if d.mode == "disaggregated":
        return f"disaggregated {pool(d.prefill)} prefill + {pool(d.decode)} decode"  # type: ignore[arg-type]
    extra = f", chunk {d.chunk_tokens}" if d.mode == "chunked" else ""
    return f"{d.mode} {pool(d.pool)}{extra}"  # type: ignore[arg-type]


def _slo_or_none(ttft_s: float, tpot_s: float, like: SLO) -> SLO | None:
    """``like`` with these TTFT and TPOT targets (rounded for display; its percentile, ITL target and
    attainment kept), or None when they are beyond the SLO's own bounds."""
    try:
        return SLO.model_validate({**like.model_dump(), "ttft_s": round(ttft_s, 4), "tpot_s": round(tpot_s, 5)})
    except ValueError:
        return None


NEAREST_SLO_FACTORS = (1.0, 1.5, 2.0, 4.0, 8.0)
"""Loosening steps tried, from the latency floors up, for the nearest SLO that a plan can meet."""


def _infeasible(m: ModelSpec, singles: list[_Single], w: Workload, slo: SLO, gpu_ids: list[str]) -> tuple[str, SLO | None]:
    if not singles:
        return (f"{m.id} does not fit on any of {', '.join(gpu_ids)} at tp up to 8 "
                f"with the requested precision; try fp8 weights or larger GPUs"), None
    ctx = w.isl.mean + (w.osl.mean + 1) / 2
    floors, ttfts = [], []
    for s in singles:
        budget.check()
        floors.append((float(s.pm.decode_s(1, ctx)), s))
        ttfts.append((PrefillService.of(s.pm, w, slo.p).quantile_s, s))
    tpot_floor, fs = min(floors, key=lambda x: x[0])
    ttft_floor, ts = min(ttfts, key=lambda x: x[0])
    nearest = _slo_or_none(max(slo.ttft_s, 1.25 * ttft_floor), max(slo.tpot_s, 1.25 * tpot_floor), slo)
    if slo.tpot_s < tpot_floor:
        return (f"TPOT {slo.tpot_s:g} s is below the batch-1 decode floor of {tpot_floor:.4f} s for {m.id} on "
                f"{fs.gpu} at tp={fs.tp}" + (f" pp={fs.pp}" if fs.pp > 1 else "")), nearest
    if slo.ttft_s < ttft_floor:
        return (f"TTFT {slo.ttft_s:g} s is below the unloaded prefill time of {ttft_floor:.4f} s for {m.id} on "
                f"{ts.gpu} at tp={ts.tp} (p{slo.percentile:g} prompt)"), nearest
    return (f"each latency is reachable alone (TTFT floor {ttft_floor:.3f} s, TPOT floor {tpot_floor:.4f} s) "
            f"but no configuration meets both at {w.rate:g} req/s within {MAX_INSTANCES} instances"), nearest
