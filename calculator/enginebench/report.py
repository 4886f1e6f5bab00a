"""The serving validation's outputs: checks, a markdown report, the JSON record and a plot."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from .engine import CONFIGS, core_layout
from .predict import Drift, drift, measured_steps, point_checks
from .results import NEIGHBOUR_BATCH, LoadPoint, ServingReport

METRICS = (("ttft_p50_s", "TTFT p50", 1e3, "ms"), ("ttft_p90_s", "TTFT p90", 1e3, "ms"),
           ("tpot_p50_s", "TPOT p50", 1e3, "ms"), ("tpot_p90_s", "TPOT p90", 1e3, "ms"))
P50_BOUND, P90_BOUND, SATURATION_BOUND = 0.25, 0.35, 0.15
"""The issue's acceptance at utilisation <= 0.8: p50 within 25%, p90 within 35%; saturation within 15%."""
MAX_LOADED_FRACTION = 0.8
QUIET_LOAD = 2.5
"""A 1-minute load average above this on 2 cores means something besides the engine, its API server and
the client was running (they alone keep ~2 runnable)."""


def widening(report: ServingReport) -> float:
    """The factor on the accuracy bounds: 2 when the machine was busy, the load average above ``QUIET_LOAD``
    (1P1D runs two engines and two API servers: 1.5 more)."""
    busy = any(p.load_average > QUIET_LOAD + (1.5 if CONFIGS[p.config].disaggregated else 0.0) for p in report.points)
    return 2.0 if busy else 1.0


def rel_error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return predicted / measured - 1.0


def _saturated(report: ServingReport, config: str) -> LoadPoint | None:
    over = [p for p in report.points if p.config == config and p.fraction_of_capacity > 1.0]
    return max(over, key=lambda p: p.measured.throughput_rps or 0.0) if over else None


def saturation_rps(report: ServingReport, config: str) -> float | None:
    """The measured saturation rate: the sustained throughput of the point offered beyond the predicted capacity."""
    p = _saturated(report, config)
    return None if p is None else (p.measured.throughput_rps or 0.0)


def predicted_saturation_rps(report: ServingReport, config: str) -> float:
    """pdplan's capacity for the point that measured the saturation, with the step times at the check before
    it (``LoadPoint.capacity_for_saturation_rps``); as calibrated where there is no such point."""
    p = _saturated(report, config)
    if p is not None:
        return p.capacity_for_saturation_rps
    return next(p.predicted_capacity_rps for p in report.points if p.config == config)


def step_drift(report: ServingReport, p: LoadPoint) -> Drift | None:
    """How the instance's unloaded steps had moved from its calibration at the check the point was predicted
    with (None: the point was predicted as calibrated)."""
    if p.capacity_at_check_rps is None:
        return None
    c = next((c for c in report.calibrations if c.config == p.config), None)
    if c is None:
        return None
    mine = [q for q in report.points if q.config == p.config]
    check_d, check_p = point_checks(mine, c, CONFIGS[p.config].disaggregated)[mine.index(p)]
    return drift(measured_steps(c), report.isl, check_d, check_p)


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def _fmt(x: float | None, scale: float = 1e3) -> str:
    return "—" if x is None else f"{x * scale:.3g}"


def _err(e: float | None) -> str:
    return "—" if e is None else f"{e:+.0%}"


def accuracy(report: ServingReport) -> list[tuple[LoadPoint, str, float | None, float]]:
    """(point, metric, relative error, bound) for every figure at utilisation <= 0.8."""
    out = []
    for p in report.points:
        if p.fraction_of_capacity > MAX_LOADED_FRACTION:
            continue
        for key, _, _, _ in METRICS:
            bound = P50_BOUND if "p50" in key else P90_BOUND
            out.append((p, key, rel_error(getattr(p.predicted, key), getattr(p.measured, key)), bound))
    return out


def _lone_prefill_s(report: ServingReport, config: str) -> float | None:
    """The instance's measured time for a lone prompt of the report's length (its calibration), s."""
    c = next((c for c in report.calibrations if c.config == config), None)
    step = None if c is None else next((s for s in c.steps if s.phase == "prefill" and s.tokens == report.isl), None)
    return None if step is None else step.seconds


