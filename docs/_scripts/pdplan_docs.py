"""Helpers for the executed code blocks of the pdplan docs (markdown-exec) and for the build hooks.

Nothing here computes a planning number: the pages call ``calculator`` (and ``api`` through
FastAPI's TestClient) themselves. This module only formats: Markdown tables, plots as inline SVG,
curl commands next to real responses, and the discovery of the committed validation reports.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DOCS = Path(__file__).resolve().parent.parent
"""The docs folder (replaced by the hook with MkDocs' ``docs_dir``)."""


def set_docs_dir(path: Path) -> None:
    global DOCS
    DOCS = Path(path).resolve()


# ------------------------------------------------------------------------------------------ tables

def table(headers: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one letter per column (l, r, c), default left then right."""
    align = align or "l" + "r" * (len(headers) - 1)
    sep = {"l": ":--", "r": "--:", "c": ":-:"}
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(sep[a] for a in align) + "|"]
    for row in rows:
        out.append("| " + " | ".join(str(x).replace("|", "\\|") for x in row) + " |")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ plots

plt.rcParams.update({
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",  # text stays text: smaller files, selectable labels
    "svg.hashsalt": "pdplan",  # deterministic ids, so an unchanged plot gives an unchanged page
    "font.size": 10,
    "legend.frameon": False,
})


def plain_ticks(ax: Any, axis: str = "xy") -> None:
    """Log axes labelled 1, 2, 5, 10 ... instead of 10^0 and 2 x 10^0."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for name in axis:
        a = ax.xaxis if name == "x" else ax.yaxis
        a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
        a.set_minor_formatter(NullFormatter())


def svg(fig: Any, alt: str) -> str:
    """The figure as an inline SVG image (a data URI): nothing is written next to the pages."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    if os.environ.get("PDPLAN_DOCS_PNG_DIR"):  # to look at the plots while editing the docs
        out = Path(os.environ["PDPLAN_DOCS_PNG_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        fig.savefig(out / (re.sub(r"[^a-z0-9]+", "-", alt.lower())[:60] + ".png"), dpi=70, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue().encode()).decode()
    return f'<img class="pdplan-plot" alt="{alt}" src="data:image/svg+xml;base64,{data}">\n'


def png_file(path: Path, alt: str) -> str:
    """A committed PNG inline (base64), for plots made by other tools (the microbenchmark)."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img class="pdplan-plot" alt="{alt}" src="data:image/png;base64,{data}">\n'


# ------------------------------------------------------------------------------------------ REST

@lru_cache(maxsize=1)
def client() -> Any:
    from fastapi.testclient import TestClient

    from api import app

    return TestClient(app)


def curl(method: str, path: str, body: Any = None) -> str:
    """The curl command a reader runs against ``pdplan serve`` on localhost:8000."""
    url = f"localhost:8000{path}"
    if body is None:
        return f"curl -s {url}" if method == "GET" else f"curl -s -X {method} {url}"
    text = json.dumps(body, separators=(", ", ": "))
    return (f"curl -s -X {method} {url} -H 'content-type: application/json' \\\n"
            f"  -d {shlex.quote(text)}")


def trim(value: Any, max_items: int, notes: list[str], where: str = "") -> Any:
    """Lists longer than ``max_items`` cut to their first items; what was cut is added to ``notes``."""
    if isinstance(value, list):
        if len(value) > max_items:
            notes.append(f"`{where or 'the list'}`: first {max_items} of {len(value)} items shown")
        return [trim(v, max_items, notes, f"{where}[]") for v in value[:max_items]]
    if isinstance(value, dict):
        return {k: trim(v, max_items, notes, f"{where}.{k}" if where else k) for k, v in value.items()}
    return value


def call(method: str, path: str, body: Any = None, max_items: int | None = None, expect: int | None = None) -> str:
    """Markdown: the curl command, then the real status and JSON response (lists trimmed, saying so)."""
    c = client()
    r = c.request(method, path, json=body) if body is not None else c.request(method, path)
    if expect is not None and r.status_code != expect:
        raise AssertionError(f"{method} {path}: expected HTTP {expect}, got {r.status_code}: {r.text[:500]}")
    payload = r.json()
    notes: list[str] = []
    if max_items is not None:
        payload = trim(payload, max_items, notes)
    text = json.dumps(payload, indent=2, ensure_ascii=False)
    trimmed = ("\n*Response trimmed for the page: " + "; ".join(dict.fromkeys(notes)) + ".*\n") if notes else ""
    return (f"```bash\n{curl(method, path, body)}\n```\n\n"
            f"HTTP **{r.status_code}**{' (trimmed)' if notes else ''}\n\n```json\n{text}\n```\n{trimmed}")


# ------------------------------------------------------------------------------------------ schemas

def _type_of(spec: dict[str, Any] | bool) -> str:
    if isinstance(spec, bool):  # JSON Schema's true: anything (a free-form mapping's values)
        return "any"
    if "$ref" in spec:
        return spec["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in spec:
        return " | ".join(_type_of(x) for x in spec["anyOf"])
    if "enum" in spec:
        return " | ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{spec['const']}`"
    if spec.get("type") == "array":
        return f"list of {_type_of(spec.get('items', {}))}"
    if spec.get("type") == "object" and "additionalProperties" in spec:
        return f"mapping to {_type_of(spec['additionalProperties'])}"
    return spec.get("type", "any")


_BOUNDS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"),
           ("minItems", "items ≥"), ("maxItems", "items ≤"), ("minLength", "length ≥"), ("maxLength", "length ≤"))


def _bounds(spec: dict[str, Any]) -> list[str]:
    out = [f"{sign} {spec[key]:,}" if isinstance(spec[key], (int, float)) else f"{sign} {spec[key]}"
           for key, sign in _BOUNDS if key in spec]
    for alt in spec.get("anyOf", []):
        out += _bounds(alt)
    return out


def fields(model: Any, mode: str = "validation") -> str:
    """A Markdown table of a pydantic model's fields: type, default, bounds, description."""
    js = model.model_json_schema(mode=mode)
    required = set(js.get("required", []))
    if mode == "serialization":  # an output: every field is always present, no defaults or bounds to show
        rows = [[f"`{name}`", _type_of(spec), spec.get("description", "")] for name, spec in js.get("properties", {}).items()]
        return table(["field", "type", "meaning"], rows, "lll")
    rows = []
    for name, spec in js.get("properties", {}).items():
        default = "required" if name in required else f"`{json.dumps(spec['default'])}`" if "default" in spec else ""
        rows.append([f"`{name}`", _type_of(spec), default, ", ".join(_bounds(spec)), spec.get("description", "")])
    return table(["field", "type", "default", "bounds", "meaning"], rows, "lllll")


# ------------------------------------------------------------------------------------------ CLI

def cli(*args: str) -> str:
    """Run ``pdplan ARGS`` in-process (typer's CliRunner) and return the command and its output."""
    from typer.testing import CliRunner

    from calculator.cli import app

    result = CliRunner().invoke(app, list(args))
    if result.exit_code not in (0, 1):
        raise AssertionError(f"pdplan {' '.join(args)} exited {result.exit_code}: {result.output}")
    return f"```console\n$ pdplan {shlex.join(args)}\n{result.output.rstrip()}\n```\n"


# ------------------------------------------------------------------------------------------ validation reports

@dataclass(frozen=True)
class Report:
    name: str
    dir: Path
    title: str

    @property
    def page(self) -> str:
        """Path of the report page relative to the docs folder."""
        return f"validation/{self.name}/report.md"

    @property
    def text(self) -> str:
        return (self.dir / "report.md").read_text(encoding="utf-8")


def validation_reports() -> list[Report]:
    """Every committed ``docs/validation/<name>/report.md``, sorted by name."""
    out = []
    for md in sorted((DOCS / "validation").glob("*/report.md")):
        first = next((ln for ln in md.read_text(encoding="utf-8").splitlines() if ln.startswith("# ")), None)
        title = first[2:].strip() if first else md.parent.name
        out.append(Report(md.parent.name, md.parent, title))
    return out


def sections(markdown: str) -> list[tuple[str, str]]:
    """(heading, body) of each level-2 section of a Markdown text."""
    parts = re.split(r"^## +(.+)$", markdown, flags=re.MULTILINE)
    return [(parts[i].strip(), parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2)]


_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


def _relink(markdown: str, prefix: str) -> str:
    """Relative links and images of a report, made relative to the docs root."""
    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        return f"{m.group(1)}{prefix}{target}{m.group(3)}"

    return _LINK.sub(fix, markdown)


def validation_summary() -> str:
    """Markdown for the Validation page: each report's error tables, plot and a link to the full report."""
    reports = validation_reports()
    if not reports:
        return ("!!! note \"No reports committed yet\"\n"
                "    No `docs/validation/<name>/report.md` was found when this site was built. "
                "Run `pdplan validate --out docs/validation/<name>` and rebuild.\n")
    out = [f"{len(reports)} report{'s' if len(reports) > 1 else ''} found in `docs/validation/` when this site was built.\n"]
    for r in reports:
        out.append(f"## {r.title}\n")
        out.append(f"Full report: [{r.name}]({r.page}) (`docs/validation/{r.name}/report.md`).\n")
        kept = [(h, b) for h, b in sections(r.text) if re.search(r"error|fitted", h, flags=re.IGNORECASE)]
        if not kept:
            out.append("*This report has no section on error or fitted constants; see the full report.*\n")
        for heading, body in kept:
            out.append(f"### {heading}\n\n{_relink(body, f'validation/{r.name}/')}\n")
        if (r.dir / "plot.png").is_file() and "plot.png" not in "".join(b for _, b in kept):
            out.append(f"![{r.name}: predicted against measured](validation/{r.name}/plot.png)\n")
    return "\n".join(out)
