"""A plan analyses every (GPU, tp) configuration's chunk budgets in one call (``PoolRows``): each row must
be what its pool gives alone, whatever the other pools beside it (their batch grids, limits and slot counts
differ)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import calculator as pc
from calculator import optimizer as o
from calculator.serving import chunked
from calculator.serving.base import GridLookup, PoolRows, PrefillService, batch_grid, rate_grid

BUDGETS = np.array([8192.0, 512.0, 2048.0, 8192.0])
WHOLE = np.array([True, False, False, False])


def _singles(model: str, w: pc.Workload, gpus: list[str], dtype: str = "bf16"):
    m = pc.load_model(model)
    return o._singles(m, [pc.load_gpu(g) for g in gpus], o.TP_CHOICES, w, dtype, "bf16", o.DPS, o.CPS)


CASES = {
    "llama-70b long prompts": ("llama-3.1-70b", pc.Workload(rate=12.0, isl=4000, osl=500),
                               ["h100-sxm", "h20", "a100-sxm-80gb"], "bf16", 0.9, False),
    "llama-8b joint, bursty": ("llama-3.1-8b", pc.Workload(rate=20, isl={"mean": 1500, "cv": 0.8}, osl=300,
                                                           arrival_cv=2.0), ["h100-sxm", "l4"], "bf16", 0.99, True),
    "moe fp8": ("qwen3-30b-a3b", pc.Workload(rate=12.0, isl=2000, osl=500), ["h100-sxm", "h200-sxm"], "fp8", 0.9,
                False),
    "sliding window": ("gemma-3-27b", pc.Workload(rate=2.0, isl=20000, osl=300), ["h100-sxm", "h200-sxm"], "bf16",
                       0.9, False),
    # whole prompts batched in the decodes' steps (bulk service, ``hybrid_bulk_wait``) on pools of the same
    # prompts a step: each pool's step chain as alone (shared, a review's knife-edge plan changed)
    "bulk prompts, one step budget": ("gpt-oss-20b", pc.Workload(rate=2.0, isl={"mean": 500, "cv": 0.5}, osl=800),
                                      ["gaudi3", "a100-sxm-80gb", "mi355x", "h100-pcie"], "fp8", 0.5, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stacked_rows_equal_each_pool_alone(case: str) -> None:
    model, w, gpus, dtype, p, joint = CASES[case]
    singles = _singles(model, w, gpus, dtype)
    assert len(singles) > 2  # pools side by side (of different batch limits but in the last case)
    rates = [np.broadcast_to(rate_grid(1 / PrefillService.of(s.pm, w, p).mean_s, 12), (BUDGETS.size, 12))
             for s in singles]
    with np.errstate(all="ignore"):
        alone = [chunked.analyse_budgets(s.pm, w, r, p, BUDGETS, 1, WHOLE, joint) for s, r in zip(singles, rates)]
        rows = PoolRows(tuple(s.pm for s in singles), np.repeat(np.arange(len(singles)), BUDGETS.size))
        stacked = chunked.analyse_budgets(rows, w, np.concatenate(rates), p, np.tile(BUDGETS, len(singles)), 1,
                                          np.tile(WHOLE, len(singles)), joint)
    stable = 0
    for i, a in enumerate(alone):
        for name, mine in a.__dict__.items():
            theirs = getattr(stacked, name)
            if mine is None:
                assert theirs is None, name
                continue
            part = np.asarray(theirs)[i * BUDGETS.size:(i + 1) * BUDGETS.size]
            if np.asarray(mine).dtype.kind in "OUb":
                assert (part == mine).all(), (name, i)
            else:  # the slot chain's overflow guard may round in the last bits; nothing else differs
                np.testing.assert_allclose(part, mine, rtol=1e-12, atol=0, err_msg=f"{name}, pool {i}")
        stable += int(np.asarray(a.stable).sum())
    assert stable > 0.3 * stacked.stable.size  # the rows compared are mostly finite


def test_grid_lookup_with_a_grid_per_row() -> None:
    """Row r of a (rows x points) grid looks up as that row's grid alone (the one-call searchsorted)."""
    grids = np.stack([batch_grid(4.0), batch_grid(111.0), batch_grid(512.0)])
    tables = np.stack([np.sqrt(g) + 3 for g in grids])
    x = np.array([[0.1, 0.5, 2.2, 5.0, np.inf], [1.0, 7.3, 50.0, 111.9, 300.0], [0.7, 12.0, 400.0, 513.0, 1e6]])
    got = GridLookup(grids, x)(tables)
    for r in range(3):
        want = GridLookup(grids[r], x[r:r + 1])(tables[r:r + 1])[0]
        np.testing.assert_allclose(got[r], want, rtol=1e-14)
    # hand values: sqrt on the grid, linear between points, clamped at the ends, inf stays inf
    assert got[0, 0] == pytest.approx(np.sqrt(0.5) + 3)
    assert got[0, 4] == np.inf
    assert got[2, 4] == pytest.approx(np.sqrt(513.0) + 3)
    assert got[1, 2] == pytest.approx(np.sqrt(50.0) + 3, rel=1e-3)