def checks(report: ServingReport, widen: float = 1.0) -> list[Check]:
    """The orderings that must hold whatever the noise, and the accuracy bounds (times ``widen``)."""
    out: list[Check] = []
    configs = list(dict.fromkeys(p.config for p in report.points))
    by = {c: sorted((p for p in report.points if p.config == c), key=lambda p: p.rate_rps) for c in configs}
    for c in configs:
        pts = by[c]
        lo, hi = pts[0].measured, pts[-1].measured
        ok = all(x is not None for x in (lo.ttft_p90_s, hi.ttft_p90_s, lo.tpot_p50_s, hi.tpot_p50_s))
        out.append(Check(f"{c}: latency rises with rate", ok and hi.ttft_p90_s > lo.ttft_p90_s  # type: ignore[operator]
                         and hi.tpot_p50_s > lo.tpot_p50_s,  # type: ignore[operator]
                         f"TTFT p90 {_fmt(lo.ttft_p90_s)} -> {_fmt(hi.ttft_p90_s)} ms, TPOT p50 {_fmt(lo.tpot_p50_s)} -> "
                         f"{_fmt(hi.tpot_p50_s)} ms from {pts[0].rate_rps:.1f} to {pts[-1].rate_rps:.1f} req/s"))
    chunked = sorted((c for c in configs if not CONFIGS[c].disaggregated), key=lambda c: CONFIGS[c].budget_tokens)
    for small, big in itertools.pairwise(chunked):
        a, b = by[small][0].measured, by[big][0].measured
        out.append(Check(f"{small} vs {big}: a smaller budget streams more evenly (lower ITL p99)",
                         a.itl_p99_s is not None and b.itl_p99_s is not None and a.itl_p99_s < b.itl_p99_s,
                         f"ITL p99 {_fmt(a.itl_p99_s)} vs {_fmt(b.itl_p99_s)} ms at the lowest rate"))
        # measured on each instance's lone ISL-token prompt (its calibration): under load each config's
        # lowest rate is half its own capacity, so the loaded TTFTs mix the budget with the rate and sit
        # within 60 requests' noise of each other (75 vs 81 ms once); the lone prompt isolates the budget
        lone = {c: _lone_prefill_s(report, c) for c in (small, big)}
        out.append(Check(f"{small} vs {big}: a smaller budget takes longer to first token",
                         None not in lone.values() and lone[small] > lone[big],  # type: ignore[operator]
                         f"a lone {report.isl}-token prompt: {_fmt(lone[small])} vs {_fmt(lone[big])} ms unloaded; "
                         f"TTFT p50 {_fmt(a.ttft_p50_s)} vs {_fmt(b.ttft_p50_s)} ms at the lowest rate"))
    sat = {c: saturation_rps(report, c) for c in configs}
    if all(v is not None for v in sat.values()) and len(configs) > 1:
        pred = {c: predicted_saturation_rps(report, c) for c in configs}
        order_pred = sorted(configs, key=lambda c: pred[c])
        order_meas = sorted(configs, key=lambda c: sat[c])  # type: ignore[arg-type,return-value]
        out.append(Check("saturation order: predicted = measured", order_pred == order_meas,
                         f"predicted {' < '.join(order_pred)}, measured {' < '.join(order_meas)}"))
        for c in configs:
            e = rel_error(pred[c], sat[c])
            out.append(Check(f"{c}: saturation within {SATURATION_BOUND * widen:.0%}",
                             e is not None and abs(e) <= SATURATION_BOUND * widen,
                             f"predicted {pred[c]:.2f}, measured {sat[c]:.2f} req/s ({_err(e)})"))
    for p, key, e, bound in accuracy(report):
        label = {k: n for k, n, _, _ in METRICS}[key]
        out.append(Check(f"{p.config} at {p.rate_rps:.1f} req/s: {label} within {bound * widen:.0%}",
                         e is not None and abs(e) <= bound * widen,
                         f"predicted {_fmt(getattr(p.predicted, key))}, measured {_fmt(getattr(p.measured, key))} ms "
                         f"({_err(e)})"))
    return out


