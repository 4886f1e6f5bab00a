"""``--csv`` and ``--plot`` of ``pdplan plan``, ``sweep`` and ``evaluate``: the response models as CSV
rows (columns named as the JSON fields) and as matplotlib figures (.png or .svg).

matplotlib is imported only to draw, so the CLI starts without it; ``check_plot`` fails at once,
before any computation, when it is missing or the file's suffix is not one it writes here.
"""

from __future__ import annotations

import csv
import io
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from .optimizer import Candidate, Plan
    from .service import SweepResponse
    from .serving import SLO, Evaluation

PLOT_SUFFIXES = (".png", ".svg")
STDOUT = "-"
"""``--csv -`` writes the CSV to stdout instead of the table."""


def check_plot(path: Path | None) -> None:
    """``InputError`` (exit 2) for a suffix other than .png/.svg or when matplotlib is missing."""
    if path is None:
        return
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError("plot", f"{path}: cannot tell the format from {path.suffix or 'no suffix'!r}; "
                                 f"name a {' or '.join(PLOT_SUFFIXES)} file")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError("plot", "drawing needs matplotlib: pip install matplotlib (or pip install 'pdplan[bench]')"
                         ) from None


def write_csv(target: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """The rows as CSV to stdout (``-``) or a file (OSError when it cannot be written); None is empty."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows([["" if x is None else x for x in r] for r in rows])
    if target == STDOUT:
        sys.stdout.write(buf.getvalue())
    else:
        Path(target).write_text(buf.getvalue(), encoding="utf-8")


# ------------------------------------------------------------------------------------------ rows

def plan_rows(ranked: Sequence[Candidate], label: Any) -> tuple[list[str], list[list[Any]]]:
    """One row per candidate in rank order: rank, the deployment's ``label``, then every other field."""
    from .optimizer import Candidate

    fields = [f for f in Candidate.model_fields if f not in ("mode", "deployment")]
    rows = [[i, c.mode, label(c.deployment), *(getattr(c, f) for f in fields)] for i, c in enumerate(ranked, 1)]
    return ["rank", "mode", "deployment", *fields], rows


def sweep_rows(r: SweepResponse) -> tuple[list[str], list[list[Any]]]:
    """One row per swept value: the value, every series, the label."""
    names = list(r.series)
    return [r.vary, *names, "label"], [[v, *(r.series[n][i] for n in names), r.labels[i]]
                                       for i, v in enumerate(r.values)]


def evaluation_rows(e: Evaluation) -> tuple[list[str], list[list[Any]]]:
    """One row per computed percentile: TTFT, TPOT and ITL in seconds."""
    tables = {"ttft_s": e.ttft_by_percentile_s, "tpot_s": e.tpot_by_percentile_s, "itl_s": e.itl_by_percentile_s}
    percentiles = sorted({p for t in tables.values() for p in t})
    return ["percentile", *tables], [[p, *(t.get(p) for t in tables.values())] for p in percentiles]


# ------------------------------------------------------------------------------------------ plots

def _figure(rows: int = 1, cols: int = 1, height: float = 4.5) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, height), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


def _number(x: float | None) -> float:
    return math.nan if x is None else float(x)


def plot_plan(plan: Plan, ranked: Sequence[Candidate], label: Any, path: Path) -> None:
    """Output tokens/s per GPU against tokens/s per user: the Pareto frontier and the candidates."""
    fig, axes = _figure()
    ax = axes[0][0]
    if plan.pareto:
        ax.plot([p.tokens_per_s_per_user for p in plan.pareto], [p.output_tokens_per_s_per_gpu for p in plan.pareto],
                "-", color="0.6", label="frontier (every configuration and load)")
    for mode, marker in (("mixed", "o"), ("chunked", "s"), ("disaggregated", "^")):
        pts = [c for c in ranked if c.mode == mode]
        if pts:
            ax.scatter([c.tokens_per_s_per_user for c in pts], [c.output_tokens_per_s_per_gpu for c in pts],
                       marker=marker, label=f"{mode} candidates")
    if ranked:
        best = ranked[0]
        ax.annotate(f"best: {label(best.deployment)}", (best.tokens_per_s_per_user, best.output_tokens_per_s_per_gpu),
                    textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_xlabel("tokens/s per user (1 / mean TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(f"{plan.model} at {plan.workload.rate:g} req/s")
    ax.legend(fontsize=8)
    fig.savefig(path)


def plot_sweep(r: SweepResponse, path: Path) -> None:
    """Each series against the swept input, one panel each."""
    names = list(r.series)
    fig, axes = _figure(len(names), 1, height=1.8 * len(names) + 0.6)
    for ax, name in zip((a[0] for a in axes), names, strict=True):
        ax.plot(r.values, [_number(x) for x in r.series[name]], "o-")
        ax.set_ylabel(name, fontsize=8)
    axes[-1][0].set_xlabel(r.vary)
    axes[0][0].set_title(f"{r.target} over {r.vary}")
    fig.savefig(path)


def plot_evaluation(e: Evaluation, slo: SLO | None, path: Path) -> None:
    """TTFT, TPOT and ITL against the percentile, with the SLO's targets."""
    fig, axes = _figure(1, 3, height=3.5)
    tables = (("TTFT", e.ttft_by_percentile_s, None if slo is None else slo.ttft_s),
              ("TPOT", e.tpot_by_percentile_s, None if slo is None else slo.tpot_s),
              ("ITL", e.itl_by_percentile_s, None if slo is None else slo.itl_s))
    for ax, (name, table, target) in zip(axes[0], tables, strict=True):
        ps = sorted(table)
        ax.plot(ps, [table[p] for p in ps], "o-")
        if target is not None:
            ax.axhline(target, color="red", linestyle="--", label="SLO")
            ax.legend(fontsize=8)
        ax.set_xlabel("percentile")
        ax.set_title(f"{name} (s)")
    fig.savefig(path)