DISAGGREGATED = {
    "llama-70b, pairs of different pools": ("llama-3.1-70b", pc.Workload(rate=12.0, isl=4000, osl=500),
                                             ["h100-sxm", "h20", "a100-sxm-80gb"], "bf16", 0.9, False, "overlapped"),
    "llama-8b joint, bursty, blocking move": ("llama-3.1-8b", pc.Workload(rate=20, isl={"mean": 1500, "cv": 0.8},
                                                                          osl=300, arrival_cv=2.0),
                                              ["h100-sxm", "l4"], "bf16", 0.99, True, "blocking"),
    "moe fp8, dp ranks": ("qwen3-235b-a22b", pc.Workload(rate=12.0, isl=2000, osl=500), ["h100-sxm", "h20"], "fp8",
                          0.9, False, "overlapped"),
}


@pytest.mark.parametrize("case", list(DISAGGREGATED))
def test_stacked_pairs_equal_each_pair_alone(case: str) -> None:
    """``analyse_disaggregated`` (a plan sizes every decode pool and tries every pair in one call) gives each
    deployment what ``analyse`` gives it alone: rows of different prefill and decode pools, instance counts and
    rates side by side, and two rows of the same decode pool."""
    from calculator.serving import analyse, analyse_disaggregated
    from calculator.serving.base import Deployment

    model, w, gpus, dtype, p, joint, move = DISAGGREGATED[case]
    m = pc.load_model(model)
    singles = _singles(model, w, gpus, dtype)
    ds, pools, rates = [], [], []
    for i, s in enumerate(singles):
        partner = singles[(i * 7 + 1) % len(singles)]
        ds.append(Deployment(mode="disaggregated", kv_transfer=move,
                             prefill=partner.pm.pool.model_copy(update={"instances": 2 + i % 2}),
                             decode=s.pm.pool.model_copy(update={"instances": 1 + i % 3})))
        pools.append((partner.pm, s.pm))
        upper = s.pm.batch_limit(w) / (w.osl.mean * float(s.pm.decode_s(1, w.isl.mean)))
        rates.append(rate_grid(upper * (1 + i % 3), 16))
    ds.append(ds[0].model_copy(update={"prefill": ds[1].prefill}))  # the first decode pool again
    pools.append((pools[1][0], pools[0][1]))
    rates.append(rates[0])
    with np.errstate(all="ignore"):
        stacked = analyse_disaggregated(m, ds, pools, w, rates, p, joint)
        alone = [analyse(m, d, w, r, p, pp, joint) for d, pp, r in zip(ds, pools, rates)]
    finite = 0
    for i, (a, b) in enumerate(zip(alone, stacked)):
        for name, mine in a.__dict__.items():
            theirs = getattr(b, name)
            if mine is None:
                assert theirs is None, name
            elif np.asarray(mine).dtype.kind in "OUb":
                assert (np.asarray(theirs).astype(str) == np.asarray(mine).astype(str)).all(), (name, i)
            else:
                np.testing.assert_allclose(theirs, mine, rtol=1e-12, atol=0, err_msg=f"{name}, deployment {i}")
        finite += int(np.isfinite(a.ttft_p_s).sum())
    assert finite > 0.3 * sum(r.size for r in rates)
    # the two rows of one decode pool share its figures to the last bit (the planner's ties in tokens/s per user)
    assert np.array_equal(stacked[0].tpot_mean_s, stacked[-1].tpot_mean_s)