def _summary(report: ServingReport) -> list[str]:
    """Per configuration: the median and worst |error| of p50 and p90 at utilisation <= 0.8, how many
    figures are within the bounds, and the saturation error."""
    acc = accuracy(report)
    lines = [("| config | p50 median / worst error | p90 median / worst error | within 25% (p50) / 35% (p90) | "
              "saturation error |"), "|---|---|---|---|---|"]

    def stat(row: list[tuple[str, float | None, float]], tag: str) -> str:
        es = [abs(e) for key, e, _ in row if tag in key and e is not None]
        return f"{statistics.median(es):.0%} / {max(es):.0%}" if es else "—"

    for cf in dict.fromkeys(p.config for p in report.points):
        row = [(key, e, b) for p, key, e, b in acc if p.config == cf]

        within = sum(e is not None and abs(e) <= b for _, e, b in row)
        cap = predicted_saturation_rps(report, cf)
        lines.append(f"| {CONFIGS[cf].name} | {stat(row, 'p50')} | {stat(row, 'p90')} | {within} of {len(row)} | "
                     f"{_err(rel_error(cap, saturation_rps(report, cf)))} |")
    return lines


def _calibration_lines(c) -> list[str]:  # type: ignore[no-untyped-def]
    eff = c.efficiency
    return [
        "",
        f"### {CONFIGS[c.config].name if c.config in CONFIGS else 'engine'}",
        "",
        (f"Fitted: η_c {eff.compute:.3f}, η_m {eff.memory:.3f}, kernel latency {eff.kernel_latency_us:.1f} µs, "
         f"step overhead {eff.step_overhead_us:.0f} µs, per sequence {eff.sequence_overhead_us:.0f} µs, decode attention at "
         f"{eff.decode_attention:.2f} of the GEMM efficiencies"
         f"{' in decode-only steps (a step with a prompt piece attends in one kernel at the GEMM efficiencies)' if eff.hybrid_attention_kernels == 1 and eff.decode_attention < 1 else ''}"
         f" (rms error {c.fit_rms_rel_error:.1%}). Front end per request "
         f"(client TTFT − the engine's queue + prefill time): {c.front_end_request_s * 1e3:.2f} ms.")
        + (f" 1P1D unloaded TTFT {c.disaggregated_unloaded_ttft_s * 1e3:.1f} ms, of which the KV connector's move "
           f"{c.transfer_s * 1e3:.1f} ms: {(c.save_s or 0) * 1e3:.1f} ms saving on the prefill instance (pdplan: a "
           f"blocking transfer, prefill work) and {c.load_s * 1e3:.1f} ms loading on the decode instance (a delay "
           f"in TTFT, added like the front ends)." if c.transfer_s is not None and c.disaggregated_unloaded_ttft_s
           else ""),
        "",
        "| step | tokens | batch | measured ms |",
        "|---|---|---|---|",
        *(f"| {s.phase}{'' if s.chunk is None else f' in chunks of {s.chunk}'} | {s.tokens} | {s.batch} | "
          f"{s.seconds * 1e3:.2f} |" for s in c.steps),
    ]


def _neighbour_lines(report: ServingReport) -> list[str]:
    cals = [c for c in report.calibrations  # 1P1D's calibration is the co-located one before it
            if c.neighbour_slowdown is not None and not (c.config in CONFIGS and CONFIGS[c.config].disaggregated)]
    if not cals:
        return []
    lines = ["", "## What the model leaves out: the engine's neighbours", "",
             (f"A decode step of {NEIGHBOUR_BATCH} sequences (median inter-token gap), measured unloaded with a second "
              "process on the front-end core: one that only computes (the control) and one that streams memory "
              "(copies larger than the shared cache). The engine's decode steps are memory-bound; under load the API "
              "server and the client on that core parse, serialise and stream, and share the cache and memory bus "
              "with it. pdplan's step model has no term for a neighbour on the memory system (a GPU's front end runs "
              "on the host and does not share HBM), so on this machine measured TPOT under load may exceed the "
              "prediction by up to the memory neighbour's slowdown."), "",
             "| instance | alone ms | beside a computing process | beside a memory-streaming process |",
             "|---|---|---|---|"]
    for c in cals:
        assert c.alone_decode_s is not None and c.neighbour_decode_s is not None
        comp = c.compute_neighbour_decode_s
        comp_cell = "—" if comp is None else f"{comp * 1e3:.2f} ms ({_err(comp / c.alone_decode_s - 1)})"
        lines.append(f"| {CONFIGS[c.config].name if c.config in CONFIGS else 'engine'} | {c.alone_decode_s * 1e3:.2f} | "
                     f"{comp_cell} | {c.neighbour_decode_s * 1e3:.2f} ms ({_err(c.neighbour_slowdown - 1)}) |")
    return lines


