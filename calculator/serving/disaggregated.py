"""Prefill/decode disaggregation (DistServe / Splitwise / Mooncake style), xPyD pools.

Prefill pool: N_p instances share one queue (M/G/c, c = N_p); a free instance runs every waiting
prompt up to the token budget in one step (``prefill_batch``), which shares the weight reads.
KV transfer: the request's whole cache (isl tokens, all layers) crosses min(tp_p, tp_d) parallel
links of the chosen kind (scale-out NIC between nodes, or the scale-up link inside one); with
layer-wise overlap only what outlasts the prefill (and at least one layer's share) is visible.
  TTFT = W_q(M/G/c) + s_p + t_kv + W_slot + t_d / 2 (the decode instance takes it at its next step)
Decode pool: each instance sees lambda / N_d; B = lambda_d osl t_d(B) (least fixed point); a request
waits for a batch slot (KV memory or the batch cap: M/G/c over the slots, ``base.admission_wait``);
TPOT = t_d(B), its tail from the spread of the batch over a lifetime (``base.tpot_tail``).
"""

from __future__ import annotations

import math

import numpy as np

from hardware_db.schema import ModelSpec

from .. import formulas as f
from ..kv_cache import kv_cache_bytes
from .base import (
    ATTAINMENT_LEVELS,
    Deployment,
    ModeArrays,
    PoolModel,
    PrefillService,
    admission_wait,
    decode_fixed_point,
    decode_step_at,
    excess_sum,
    queue_wait,
    tpot_tail,
    z_score,
)
from .workload import Workload


def kv_transfer_s(model: ModelSpec, d: Deployment, w: Workload, pre: PoolModel, dec: PoolModel, prefill_s: float) -> float:
    """Visible KV move time of a mean request from the prefill to the decode pool."""
    assert d.prefill is not None and d.decode is not None
    kv_bytes = float(kv_cache_bytes(model, w.isl.mean, d.decode.kv_dtype, tp=1))
    return kv_move_s(model, kv_bytes, pre, dec, d.kv_link, d.layerwise_kv_overlap, prefill_s)


def kv_move_s(model: ModelSpec, kv_bytes: float, pre: PoolModel, dec: PoolModel, kv_link: str, layerwise: bool,
              prefill_s: float) -> float:
    """``kv_bytes`` over min(tp_p, tp_d) parallel links (NIC or scale-up) with the link efficiency and
    one collective latency; with layer-wise overlap, only what outlasts the prefill (>= one layer)."""
    links = min(pre.pool.tp, dec.pool.tp)
    if kv_link == "scaleup":
        per_link = min(pre.gpu.scaleup_bytes_per_s, dec.gpu.scaleup_bytes_per_s)
    else:
        per_link = min(pre.gpu.scaleout_bytes_per_s, dec.gpu.scaleout_bytes_per_s)
    eff = pre.gpu.efficiency
    t = float(f.kv_transfer_time(Q=kv_bytes, beta_link=per_link * links, eta_l=eff.link,
                                 alpha=eff.collective_latency_us * 1e-6))
    if layerwise:
        per_layer = t / model.num_layers
        return max(per_layer, t - prefill_s * (model.num_layers - 1) / model.num_layers)
    return t


