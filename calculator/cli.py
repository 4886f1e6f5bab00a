"""``pdplan``: the command line. Each command builds a ``calculator.service`` request from its
options, calls the same function the REST API calls, and prints a rich table or, with ``--json``,
the response model as JSON. Errors print one line and exit 2.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hardware_db.loader import UnknownIdError

from . import service as s

app = typer.Typer(help="pdplan: closed-form capacity planning for LLM serving.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
PIPE_WIDTH = 160
"""Columns when stdout is not a terminal (a pipe, a file): wide enough that tables are not cut."""


class _Out:
    """stdout console resolved at print time, so a pipe gets full-width tables and a terminal its own."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        Console(width=None if sys.stdout.isatty() else PIPE_WIDTH).print(*objects, **kwargs)


out = _Out()
err = Console(stderr=True, width=PIPE_WIDTH)

JsonOpt = Annotated[bool, typer.Option("--json", help="print the response as JSON")]
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s|m|min)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "m": 60.0, "min": 60.0}


def parse_duration(text: str, name: str) -> float:
    """Seconds from '2s', '50ms', '200us', '1.5', '1m'; bare numbers are seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{name}: cannot read {text!r} as a duration (e.g. 2s, 50ms, 0.05)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _fail(message: str) -> NoReturn:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _run(fn, *args: Any) -> Any:
    try:
        return fn(*args)
    except UnknownIdError as e:
        _fail(str(e))
    except ValidationError as e:
        first = e.errors()[0]
        _fail(f"{'.'.join(map(str, first['loc'])) or 'input'}: {first['msg']}")
    except ValueError as e:
        _fail(str(e))


def _model_ref(text: str) -> Any:
    """A database id, or a path to a Hugging Face config.json (or a directory holding one)."""
    p = Path(text)
    if text.endswith(".json") or p.is_dir():
        target = p / "config.json" if p.is_dir() else p
        try:
            return s.HFConfig(hf_config=json.loads(target.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as e:
            _fail(f"model: cannot read {target} ({e})")
    return text


def _print_json(model: BaseModel | list[BaseModel]) -> None:
    if isinstance(model, list):
        sys.stdout.write(json.dumps([m.model_dump(mode="json") for m in model], indent=2) + "\n")
    else:
        sys.stdout.write(model.model_dump_json(indent=2) + "\n")


def _gb(x: float | None) -> str:
    return "—" if x is None else f"{x / 1e9:,.2f} GB"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:,.2f} ms"


def _table(title: str, columns: tuple[str, ...], left: tuple[str, ...]) -> Table:
    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right")
    return t


@app.command()
def gpus(as_json: JsonOpt = False) -> None:
    """The GPU database: memory, bandwidth, peak FLOP/s, price."""
    rows = s.gpu_catalog()
    if as_json:
        _print_json(rows)
        return
    t = _table(f"{len(rows)} GPUs (hardware_db/data/gpus.yaml)",
               ("id", "name", "HBM GB", "TB/s", "bf16 TFLOP/s", "fp8 TFLOP/s", "scale-up GB/s", "$/h", "confidence"),
               ("id", "name", "confidence"))
    for g in rows:
        t.add_row(g.id, g.name, f"{g.hbm_gb:g}", f"{g.hbm_bandwidth_tb_s:g}", f"{g.peak_tflops.bf16:g}",
                  f"{g.peak_tflops.fp8:g}" if g.peak_tflops.fp8 else "—", f"{g.scaleup_bandwidth_gb_s:g}",
                  f"{g.price_usd_per_hour:.2f}" + ("*" if g.price_is_assumption else ""), g.confidence)
    out.print(t)
    out.print("* assumed price (see price_note)")


@app.command()
def models(as_json: JsonOpt = False) -> None:
    """The model database: parameters, layers, KV bytes per token."""
    rows = s.model_catalog()
    if as_json:
        _print_json(rows)
        return
    t = _table(f"{len(rows)} models (hardware_db/data/models.yaml)",
               ("id", "name", "params", "active", "layers", "heads q/kv", "KV B/token (bf16)", "context"), ("id", "name"))
    for r in rows:
        m = r.spec
        t.add_row(m.id, m.name, f"{r.param_count / 1e9:,.2f} B", f"{r.active_param_count / 1e9:,.2f} B",
                  str(m.num_layers), f"{m.num_attention_heads}/{m.num_kv_heads}", f"{r.kv_bytes_per_token_bf16:,.0f}",
                  f"{m.max_position_embeddings:,}")
    out.print(t)


@app.command()
def kv(
    model: Annotated[str, typer.Argument(help="model id, or a path to a Hugging Face config.json")],
    tokens: Annotated[int, typer.Option(help="context tokens per request")] = 4096,
    batch: Annotated[int, typer.Option(help="concurrent requests")] = 1,
    kv_dtype: Annotated[str, typer.Option(help="bf16, fp16, fp8, int8, int4")] = "bf16",
    tp: Annotated[int, typer.Option(help="tensor-parallel degree")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """KV-cache bytes per token, per request and for a batch."""
    req = _run(lambda: s.KVRequest(model=_model_ref(model), kv_dtype=kv_dtype, context_tokens=tokens, batch=batch,
                                   tp=tp))
    r = _run(s.kv_cache, req)
    if as_json:
        _print_json(r)
        return
    t = Table(title=f"KV cache of {r.model} ({r.kv_dtype})", show_header=False)
    t.add_row("bytes per token (all layers)", f"{r.bytes_per_token:,.0f}")
    t.add_row(f"one request at {r.context_tokens:,} tokens", _gb(r.bytes_per_request))
    t.add_row(f"batch of {r.batch}", _gb(r.bytes_batch))
    t.add_row(f"batch on one GPU at tp={r.tp}", _gb(r.bytes_per_gpu_batch))
    t.add_row("formula", r.formula.latex)
    out.print(t)


@app.command()
def estimate(
    model: Annotated[str, typer.Argument(help="model id, or a path to a Hugging Face config.json")],
    gpu: Annotated[str, typer.Argument(help="GPU id (pdplan gpus)")],
    tp: int = 1,
    pp: int = 1,
    isl: Annotated[int, typer.Option(help="prompt tokens")] = 1024,
    osl: Annotated[int, typer.Option(help="output tokens")] = 256,
    batch: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    prefix_hit: Annotated[float, typer.Option(help="fraction of the prompt in the prefix cache")] = 0.0,
    calibration: Annotated[Path | None, typer.Option(help="calibration YAML from pdplan validate")] = None,
    rows: Annotated[bool, typer.Option(help="show the operator rows")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Prefill (TTFT), decode step (TPOT), KV size and memory fit of one configuration."""
    eff = None
    if calibration is not None:
        from .calibration import load_calibration

        eff = _run(load_calibration, calibration)
    req = _run(lambda: s.EstimateRequest(model=_model_ref(model), gpu=gpu, tp=tp, pp=pp, isl=isl, osl=osl, batch=batch,
                                         weight_dtype=weight_dtype, kv_dtype=kv_dtype, prefix_hit=prefix_hit,
                                         calibration=eff, rows=rows))
    r = _run(s.run_estimate, req)
    if as_json:
        _print_json(r)
        return
    e = r.estimate
    head = (f"{e.model} on {e.num_gpus} x {e.gpu} (tp={e.tp}, pp={e.pp}), isl={e.isl} osl={e.osl} batch={e.batch}, "
            f"{e.weight_dtype} weights, {e.kv_dtype} KV")
    t = Table(title=head, show_header=False)
    if not e.fits:
        t.add_row("fits", f"[red]no[/]: {escape(e.reason or '')}")
    else:
        t.add_row("TTFT (prefill)", f"{_ms(e.ttft_s)}  ({e.prefill_bound}-bound)")
        t.add_row("TPOT (decode step)", f"{_ms(e.tpot_s)}  ({e.decode_bound}-bound)")
        t.add_row("E2E = TTFT + (osl-1) TPOT", f"{e.e2e_s:,.3f} s")
        t.add_row("output tokens/s", f"{e.output_tokens_per_s:,.0f}")
    t.add_row("weights per GPU", _gb(e.weights_bytes_per_gpu))
    t.add_row("KV of the batch", _gb(e.kv_cache_bytes))
    t.add_row("max batch that fits", f"{e.max_batch:,}")
    out.print(t)
    if rows and e.rows:
        ops = Table(title="operator groups (they add up to the phase times)")
        for col in ("phase", "group", "GFLOP", "MB", "FLOP/B", "bound", "time", "formula"):
            ops.add_column(col, justify="left" if col in ("phase", "group", "bound", "formula") else "right")
        for row in e.rows:
            ai = "—" if row.arithmetic_intensity is None else f"{row.arithmetic_intensity:,.1f}"
            ops.add_row(row.phase, row.group, f"{row.flops / 1e9:,.2f}", f"{row.bytes / 1e6:,.1f}", ai, row.bound,
                        _ms(row.time_s), row.formula)
        out.print(ops)


