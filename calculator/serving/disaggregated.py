"""Prefill/decode disaggregation (DistServe / Splitwise / Mooncake style), xPyD pools.

Prefill pool: N_p instances share one queue (M/G/c, c = N_p) of prefills at batch 1.
KV transfer: the request's whole cache (isl tokens, all layers) crosses min(tp_p, tp_d) parallel
links of the chosen kind (scale-out NIC between nodes, or the scale-up link inside one); with
layer-wise overlap only what outlasts the prefill (and at least one layer's share) is visible.
  TTFT = W_q(M/G/c) + s_p + t_kv
Decode pool: each instance sees lambda / N_d; B = lambda_d osl t_d(B) (least fixed point) capped by
KV memory and the batch cap; TPOT = t_d(B), its tail from the Poisson spread of B (B + z sqrt(B)).
"""

from __future__ import annotations

import numpy as np

from hardware_db.schema import ModelSpec

from .. import formulas as f
from ..kv_cache import kv_cache_bytes
from .base import (
    Deployment,
    ModeArrays,
    PoolModel,
    PrefillService,
    decode_fixed_point,
    decode_step_at,
    queue_wait,
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


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float,
            pools: tuple[PoolModel, PoolModel] | None = None) -> ModeArrays:
    assert d.prefill is not None and d.decode is not None
    pre, dec = pools or (PoolModel.build(model, d.prefill, w), PoolModel.build(model, d.decode, w))
    lam = np.asarray(total_rate, dtype=float)
    service = PrefillService.of(pre, w, p)
    wq, wp = queue_wait(lam, service, d.prefill.instances, p)
    t_kv = kv_transfer_s(model, d, w, pre, dec, service.mean_s)
    ttft_mean = wq + service.mean_s + t_kv
    ttft_p = wp + service.quantile_s + t_kv
    rho_prefill = lam * service.mean_s / d.prefill.instances

    lam_d = lam / d.decode.instances
    ctx = w.isl.mean + (w.osl.mean + 1) / 2
    limit = dec.batch_limit(w)
    batch, tpot = decode_fixed_point(dec, ctx, lam_d, w.osl.mean, 1.0, limit)
    b_cap = np.minimum(batch, limit)
    b_tail = np.minimum(batch + z_score(p) * np.sqrt(batch), limit)
    tpot_p = np.where(np.isfinite(tpot), np.maximum(decode_step_at(dec, ctx, limit, b_tail), tpot), np.inf)
    marginal = decode_step_at(dec, ctx, limit, b_cap + 1) - decode_step_at(dec, ctx, limit, b_cap)
    rho_decode = np.where(np.isfinite(tpot), lam_d * w.osl.mean * marginal, np.inf)
    util = np.maximum(rho_prefill, rho_decode)
    stable = (rho_prefill < 1) & np.isfinite(tpot) & (rho_decode < 1)
    binding = np.where(rho_prefill >= rho_decode, "prefill pool", np.where(batch >= limit, "decode KV memory", "decode pool"))
    return ModeArrays(stable, util, ttft_mean, ttft_p, tpot, tpot_p, batch, np.full_like(lam, t_kv), binding)
