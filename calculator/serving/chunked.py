"""Chunked prefill, Sarathi-style: each iteration carries every running decode plus a slice of
pending prefill, up to a token budget C.

Per instance: an iteration with B decodes and x prefill tokens takes t(B, x) (weights read once;
the chunk re-reads the KV of its earlier chunks: mean prefix (isl - chunk) / 2). In steady state
  x = lambda isl t,  B = lambda osl t,  t = t(B, x)          (least fixed point)
and it is stable while x <= C - B. Prefill is a queue served at (C - B) tokens per full iteration:
  service D = isl t_full / (C - B),  TTFT = W_q(M/G/1, lambda, D) + ceil(isl / (C - B)) t_full.
TPOT is the mean iteration time; its tail mixes full- and decode-only iterations over osl tokens.
"""

from __future__ import annotations

import numpy as np

from hardware_db.schema import ModelSpec

from .base import FIXED_POINT_ITERATIONS, Deployment, ModeArrays, PoolModel, PrefillService, queue_wait, z_score
from .workload import Workload


def analyse(model: ModelSpec, d: Deployment, w: Workload, total_rate, p: float, pm: PoolModel | None = None) -> ModeArrays:
    pool = d.pool
    assert pool is not None
    pm = pm or PoolModel.build(model, pool, w)
    lam = np.asarray(total_rate, dtype=float) / pool.instances
    C = float(d.chunk_tokens)
    isl_new = w.isl.mean * (1 - w.prefix_hit)
    ctx = w.isl.mean + (w.osl.mean + 1) / 2
    limit = min(pm.batch_limit(w), C - 1)
    chunk_prefix = w.isl.mean * w.prefix_hit + max(0.0, isl_new - C) / 2

    def iteration(batch, tokens):
        return pm.hybrid_s(np.minimum(batch, limit), ctx, tokens, chunk_prefix)

    t = iteration(np.ones_like(lam), np.zeros_like(lam))
    for _ in range(FIXED_POINT_ITERATIONS):
        batch, tokens = lam * w.osl.mean * t, lam * isl_new * t
        t_new = iteration(batch, np.minimum(tokens, C))
        if np.allclose(t_new, t, rtol=1e-7):
            t = t_new
            break
        t = t_new
    batch, tokens = lam * w.osl.mean * t, lam * isl_new * t
    room = C - np.minimum(batch, limit)
    stable = (batch <= limit) & (tokens <= room) & np.isclose(iteration(batch, tokens), t, rtol=1e-3)

    t_full = iteration(batch, room)
    t_decode_only = iteration(batch, np.zeros_like(lam))
    per_token_s = t_full / np.maximum(room, 1.0)
    mean_d = isl_new * per_token_s
    service = PrefillService(mean_d, mean_d**2 * (1 + w.isl.cv**2), mean_d)  # type: ignore[arg-type]
    wq, wp = queue_wait(lam, service, 1, p)
    chunks_mean = np.ceil(isl_new / np.maximum(room, 1.0))
    isl_q = w.isl.quantile(p) * (1 - w.prefix_hit)
    chunks_q = np.ceil(isl_q / np.maximum(room, 1.0))
    ttft_mean = wq + chunks_mean * t_full + t_decode_only / 2
    ttft_p = wp + chunks_q * t_full + t_decode_only / 2

    share_full = np.clip(tokens / np.maximum(room, 1.0), 0, 1)
    tpot_mean = t
    sd = (t_full - t_decode_only) * np.sqrt(share_full * (1 - share_full) / max(w.osl.mean, 1.0))
    tpot_p = tpot_mean + z_score(p) * sd
    util = np.maximum(tokens / np.maximum(room, 1e-9), batch / limit)
    binding = np.where(tokens / np.maximum(room, 1e-9) >= batch / limit, "prefill token budget", "decode batch / KV")
    inf = np.inf
    return ModeArrays(
        stable, util, np.where(stable, ttft_mean, inf), np.where(stable, ttft_p, inf), np.where(stable, tpot_mean, inf),
        np.where(stable, tpot_p, inf), batch, np.zeros_like(lam), binding,
    )