PLANS = {
    "pipelined (pp > 1: streams)": ("opt-175b", pc.Workload(rate=1.0, isl=1000, osl=200),
                                    pc.SLO(ttft_s=3.0, tpot_s=0.2, percentile=90), ["l40s"], {}),
    "pools of one step budget side by side": (
        "gpt-oss-20b", pc.Workload(rate=2.0, isl={"mean": 500, "cv": 0.5}, osl=800),
        pc.SLO(ttft_s=0.05, tpot_s=0.02, percentile=50), ["gaudi3", "a100-sxm-80gb", "mi355x", "h100-pcie"],
        {"weight_dtype": "fp8"}),
    "speculative twins, joint": ("llama-3.1-70b", pc.Workload(rate=6.0, isl=2000, osl=500),
                                 pc.SLO(ttft_s=2.0, tpot_s=0.05, percentile=90, attainment="joint"),
                                 ["h100-sxm", "h200-sxm"],
                                 {"spec": {"kind": "draft", "tokens": 3, "acceptance": 0.7,
                                           "draft_model": "llama-3.1-8b"}}),
}


@pytest.mark.parametrize("case", list(PLANS))
def test_plan_candidates_are_their_deployments_alone(case: str) -> None:
    """Every candidate of a plan (analysed stacked: ``_stacked_budgets``, ``analyse_disaggregated``) carries the
    figures ``evaluate`` gives its deployment alone at the workload's rate: the rates per instance and per
    pipelined stream, speculative steps and served TTFT as one deployment's own analysis has them."""
    model, w, slo, gpus, extra = PLANS[case]
    p = pc.plan(model, w, slo, gpus=gpus, **extra)
    assert p.feasible and len(p.candidates) >= 3
    modes = {c.mode for c in p.candidates}
    assert {"mixed", "chunked"} <= modes
    if case.startswith("pipelined"):
        assert any(c.deployment.pools[0].pp > 1 for c in p.candidates)
    default_cap = pc.Pool.model_fields["max_batch"].default
    worst = 0.0
    for c in p.candidates:
        # as the plan analysed it: the batch cap it recommends (``max_batch``) is set afterwards
        d = c.deployment.model_copy(update={name: getattr(c.deployment, name).model_copy(
            update={"max_batch": default_cap}) for name in ("pool", "prefill", "decode")
            if getattr(c.deployment, name) is not None})
        e = pc.evaluate(model, d, w, slo)
        for mine, theirs in ((e.ttft_s(slo.percentile), c.ttft_p_s), (e.tpot_s(slo.percentile), c.tpot_p_s)):
            worst = max(worst, abs(mine / theirs - 1))
    # a candidate's figures come from a call at its rate and the loads just below it (RATE_BAND), whose cells share
    # a step chain's states: alone they differ in the last ~1e-8
    assert worst < 1e-6


