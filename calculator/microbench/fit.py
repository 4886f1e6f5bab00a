"""Fit the free constants of the step-time model to measured latencies.

The step time ``calculator.phases`` computes is, per point i and operator group g,

    t_i = sum_g max(C_ig / eta_c, M_ig / eta_m) + K_i * tau_k + o

with C and M the group's time at the bare compute and memory ceilings and K the kernel launches of
the step. ``design`` reads C, M and K off ``phases.step_groups`` run at unit efficiencies (so the
formulas stay in one place) and ``fit_efficiency`` minimises the sum of squared relative errors:
(eta_c, eta_m) on a log grid refined twice around the best cell, (tau_k, o) >= 0 for each cell in
closed form (the step time is linear in them). Predictions for the report go through ``calculator.estimate``
itself; ``run`` checks that both agree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hardware_db.schema import Efficiency, GPUSpec, ModelSpec

from ..estimate import estimate
from ..phases import Setup, step_groups

UNIT = Efficiency(compute=1.0, memory=1.0, kernel_latency_us=1.0, step_overhead_us=0.0)
"""Efficiencies at which a group's compute_s and memory_s are the bare ceilings and latency_s counts kernels in us."""

CEILING = Efficiency(compute=1.0, memory=1.0, kernel_latency_us=0.0, step_overhead_us=0.0)
"""The bare roofline: what the measured ceilings alone predict."""