@app.command()
def plan(
    model: Annotated[str, typer.Argument(help="model id, or a path to a Hugging Face config.json")],
    rate: Annotated[float, typer.Option(help="requests per second (Poisson)")],
    ttft: Annotated[str, typer.Option(help="TTFT target, e.g. 2s or 500ms")],
    tpot: Annotated[str, typer.Option(help="TPOT target, e.g. 50ms")],
    isl: Annotated[int, typer.Option(help="mean prompt tokens")] = 1024,
    osl: Annotated[int, typer.Option(help="mean output tokens")] = 256,
    isl_cv: Annotated[float, typer.Option(help="coefficient of variation of the prompt length")] = 0.0,
    osl_cv: Annotated[float, typer.Option(help="coefficient of variation of the output length")] = 0.0,
    percentile: Annotated[float, typer.Option(help="SLO percentile")] = 90.0,
    gpu: Annotated[list[str] | None, typer.Option(help="candidate GPU (repeat); default: all")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="mixed, chunked, disaggregated (repeat)")] = None,
    objective: Annotated[str, typer.Option(help="gpus, cost or cost_per_token")] = "gpus",
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    prefix_hit: float = 0.0,
    whole_nodes: Annotated[bool, typer.Option(help="bill whole 8-GPU nodes")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The deployment (mode, GPU, tp, instances) that meets the SLO at the rate, and why."""
    slo = {"ttft_s": _run(parse_duration, ttft, "ttft"), "tpot_s": _run(parse_duration, tpot, "tpot"),
           "percentile": percentile}
    workload = {"rate": rate, "isl": [isl, isl_cv] if isl_cv else isl, "osl": [osl, osl_cv] if osl_cv else osl,
                "prefix_hit": prefix_hit}
    req = _run(lambda: s.PlanRequest.model_validate({
        "model": _model_ref(model), "workload": workload, "slo": slo, "gpus": gpu or None, "modes": mode or None,
        "objective": objective, "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "whole_nodes": whole_nodes}))
    r = _run(s.run_plan, req)
    if as_json:
        _print_json(r)
        return
    out.print(escape(r.explanation), highlight=False)
    if not r.plan.feasible:
        if r.plan.nearest_feasible_slo is not None:
            n = r.plan.nearest_feasible_slo
            out.print(f"Nearest feasible SLO: TTFT {n.ttft_s:g} s, TPOT {n.tpot_s * 1e3:g} ms at p{n.percentile:g}")
        raise typer.Exit(1)
    t = Table(title=f"candidates (ranked by {r.plan.objective})")
    for col in ("mode", "deployment", "GPUs", "$/h", f"TTFT p{percentile:g}", f"TPOT p{percentile:g}", "util",
                "binds"):
        t.add_column(col, justify="right" if col in ("GPUs", "$/h", "util") or col.startswith("T") else "left")
    for c in r.plan.candidates[:12]:
        pools = " + ".join(f"{p.instances}x {p.gpu} tp{p.tp}" for p in c.deployment.pools)
        if c.mode == "chunked":
            pools += f" (chunk {c.deployment.chunk_tokens})"
        t.add_row(c.mode, pools, str(c.num_gpus), f"{c.cost_per_hour:,.2f}", f"{c.ttft_p_s:.3f} s",
                  _ms(c.tpot_p_s), f"{c.utilisation:.2f}", c.binding)
    out.print(t)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
) -> None:
    """Serve the REST API (OpenAPI docs at /docs) with uvicorn."""
    import uvicorn

    if not 1 <= port <= 65535:
        _fail(f"port: must be in 1 ... 65535, got {port}")
    if workers < 1:
        _fail(f"workers: must be >= 1, got {workers}")
    uvicorn.run("api:app", host=host, port=port, workers=workers)


@app.command()
def validate(
    quick: Annotated[bool, typer.Option(help="reduced grid (under a minute on a 2-core CPU)")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda (auto: cuda when torch sees one)")] = "auto",
    out_dir: Annotated[Path | None, typer.Option("--out", help="write report.md, points.json, plot.png, "
                                                              "calibration.yaml and hardware.yaml here")] = None,
    seed: int = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run the torch microbenchmark: measure a real transformer, calibrate, report held-out error."""
    from . import microbench
    from .microbench.cli import summary

    if device not in ("auto", "cpu", "cuda"):
        _fail(f"device: choose auto, cpu or cuda, got {device!r}")
    try:
        report = microbench.run(quick=quick, device=device, out_dir=out_dir, seed=seed)
    except microbench.TorchMissingError as e:
        _fail(str(e))
    except (RuntimeError, ValueError) as e:
        _fail(str(e))
    if as_json:
        _print_json(report)
        return
    out.print(escape(summary(report)), highlight=False)
    if out_dir is not None:
        out.print(f"wrote {out_dir}/report.md, points.json, plot.png, calibration.yaml, hardware.yaml")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