def test_pairs_of_one_prefill_pool_keep_their_own_chains() -> None:
    """Pairs on one prefill pool at different instance counts: each pair's prefill chain is sized by its own rates,
    as alone (sharing the pool's chain had moved a p90 TTFT by 2.1e-4 at two instances, a review's case: 20-token
    prompts at 2,000 req/s)."""
    from calculator.serving import analyse, analyse_disaggregated
    from calculator.serving.base import Deployment

    m = pc.load_model("llama-3.1-8b")
    w = pc.Workload(rate=2000.0, isl={"mean": 20, "cv": 1.0}, osl=100)
    pm = _singles("llama-3.1-8b", w, ["h100-sxm"])[0].pm
    counts = (1, 2, 3, 4, 8, 16, 32)
    ds = [Deployment(mode="disaggregated", prefill=pm.pool.model_copy(update={"instances": n}),
                     decode=pm.pool.model_copy(update={"instances": 8})) for n in counts]
    with np.errstate(all="ignore"):
        stacked = analyse_disaggregated(m, ds, [(pm, pm)] * len(ds), w, [np.array([w.rate])] * len(ds), 0.9)
        alone = [analyse(m, d, w, np.array([w.rate]), 0.9, (pm, pm)) for d in ds]
    finite = [float(a.ttft_p_s[0]) for a in alone if np.isfinite(a.ttft_p_s[0])]
    assert len(finite) >= 5 and finite == sorted(finite, reverse=True)  # more prefill instances, less wait
    for a, b in zip(alone, stacked):
        np.testing.assert_allclose(b.ttft_p_s, a.ttft_p_s, rtol=1e-12)
        np.testing.assert_allclose(b.ttft_mean_s, a.ttft_mean_s, rtol=1e-12)


def test_a_decode_pools_cache_keeps_the_callers_shape() -> None:
    """``analyse`` (rates (n,)) and a one-deployment ``analyse_disaggregated`` (rates (1, n)) on the same pool
    models, in either order, each get arrays of their own shape (the decode side's cache key holds the shape)."""
    from calculator.serving import analyse, analyse_disaggregated
    from calculator.serving.base import Deployment

    m = pc.load_model("llama-3.1-8b")
    w = pc.Workload(rate=10.0, isl=1000, osl=200)
    pm = _singles("llama-3.1-8b", w, ["h100-sxm"])[0].pm
    d = Deployment(mode="disaggregated", prefill=pm.pool, decode=pm.pool)
    rates = np.array([2.0, 5.0, 9.0])
    with np.errstate(all="ignore"):
        first = analyse(m, d, w, rates, 0.9, (pm, pm))
        rows = analyse_disaggregated(m, [d], [(pm, pm)], w, [rates], 0.9)[0]
        again = analyse(m, d, w, rates, 0.9, (pm, pm))
    for a in (first, rows, again):
        assert np.shape(a.tpot_mean_s) == (3,) and np.shape(a.tpot_p_s) == (3,)
    np.testing.assert_array_equal(rows.tpot_mean_s, first.tpot_mean_s)
    assert first.tpot_mean_s[0] < first.tpot_mean_s[2]


@pytest.mark.parametrize("backlog", [False, True])
def test_chains_of_several_groups_and_depths_equal_each_group_alone(backlog, monkeypatch):
    """``chain_moments`` with ``groups``: each group's cells as that group alone gives them (rel 1e-12), though
    the groups' chains are sized at once (``_closed_tops``, ``_chain_counts``) and those that come to the same
    states and counts solve in one call, split where they outgrow CHAIN_CELLS_STATES. Four groups of step lines
    (one a near twin of another, so they share chains), each at loads from light to past saturation (several
    backlog depths a group)."""
    from calculator.serving import disaggregated as dg

    # (t0, tau) per group, s, and the most load it is asked at (a full step's arrivals over the budget)
    lines = [(0.004, 0.020, 1.3), (0.030, 0.002, 0.02), (0.004, 0.0201, 1.3), (0.0005, 0.0001, 0.5)]
    most = 16
    lam, t0, tau, label = [], [], [], []
    for g, (a, b, top) in enumerate(lines):
        rates = np.geomspace(1e-3, top, 9) * most / (a + b * most)
        lam += rates.tolist()
        t0 += [a] * rates.size
        tau += [b] * rates.size
        label += [g] * rates.size
    lam, t0, tau, label = (np.array(x) for x in (lam, t0, tau, label))
    order = np.random.default_rng(3).permutation(lam.size)  # groups interleaved
    lam, t0, tau, label = lam[order], t0[order], tau[order], label[order]
    for limit in (dg.CHAIN_CELLS_STATES, 2_000):  # the second splits a chain's groups over several calls
        monkeypatch.setattr(dg, "CHAIN_CELLS_STATES", limit)
        together = dg.chain_moments(lam, t0, tau, most, 0.3, backlog=backlog, groups=label)
        for g in range(len(lines)):
            mine = label == g
            alone = dg.chain_moments(lam[mine], t0[mine], tau[mine], most, 0.3, backlog=backlog)
            for a, b in zip(together, alone):
                assert a[mine] == pytest.approx(b, rel=1e-12, abs=1e-300)
    # the groups' chains differ at light load (sized together they would all be the busiest one's)
    tops = dg._closed_tops(lam, t0[:, None], tau[:, None], label, np.full(4, 2 * most), most, 0.3)
    assert len(set(tops.tolist())) > 1, tops