def prefill_batch(pre: PoolModel, w: Workload, lam_server, budget_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompts per prefill step, that step's time) at each per-instance arrival rate: the prompts
    that arrive during one prompt's prefill share the next step, b = lambda s_1, up to the token
    budget (at least one)."""
    most = max(1.0, math.floor(budget_tokens / w.isl.mean))
    key = ("prefill_batch", w.isl.mean, w.prefix_hit, most)
    if key not in pre._cache:  # the step time over a geometric grid of batch sizes (piecewise linear)
        grid = np.unique(np.geomspace(1.0, most, 24)) if most > 1 else np.array([1.0, 1.0 + 1e-9])
        cached = w.isl.mean * w.prefix_hit
        pre._cache[key] = (grid, np.asarray(pre.prefill_s(w.isl.mean - cached, cached, grid), dtype=float))
    grid, table = pre._cache[key]
    b = np.clip(np.asarray(lam_server, dtype=float) * table[0], 1.0, most)
    return b, np.interp(b, grid, table)


def _decode_side(dec: PoolModel, w: Workload, lam_d: np.ndarray, p: float) -> tuple[np.ndarray, ...]:
    """The decode instance at per-instance rates ``lam_d``: (B, B capped, t_d, slope, TPOT mean, its
    variance and p-quantile, lifetime, slot wait mean and p-quantile). Cached on the pool model: a
    plan pairs one decode pool with many prefill pools."""
    key = ("decode_side", lam_d.tobytes(), float(p), w.isl, w.osl)
    hit = dec._cache.get(key)
    if hit is not None:
        return hit
    ctx = w.isl.mean + (w.osl.mean + 1) / 2
    limit = dec.batch_limit(w)
    batch, _ = decode_fixed_point(dec, ctx, lam_d, w.osl.mean, 1.0, limit)
    b_cap = np.minimum(batch, limit)
    t_d = decode_step_at(dec, ctx, limit, b_cap)
    slope = decode_step_at(dec, ctx, limit, b_cap + 1) - t_d
    tpot = t_d + slope  # the step a request sees: t_d(B + 1) (``base.seen``)
    zero = np.zeros_like(lam_d)
    tpot_var, tpot_p = tpot_tail(tpot, zero, lam_d, zero, 0.0, w, slope, b_cap, p)
    life = w.osl.mean * tpot
    aq, ap = admission_wait(lam_d, batch, limit, life, w.osl.cv**2, p)
    out = (batch, b_cap, t_d, slope, tpot, tpot_var, tpot_p, life, aq, ap)
    if len(dec._cache) < 4096:
        dec._cache[key] = out
    return out


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float,
            pools: tuple[PoolModel, PoolModel] | None = None, joint: bool = False) -> ModeArrays:
    assert d.prefill is not None and d.decode is not None
    pre, dec = pools or (PoolModel.build(model, d.prefill, w), PoolModel.build(model, d.decode, w))
    lam = np.asarray(total_rate, dtype=float)
    one = PrefillService.of(pre, w, p)
    b, step = prefill_batch(pre, w, lam / d.prefill.instances, d.max_batched_tokens)
    scale = step / (b * one.mean_s)  # batching shares the weight reads: a prompt costs less
    service = PrefillService(one.mean_s * scale, one.second_moment_s2 * scale**2, one.quantile_s)  # type: ignore[arg-type]
    own_mean = step
    t_kv = kv_transfer_s(model, d, w, pre, dec, one.mean_s)
    rho_prefill = lam * service.mean_s / d.prefill.instances

    lam_d = lam / d.decode.instances
    limit = dec.batch_limit(w)
    batch, b_cap, t_d, slope, tpot, tpot_var, tpot_p, life, aq, ap = _decode_side(dec, w, lam_d, p)

    c = d.prefill.instances

    def prefill_at(q: float) -> tuple[np.ndarray, np.ndarray]:
        """(mean, q-quantile) of arrival to end of prefill: M/G/c with the per-prompt service of a
        batched step (T(b) / b: the queue's work is conserved), then the prompt's own step T(b). The
        wait and the prompt's length are independent, so their excesses over the means add in
        quadrature (a long wait and a long prompt rarely coincide)."""
        wq, wp = queue_wait(lam, service, c, q)
        step_q = PrefillService.of(pre, w, q).quantile_s * scale * b
        return wq + own_mean, wq + own_mean + excess_sum(wp - wq, step_q - own_mean)

    def ttft_at(q: float) -> tuple[np.ndarray, np.ndarray]:
        mean, pre_q = prefill_at(q)
        ap_q = ap if q == p else admission_wait(lam_d, batch, limit, life, w.osl.cv**2, q)[1]
        return mean, pre_q + t_kv + ap_q + q * t_d  # the decode instance takes it at its next step

    prefill_mean, ttft_p = ttft_at(p)
    ttft_mean = prefill_mean + t_kv + aq + t_d / 2
    levels = np.stack([ttft_at(float(q))[1] for q in ATTAINMENT_LEVELS]) if joint else None
    itl_p = t_d + z_score(p) * np.sqrt(b_cap) * slope

    rho_decode = lam_d * w.osl.mean * slope
    kv_limit = dec.kv_limit(w)
    occupancy = np.where(np.isfinite(batch), batch, lam_d * life) / limit
    names = np.array(["prefill pool", "decode bandwidth",
                      "decode batch cap" if dec.pool.max_batch <= kv_limit else "decode KV memory"])
    stacked = np.stack(np.broadcast_arrays(rho_prefill, rho_decode, occupancy))
    stacked = np.where(np.isfinite(stacked), stacked, 1e9)
    util = stacked.max(axis=0)
    binding = names[np.argmax(stacked, axis=0)]
    stable = (util < 1) & np.isfinite(batch) & (batch < limit)
    return ModeArrays(stable, util, ttft_mean, ttft_p, tpot, tpot_p, batch, np.full_like(lam, t_kv), binding,
                      tpot_var, itl_p, levels)