@dataclass(frozen=True)
class Design:
    """Per point: group times at the bare ceilings (points x groups) and kernel launches per step."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    kernels: np.ndarray
    sequences: np.ndarray | None = None  # sequences in the step (for a per-sequence cost); None: not fitted
    attention: int | None = None  # the attention group's column (in decode rows its efficiencies scale by
    # Efficiency.decode_attention; prefill rows run prompt attention at the GEMM efficiencies)
    decode_rows: np.ndarray | None = None  # which rows are decode steps
    steps: np.ndarray | None = None  # forward steps per row (each pays the step overhead); None: one each
    gemv_memory_s: np.ndarray | None = None  # the part of memory_s in linear layers of one row (a GEMV: it runs
    # Efficiency.gemv_speedup times faster, ``gemm_memory_efficiency``); None: none

    @staticmethod
    def concat(parts: list[Design]) -> Design:
        width = max(p.compute_s.shape[1] for p in parts)

        def pad(a: np.ndarray) -> np.ndarray:
            return np.pad(a, ((0, 0), (0, width - a.shape[1])))

        seqs = None if any(p.sequences is None for p in parts) else np.concatenate([p.sequences for p in parts])
        cols = {p.attention for p in parts}
        rows = None if any(p.decode_rows is None for p in parts) else np.concatenate([p.decode_rows for p in parts])
        steps = np.concatenate([p.step_counts for p in parts])
        gemv = np.concatenate([pad(p.gemv_part) for p in parts])
        return Design(np.concatenate([pad(p.compute_s) for p in parts]), np.concatenate([pad(p.memory_s) for p in parts]),
                      np.concatenate([p.kernels for p in parts]), seqs, cols.pop() if len(cols) == 1 else None, rows,
                      steps, gemv)

    @property
    def step_counts(self) -> np.ndarray:
        return np.ones_like(self.kernels) if self.steps is None else self.steps

    @property
    def gemv_part(self) -> np.ndarray:
        return np.zeros_like(self.memory_s) if self.gemv_memory_s is None else self.gemv_memory_s

    def summed(self) -> Design:
        """One row: the steps of every row run one after the other (a prompt prefilled in chunks). Each group's
        compute and memory times add before its roofline max, a fair sum where the steps have one shape."""
        def total(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a.sum(axis=0, keepdims=True)

        rows = None if self.decode_rows is None else self.decode_rows[:1] & np.all(self.decode_rows)
        return Design(total(self.compute_s), total(self.memory_s), total(self.kernels), total(self.sequences),
                      self.attention, rows, total(self.step_counts), total(self.gemv_memory_s))

    def take(self, index: np.ndarray) -> Design:
        return Design(self.compute_s[index], self.memory_s[index], self.kernels[index],
                      None if self.sequences is None else self.sequences[index], self.attention,
                      None if self.decode_rows is None else self.decode_rows[index], self.step_counts[index],
                      None if self.gemv_memory_s is None else self.gemv_memory_s[index])

    def scaled(self, decode_attention: float) -> Design:
        """The design with the attention group's ceiling times in decode rows divided by ``decode_attention``
        (the decode kernel's share of the efficiencies), so that ``predict_s`` at the GEMM efficiencies covers it."""
        if self.attention is None or self.decode_rows is None or decode_attention == 1.0:
            return self
        c, m = self.compute_s.copy(), self.memory_s.copy()
        c[self.decode_rows, self.attention] /= decode_attention
        m[self.decode_rows, self.attention] /= decode_attention
        return replace(self, compute_s=c, memory_s=m)

    def graphed(self, decode_graph_launch: float) -> Design:
        """The design with the kernel counts of decode rows times ``decode_graph_launch`` (the share of the per-kernel
        latency a step replayed from a CUDA graph pays: ``launch_latency``), so that one kernel latency covers both."""
        if self.decode_rows is None or decode_graph_launch == 1.0:
            return self
        k = self.kernels.astype(float).copy()
        k[self.decode_rows] *= decode_graph_launch
        return replace(self, kernels=k)

    def gemv(self, gemv_speedup: float) -> Design:
        """The design with the memory time of one-row linear layers divided by ``gemv_speedup`` (``Efficiency.
        gemv_speedup``, ``gemm_memory_efficiency``), so that one memory efficiency covers GEMVs and GEMMs."""
        if self.gemv_memory_s is None or gemv_speedup == 1.0:
            return self
        return replace(self, memory_s=self.memory_s - self.gemv_memory_s * (1.0 - 1.0 / gemv_speedup),
                       gemv_memory_s=self.gemv_memory_s / gemv_speedup)

    def predict_s(self, eff: Efficiency) -> np.ndarray:
        d = self.scaled(eff.decode_attention).graphed(eff.decode_graph_launch).gemv(eff.gemv_speedup)
        roof = np.maximum(d.compute_s / eff.compute, d.memory_s / eff.memory).sum(axis=1)
        per_seq = 0.0 if self.sequences is None else self.sequences * eff.sequence_overhead_us * 1e-6
        return (roof + d.kernels * eff.kernel_latency_us * 1e-6 + self.step_counts * eff.step_overhead_us * 1e-6
                + per_seq)


def design(m: ModelSpec, device: GPUSpec, phase: str, tokens: np.ndarray, batch: np.ndarray, dtype: str,
           prefix: np.ndarray | None = None) -> Design:
    """The design rows of a batch of points of one model and phase (prefill: ``prefix`` cached tokens, none by
    default; decode: S=1, P=tokens)."""
    setup = Setup(m, device.model_copy(update={"efficiency": UNIT}), weight_dtype=dtype, kv_dtype=dtype)
    tokens = np.asarray(tokens, dtype=float)
    batch = np.asarray(batch, dtype=float)
    if phase == "prefill":
        groups = step_groups(setup, S=tokens, P=np.zeros_like(tokens) if prefix is None else
                             np.asarray(prefix, dtype=float), b=batch, phase="prefill")
    else:
        groups = step_groups(setup, S=np.ones_like(tokens), P=tokens, b=batch, phase="decode")
    shape = np.broadcast(tokens, batch).shape
    if any(g.communication for g in groups):
        raise ValueError("design: the benchmark runs one device; communication groups are not expected")
    return Design(
        np.stack([np.broadcast_to(g.compute_s, shape) for g in groups], axis=1),
        np.stack([np.broadcast_to(g.memory_s, shape) for g in groups], axis=1),
        np.broadcast_to(np.rint(sum(g.latency_s for g in groups) / 1e-6), shape).astype(float),  # kernel count
        np.broadcast_to(batch, shape).astype(float),  # a prefill of b prompts or b decodes: b sequences
        next(i for i, g in enumerate(groups) if g.name == "attention"),
        np.full(shape, phase == "decode"),
        gemv_memory_s=np.stack([np.where(np.broadcast_to(g.one_row, shape), np.broadcast_to(g.memory_s, shape), 0.0)
                                if g.one_row is not None else np.zeros(shape) for g in groups], axis=1),
    )


@dataclass(frozen=True)
class Fit:
    efficiency: Efficiency
    rms_rel_error: float


def _overheads(roof: np.ndarray, kernels: np.ndarray, y: np.ndarray,
               steps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell (row of ``roof``): (tau_s, o_s) >= 0 minimising sum((roof + K tau + o) / y - 1)^2, and that sum.

    The 2x2 weighted normal equations are solved in closed form; where their solution leaves the
    feasible quadrant, the better of the two edges (tau = 0 or o = 0) and the corner is taken.
    """
    a, c = kernels / y, (1.0 if steps is None else steps) / y  # (points,)
    z = 1.0 - roof / y  # (cells, points)
    saa, sac, scc = a @ a, a @ c, c @ c
    saz, scz = z @ a, z @ c

    def objective(tau: np.ndarray, o: np.ndarray) -> np.ndarray:
        r = a[None, :] * tau[:, None] + c[None, :] * o[:, None] - z
        return (r * r).sum(axis=1)

    zero = np.zeros(z.shape[0])
    cands = [(zero, zero), (np.maximum(saz / saa, 0.0) if saa > 0 else zero, zero),
             (zero, np.maximum(scz / scc, 0.0) if scc > 0 else zero)]
    det = saa * scc - sac * sac
    singular = det <= 1e-12 * saa * scc  # one kernel count for every point: tau and o are not separable
    with np.errstate(divide="ignore", invalid="ignore"):
        tau_u, o_u = (scc * saz - sac * scz) / det, (saa * scz - sac * saz) / det
    ok = (not singular) & (tau_u >= 0) & (o_u >= 0)
    cands.append((np.where(ok, tau_u, 0.0), np.where(ok, o_u, 0.0)))
    best_tau, best_o, best = zero, zero, np.full(z.shape[0], np.inf)
    for tau, o in cands:
        val = objective(tau, o)
        better = val < best
        best_tau, best_o, best = np.where(better, tau, best_tau), np.where(better, o, best_o), np.minimum(val, best)
    return best_tau, best_o, best


def _nonneg_lstsq(a: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``z`` (cells x points): x >= 0 minimising |a x - z|^2 (``a``: points x k, k small), and that
    sum. Exact: every subset of free coordinates is solved (the others held at 0) and the best feasible kept.
    Subsets that fit equally well (collinear columns: one kernel count for every step, so a kernel latency and a
    step overhead explain the same times) keep the first in an order of fewest columns, the last column first:
    whatever the last bits of the arithmetic (which differ between CPUs' vector units), the fit takes the step
    overhead over the kernel latency there, not one on one machine and the other on the next."""
    k = a.shape[1]
    best_x, best = np.zeros((z.shape[0], k)), (z * z).sum(axis=1)
    for mask in sorted(range(1, 2**k), key=lambda m: (bin(m).count("1"), -m)):
        cols = [j for j in range(k) if mask >> j & 1]
        sub = a[:, cols]
        if np.linalg.matrix_rank(sub) < len(cols):
            continue  # collinear columns (one kernel count for every point): a smaller subset covers it
        xs = (np.linalg.pinv(sub) @ z.T).T  # cells x |cols|
        r = xs @ sub.T - z
        val = (r * r).sum(axis=1)
        better = np.all(xs >= 0, axis=1) & (val < best * (1 - 1e-9))
        x = np.zeros_like(best_x)
        x[:, cols] = xs
        best_x = np.where(better[:, None], x, best_x)
        best = np.where(better, val, best)
    return best_x, best


ATTENTION_SHARES = np.geomspace(0.02, 1.0, 25)
GRAPH_SHARES = np.geomspace(0.02, 1.0, 9)
GEMV_SPEEDUPS = np.geomspace(1.0, 4.0, 13)


def fit_efficiency(d: Design, measured_s: np.ndarray, cells: int = 48, passes: int = 5,
                   fitted_on: str | None = None, per_sequence: bool = False, attention: bool = False,
                   graph: bool = False, gemv: bool = False) -> Fit:
    """``_fit_efficiency``; with ``attention`` also the decode attention kernel's share of the efficiencies
    (``Efficiency.decode_attention``, on a geometric grid from 0.02 to 1), with ``graph`` the share of the
    per-kernel latency a decode step replayed from a CUDA graph pays (``Efficiency.decode_graph_launch``, a grid
    from 0.02 to 1), and with ``gemv`` how many times faster one-row linear layers stream their weights
    (``Efficiency.gemv_speedup``, a grid from 1 to 4): the best fit over the grids."""
    if attention and d.attention is None:
        raise ValueError("attention: the design has no attention group")
    if graph and d.decode_rows is None:
        raise ValueError("graph: the design does not mark its decode rows")
    best: tuple[Fit, float, float, float] | None = None
    for a in ATTENTION_SHARES if attention else (1.0,):
        for g in GRAPH_SHARES if graph else (1.0,):
            for r in GEMV_SPEEDUPS if gemv else (1.0,):
                fit = _fit_efficiency(d.scaled(float(a)).graphed(float(g)).gemv(float(r)), measured_s, cells, passes,
                                      fitted_on, per_sequence)
                if best is None or fit.rms_rel_error < best[0].rms_rel_error:
                    best = (fit, float(a), float(g), float(r))
    assert best is not None
    fit, a, g, r = best
    return Fit(fit.efficiency.model_copy(update={"decode_attention": a, "decode_graph_launch": g,
                                                 "gemv_speedup": r}), fit.rms_rel_error)


def _fit_efficiency(d: Design, measured_s: np.ndarray, cells: int = 48, passes: int = 5,
                    fitted_on: str | None = None, per_sequence: bool = False) -> Fit:
    """The (eta_c, eta_m, kernel latency, step overhead) minimising sum (pred/meas - 1)^2; eta in (0, 1].

    (eta_c, eta_m): a log grid over [1e-3, 1]^2, refined ``passes - 1`` times around the best cell; for each cell the
    non-negative (kernel latency, step overhead) are the closed-form least-squares solution. With ``per_sequence``
    a non-negative cost per sequence in the step (``Efficiency.sequence_overhead_us``) is fitted with them.
    """
    if per_sequence and d.sequences is None:
        raise ValueError("per_sequence: the design has no sequence counts")
    y = np.asarray(measured_s, dtype=float)
    if y.shape != d.kernels.shape or np.any(y <= 0):
        raise ValueError("measured_s: one positive time per design row")
    lo_c, hi_c, lo_m, hi_m = np.log(1e-3), 0.0, np.log(1e-3), 0.0
    best = (np.inf, 1.0, 1.0, 0.0, 0.0, 0.0)
    for _ in range(passes):
        ec, em = np.meshgrid(np.exp(np.linspace(lo_c, hi_c, cells)), np.exp(np.linspace(lo_m, hi_m, cells)), indexing="ij")
        ec, em = ec.ravel(), em.ravel()
        roof = np.maximum(d.compute_s[None] / ec[:, None, None], d.memory_s[None] / em[:, None, None]).sum(axis=2)
        if per_sequence:
            x, val = _nonneg_lstsq(np.stack([d.kernels / y, d.step_counts / y, d.sequences / y], axis=1),  # type: ignore[operator]
                                   1.0 - roof / y)
            tau, o, seq = x[:, 0], x[:, 1], x[:, 2]
        else:
            tau, o, val = _overheads(roof, d.kernels, y, d.step_counts)
            seq = np.zeros_like(tau)
        k = int(np.argmin(val))
        if val[k] < best[0]:
            best = (float(val[k]), float(ec[k]), float(em[k]), float(tau[k]), float(o[k]), float(seq[k]))
        step_c, step_m = (hi_c - lo_c) / (cells - 1), (hi_m - lo_m) / (cells - 1)
        lc, lm = np.log(best[1]), np.log(best[2])
        lo_c, hi_c = lc - 2 * step_c, min(lc + 2 * step_c, 0.0)
        lo_m, hi_m = lm - 2 * step_m, min(lm + 2 * step_m, 0.0)
    _, eta_c, eta_m, tau_s, o_s, seq_s = best
    eff = Efficiency(compute=min(eta_c, 1.0), memory=min(eta_m, 1.0), kernel_latency_us=tau_s * 1e6,
                     step_overhead_us=o_s * 1e6, sequence_overhead_us=seq_s * 1e6, fitted_on=fitted_on)
    rel = d.predict_s(eff) / y - 1.0
    return Fit(eff, float(np.sqrt(np.mean(rel * rel))))


def predict_point_s(m: ModelSpec, device: GPUSpec, phase: str, tokens: int, batch: int, dtype: str,
                    eff: Efficiency) -> tuple[float, str]:
    """Predicted seconds and bound of one point through ``calculator.estimate`` (decode: its first step).

    The model's context window is widened to the point where the grid goes past it (an 8k prompt through
    Llama-2-13B's 4k window): transformers runs such a forward all the same, and the window changes no step time.
    """
    if tokens + 1 > m.max_position_embeddings:
        m = m.model_copy(update={"max_position_embeddings": tokens + 1})
    e = estimate(m, device, isl=tokens, osl=1, batch=batch, weight_dtype=dtype, kv_dtype=dtype,  # type: ignore[arg-type]
                 calibration=eff, rows=False)
    if not e.fits:
        raise ValueError(f"{m.id} batch {batch} x {tokens} tokens does not fit the device's memory: {e.reason}")
    if phase == "prefill":
        return float(e.prefill_s), str(e.prefill_bound)  # type: ignore[arg-type]
    # osl=1: the mean decode context is isl + 1, so decode_bound is the first step's bound too
    return float(e.decode_first_step_s), str(e.decode_bound)  # type: ignore[arg-type]