def test_decode_pools_stacked_equal_each_pool_alone():
    """The disaggregated decode side sizes every decode pool in one call (``decode_fixed_batches``, and
    ``product_form_step_moments`` over ``PoolRows``): each row as its pool alone gives it, to the last bit, with
    the pools' rows interleaved and rates from idle to past the KV limit."""
    from calculator.serving.base import decode_fixed_batches, decode_fixed_point, product_form_step_moments
    from calculator.serving.base import running_context

    w = pc.Workload(rate=1.0, isl=3000, osl=400)
    singles = _singles("llama-3.1-8b", w, ["h100-sxm", "l4", "a100-sxm-80gb"])
    pms = [s.pm for s in singles]
    owner = np.array([2, 0, 1, 0, 2, 1, 1, 0])[: 2 * len(pms) + 2] % len(pms)
    rows = PoolRows(tuple(pms), owner)
    ctx = running_context(w)
    lam = np.stack([np.geomspace(0.01, 2.0, 9) * pms[o].batch_limit(w) / (w.osl.mean * float(pms[o].decode_s(1, ctx)))
                    for o in owner])
    lam[0, 0] = 0.0  # no arrivals: inf, as alone
    fixed = decode_fixed_batches(rows, ctx, lam, w.osl.mean, w)
    load = np.linspace(0.0, 0.99, lam.size).reshape(lam.shape)
    limits = np.array([pms[o].batch_limit(w) for o in owner])[:, None]
    mean, var = product_form_step_moments(rows, ctx, lam, w.osl.mean, limits, fixed, load)
    for o, pm in enumerate(pms):  # each pool alone: its rows in one call, as ``PoolRows.map`` made them
        mine = owner == o
        alone = decode_fixed_point(pm, ctx, lam[mine], w.osl.mean, 1.0, pm.batch_limit(w))[0]
        np.testing.assert_array_equal(fixed[mine], alone)
        m1, v1 = product_form_step_moments(pm, ctx, lam[mine], w.osl.mean, pm.batch_limit(w), fixed[mine], load[mine])
        np.testing.assert_array_equal(mean[mine], m1)
        np.testing.assert_array_equal(var[mine], v1)
    assert np.isinf(fixed).any() and np.isfinite(fixed).any()  # both sides of the limit


@pytest.mark.parametrize("model, gpu, spec", [("llama-3.1-8b", "h100-sxm", None), ("qwen3-30b-a3b", "l40s", None),
                                              ("llama-3.1-70b", "h200-sxm", {"kind": "draft", "tokens": 3,
                                                                            "acceptance": 0.7,
                                                                            "draft_model": "llama-3.1-8b"})])