def _layout_text(report: ServingReport) -> str:
    """Where the run's processes ran (``engine.core_layout`` over the cores it had)."""
    cores = report.cores or (0, 1)
    colocated, disaggregated = core_layout(set(cores), 1), core_layout(set(cores), 2)
    text = (f"Each engine core (scheduler and model worker in one process) is pinned to one core, out of "
            f"the {len(cores)} the run had; co-located: {colocated.describe()}; 1P1D: {disaggregated.describe()}.")
    if colocated.shared or disaggregated.shared:
        text += (" Where processes share a core, the front ends' parsing and streaming take time from the engine or "
                 "the client beside them.")
    return text


def markdown(report: ServingReport) -> str:
    c = report.calibration
    loads = [p.load_average for p in report.points]
    lines = [
        f"# Serving model against {report.engine} {report.engine_version}",
        "",
        (f"{report.date}; {report.machine} ({report.machine_details}); "
         f"{'quick' if report.quick else 'full'} run of {report.wall_s / 60:.1f} min; "
         f"1-minute load average {min(loads):.2f}–{max(loads):.2f} during the load points."),
        "",
        (f"Model: random-weight Llama (4 layers, hidden 512, 8/2 heads, vocab 4096, {report.dtype}"
         f"{'' if report.dtype == 'bf16' else ': this CPU has no native bf16'}). {_layout_text(report)} "
         f"Every request: {report.isl} prompt tokens (random words, no "
         f"prefix-cache hits: caching off), exactly {report.osl} output tokens, Poisson arrivals, "
         f"{report.requests_per_point} requests per point, streamed."),
        *(["", (f"Predictions made again by {report.predicted_by} from this run's measurements "
                 "(`pdplan validate --serving --reanalyse DIR`): the same step times, front ends and rates, this "
                 "version's fit and serving model.")] if report.predicted_by else []),
        *(["", (f"**Busy machine**: the load average exceeded {QUIET_LOAD} during the run, so the checks below use "
                f"bounds widened {widening(report):g}x.")] if widening(report) > 1 else []),
        "",
        "## Error summary",
        "",
        *_summary(report),
        "",
        "![measured against predicted latency](plot.png)",
        "",
        ("The plot's lines are pdplan's curves from each calibration as measured; the tables score each point's "
         "own prediction, made at the check before it."),
        "",
        "## Calibration (unloaded, same run)",
        "",
        (f"CPU ceilings on one thread: {report.matmul_gflops:.0f} GFLOP/s {report.dtype} matmul, {report.copy_gb_s:.1f} GB/s "
         "copy. Each co-located engine instance is measured after it starts (two starts of the same engine "
         "differ by up to ~30% here); 1P1D uses the one of the instance with chunking off, as its two instances run."),
    ]
    for cal in report.calibrations or (c,):
        lines += _calibration_lines(cal)
    lines += ["", "## Load points", "",
              ("Errors are predicted / measured − 1. Predicted TTFT includes the measured front end. pdplan predicts "
               "each point at the rate its requests arrived at ("
               + (f"the run's Poisson arrivals span exactly ({report.requests_per_point} − 1) / rate, so it is the "
                  "offered rate up to the client's timer" if report.arrivals == "conditioned" else
                  f"a free Poisson sample of {report.requests_per_point} strays from the offered rate by "
                  f"~{report.requests_per_point ** -0.5:.0%}; * replayed from the run's seed, not recorded by it")
               + "). Each point is predicted with the step times "
              "at the unloaded check just before it (the decode step and the lone prompt over the calibration's: "
              "the steps column; 1P1D: the decode step on its decode instance, the prompt on its prefill "
              "instance), refitted; † a run without checks: the neighbour test's decode step, the last one it "
              "took before its points; — as calibrated (1P1D of a run without checks)."), "",
              "| config | offered req/s | arrived req/s | of capacity | load avg | steps (decode, prompt) | "
              + " | ".join(f"{n} pred / meas (err)" for _, n, _, _ in METRICS)
              + " | ITL p90 pred / meas (err) | ITL p99 meas | throughput req/s | failed |",
              "|" + "---|" * (10 + len(METRICS))]
    for p in report.points:
        cells = []
        for key, _, scale, _ in METRICS:
            pr, me = getattr(p.predicted, key), getattr(p.measured, key)
            cells.append(f"{_fmt(pr, scale)} / {_fmt(me, scale)} ms ({_err(rel_error(pr, me))})")
        arrived = "—" if p.arrival_rate_rps is None else f"{p.arrival_rate_rps:.2f}{'*' if p.arrival_rate_replayed else ''}"
        dr = step_drift(report, p)
        moved = "—" if dr is None else (f"{dr.decode:.2f}, {dr.prefill:.2f}"
                                         + ("†" if p.check_decode_s is None and p.check_prefill_s is None else ""))
        lines.append(f"| {p.config_name} | {p.rate_rps:.2f} | {arrived} | {p.fraction_of_capacity:.2f} | {p.load_average:.2f} | "
                     f"{moved} | " + " | ".join(cells) + f" | {_fmt(p.predicted.itl_p90_s)} / {_fmt(p.measured.itl_p90_s)} ms "
                     f"({_err(rel_error(p.predicted.itl_p90_s, p.measured.itl_p90_s))}) | {_fmt(p.measured.itl_p99_s)} ms | "
                     f"{_fmt(p.measured.throughput_rps, 1)} | {p.measured.failed} |")
    lines += ["", "## What the engine did", "",
              ("From the engine's own counters over each load point: its core's busy share (engine-core CPU time / "
              "wall time), steps per second, tokens per step and busy time per step; pdplan's utilisation of the "
              "binding resource beside it."), "",
              ("| config | rate req/s | pdplan utilisation (binding) | engine busy | steps/s | tokens/step | ms/step | "
              "preemptions |"), "|---|---|---|---|---|---|---|---|"]
    for p in report.points:
        for i, e in enumerate(p.engines):
            tag = f" ({'prefill' if i == 0 else 'decode'})" if len(p.engines) > 1 else ""
            util = "—" if p.predicted.utilisation is None else f"{p.predicted.utilisation:.2f} ({p.predicted.binding})"
            lines.append(f"| {p.config_name}{tag} | {p.rate_rps:.2f} | {util} | {e.busy_share:.2f} | "
                         f"{e.steps_per_s:.0f} | {e.tokens_per_step:.1f} | {_fmt(e.mean_step_s)} | {e.preemptions:.0f} |")
    lines += _neighbour_lines(report)
    configs = list(dict.fromkeys(p.config for p in report.points))
    sats = [(cf, saturation_rps(report, cf)) for cf in configs]
    if any(s is not None for _, s in sats):
        lines += ["", "## Saturation", "",
                  ("The measured saturation is compared with pdplan's capacity for the step times of the check "
                   "just before that point (as calibrated where there was none)."), "",
                  "| config | predicted capacity as calibrated req/s | at the check req/s | measured saturation req/s "
                  "| error |", "|---|---|---|---|---|"]
        for cf, s in sats:
            cap0 = next(p.predicted_capacity_rps for p in report.points if p.config == cf)
            cap = predicted_saturation_rps(report, cf)
            lines.append(f"| {CONFIGS[cf].name} | {cap0:.2f} | {cap:.2f} | {_fmt(s, 1)} | {_err(rel_error(cap, s))} |")
    ck = checks(report, widening(report))
    lines += ["", "## Checks", "", f"{sum(k.passed for k in ck)} of {len(ck)} pass.", "", "| check | | detail |",
              "|---|---|---|"]
    lines += [f"| {k.name} | {'pass' if k.passed else '**miss**'} | {k.detail} |" for k in ck]
    return "\n".join(lines) + "\n"


def plot(report: ServingReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    colours = dict(zip(CONFIGS, ("C0", "C1", "C2", "C3")))
    for ax, (key, label, scale, unit) in zip(axes.ravel(), METRICS):
        for cv in report.curves:
            ys = [math.nan if y is None else y * scale for y in getattr(cv, key)]
            ax.plot(cv.rate_rps, ys, "-", color=colours[cv.config], label=f"{CONFIGS[cv.config].name} (pdplan)")
        for p in report.points:
            y = getattr(p.measured, key)
            if y is not None:
                ax.plot([p.predicted_at_rps], [y * scale], "o", color=colours[p.config],
                        mfc="none" if p.fraction_of_capacity > 1 else colours[p.config])
        ax.set_xlabel("arrival rate, req/s")
        ax.set_ylabel(f"{label}, {unit}")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    if report.curves:
        axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{report.engine} {report.engine_version}: measured (dots, at the rate the requests arrived at; "
                 "hollow: offered beyond predicted capacity) vs pdplan (lines)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(report: ServingReport, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(report.model_dump_json(indent=1) + "\n", encoding="utf-8")
    (out_dir / "report.md").write_text(markdown(report), encoding="utf-8")
    plot(report, out_dir / "plot.png")