def test_tables_built_together_equal_each_built_alone(model, gpu, spec):
    """A pool's chunked tables bring its two-prompt table (``PoolModel.two_prompt_table``) and the prefill steps of
    the default token budget's prompts (``prefill_batch_table``) from the same step computation: the same figures,
    to the last bit, as each built on its own (a fresh pool model), speculative decoding included. (Entries of one
    array computation: numpy's scalar arithmetic can differ from its array loops in the last bit, so the batch-1
    decode step, ``decode_point``, is computed as scalars, as ``decode_s`` alone computes it.)"""
    from calculator.serving.base import PoolModel, running_context

    m = pc.load_model(model)
    w = pc.Workload(rate=1.0, isl={"mean": 1500, "cv": 0.5}, osl=300, prefix_hit=0.3)
    pool = pc.Pool(gpu=gpu, tp=2 if model == "llama-3.1-70b" else 1, spec=spec)
    together, alone = PoolModel.build(m, pool, w), PoolModel.build(m, pool, w)
    ctx, limit = running_context(w), together.batch_limit(w)
    cached = w.isl.mean * w.prefix_hit
    chunks = np.array([8192.0, 512.0, 2048.0])
    limits = np.array([limit, min(limit, 511.0), min(limit, 2047.0)])
    tables = together.chunked_tables(ctx, limit, limits, chunks, (w.isl.mean - cached, 2000.0), cached)
    assert together.two_prompt_key(ctx, w.isl.mean - cached, cached, limit) in together._cache
    for a, b in zip(together.two_prompt_table(ctx, w.isl.mean - cached, cached, limit),
                    alone.two_prompt_table(ctx, w.isl.mean - cached, cached, limit)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(tables["decode_only"][0], np.interp(
        np.minimum(tables["grid"], limits[0]), *alone.decode_table(ctx, limit)))
    assert together.decode_point(1.0, w.isl.mean) == float(alone.decode_s(1, w.isl.mean))
    # and the prefill steps of the default budget's prompts (``prefill_batch_table``), as ``prefill_s`` gives them
    most = max(1.0, math.floor(8192 / w.isl.mean))
    assert together.prefill_batch_key(w.isl.mean - cached, cached, most) in together._cache
    prompts, steps = together.prefill_batch_table(w.isl.mean - cached, cached, most)
    np.testing.assert_array_equal(steps, alone.prefill_s(w.isl.mean - cached, cached, prompts))
    np.testing.assert_array_equal(steps, alone.prefill_batch_table(w.isl.mean - cached, cached, most)[1])
    # the tables' rows are what the pool gives alone: the hybrid steps by ``hybrid_s``
    k = np.maximum(np.ceil((w.isl.mean - cached) / np.maximum(chunks[1] - np.minimum(tables["grid"], limits[1]), 1.0)),
                   1.0)
    np.testing.assert_array_equal(tables["iters_0"][1], k)


def test_the_fifo_wait_on_some_cells_is_the_whole_calls():
    """``step_wait(..., cells=mask)`` (a plan's hybrid rows take whole prompts' waits from the bulk form, so the
    FIFO form runs on the other cells alone) gives each cell of the mask the figures of the call over every cell,
    to the last bit, with chunked prompts' shifted waits and a slot queue whose waits count only outside the
    mask (so the mask's own cells would not have asked for them), and NaN off the mask."""
    from calculator.serving.base import PrefillService, SlotQueue, step_wait

    rows, rates = 5, 12
    lam = np.geomspace(0.2, 9.0, rates)[None, :] * np.linspace(0.6, 1.2, rows)[:, None]
    service = PrefillService(np.linspace(0.04, 0.09, rows)[:, None], np.linspace(0.04, 0.09, rows)[:, None] ** 2 * 1.3,
                             np.linspace(0.05, 0.12, rows)[:, None])
    t_d = np.full((rows, rates), 0.02)
    batched = np.array([True, False, True, False, False])[:, None]
    busy = service.mean_s * np.array([1.0, 1.4, 1.0, 1.2, 1.0])[:, None]
    shift = (np.full((rows, rates), 0.01), np.full((rows, rates), 0.015))
    limit = np.array([4.0, 400.0, 6.0, 400.0, 400.0])[:, None]  # slots that bind on rows 0 and 2 only
    batch = lam * 0.5
    hold = np.full(lam.shape, 2.0)
    hold[4, 0] = np.inf  # a hold without a figure: no slot wait of its own, inf where the call counts slot waits
    with np.errstate(invalid="ignore"):  # 0 x inf: that cell's wait has no figure
        slots = SlotQueue.of(lam, batch, limit, hold, 0.3, 0.01, 2.5 + 0 * lam)
    mask = np.broadcast_to(limit > 100, lam.shape)  # the cells whose slots never bind
    assert not np.any(slots.matters(0.9)[mask]) and np.any(slots.matters(0.9))
    for sh in (None, shift):
        whole = step_wait(lam, service, t_d, 0.9, batched, busy, slots=slots, shift=sh)
        part = step_wait(lam, service, t_d, 0.9, batched, busy, slots=slots, shift=sh, cells=mask)
        for a, b in zip(whole, part):
            np.testing.assert_array_equal(b[mask], a[mask])
            assert np.all(np.isnan(b[~mask]))
        assert np.isinf(part[1][4, 0])
    # and the bulk form (whole prompts that share the decodes' steps) on its own cells
    rng = np.random.default_rng(11)
    where = rng.uniform(size=lam.shape) < 0.5
    bulk = (where, rng.uniform(0.1, 0.6, lam.shape), rng.uniform(0.02, 0.1, lam.shape), rng.uniform(0.5, 1.2, lam.shape),
            rng.uniform(0.005, 0.02, lam.shape), rng.integers(2, 7, lam.shape).astype(float))
    whole = step_wait(lam, service, t_d, 0.9, batched, busy, slots=slots, bulk=bulk)
    part = step_wait(lam, service, t_d, 0.9, batched, busy, slots=slots, bulk=bulk, cells=where)
    for a, b in zip(whole, part):
        np.testing.assert_array_equal(b[where], a[where])
        assert np.all(np.isnan(b[~where]))


def test_the_in_place_shifted_tail_is_the_written_out_one_to_the_bit():
    """``shifted_weibull_tail`` (a chunked prompt's wait tail over its 8 shift points, in one reused array) equals
    the expression written out, to the last bit, call after call, also where the lags were cut by a mask
    (``with_slot_wait`` bisects only the cells that wait for a slot): numpy lays those out column-major, and a mean
    over a row-major copy sums in another order (a review saw a TTFT quantile move in its last bit)."""
    from calculator.serving.base import SHIFT_POINTS, shifted_weibull_tail

    rng = np.random.default_rng(7)
    cells = 37
    mid, width = rng.uniform(0, 0.05, cells), rng.uniform(0, 0.08, cells)
    lags = np.maximum(mid + width * SHIFT_POINTS[:, None], 0.0)
    scale, k = rng.uniform(0.01, 0.2, cells), rng.uniform(0.6, 2.5, cells)
    need = rng.uniform(size=cells) < 0.6
    for lag, s, kk in ((lags, scale, k), (np.broadcast_to(lags, (8, cells))[:, need], scale[need], k[need])):
        spare: list[np.ndarray] = []
        for _ in range(4):
            x = rng.uniform(0, 0.3, lag.shape[1])
            plain = np.exp(-((np.maximum(x - lag, 0.0) / s) ** kk)).mean(axis=0)
            np.testing.assert_array_equal(shifted_weibull_tail(x, lag, s, kk, spare), plain)
    assert not np.broadcast_to(lags, (8, cells))[:, need].flags.c_contiguous  # the masked case is column-major


def test_an_empty_chain_is_empty():
    from calculator.serving.disaggregated import chain_moments

    for shape in ((0,), (0, 3)):
        got = chain_moments(np.zeros(shape), 0.1, 0.01, 8.0, 1.0, backlog=True)
        assert len(got) == 6 and all(g.shape == shape for g in got)
