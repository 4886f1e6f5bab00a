"""``pdplan``: the command line. Each command builds a ``calculator.service`` request from its
options, calls the same function the REST API calls, and prints a rich table or, with ``--json``,
the response model as JSON.

Every failure is one line on stderr and an exit status from ``EXIT_CODES`` (never a traceback,
unless ``PDPLAN_DEBUG=1``). The service, pydantic and the formulas are imported inside the commands,
so that ``pdplan --help`` starts fast.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

if TYPE_CHECKING:
    from pydantic import BaseModel

# typer >= 0.29 vendors click as typer._click; these are found by name on the public BadParameter
# so that the classes match whichever click typer uses.
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_CLICK_EXCEPTION = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_INPUT = 2
EXIT_HARDWARE_DB = 3
EXIT_OUTPUT = 4
EXIT_MEASUREMENT = 5
EXIT_SERVER = 6
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
EXIT_CODES: tuple[tuple[int, str, str], ...] = (
    (EXIT_OK, "success", "the command did what was asked"),
    (EXIT_INFEASIBLE, "no feasible plan", "`plan`: no deployment meets the SLO (with or without `--json`)"),
    (EXIT_INPUT, "invalid input", ("an option or argument, a file (config.json, calibration YAML), an unknown model "
                                   "or GPU id; `validate` without torch installed")),
    (EXIT_HARDWARE_DB, "hardware database unreadable", ("the GPU/model YAML (`PDPLAN_HARDWARE_DB` or the bundled "
                                                        "files) is missing or invalid")),
    (EXIT_OUTPUT, "output not writable", ("stdout is closed or full, or `validate --out` cannot be created or "
                                          "written (checked before measuring)")),
    (EXIT_MEASUREMENT, "measurement failed", "`validate`: torch raised an error while measuring"),
    (EXIT_SERVER, "server failed", ("`serve`: uvicorn could not start or stopped on an error (its log says why, "
                                    "e.g. the port is in use)")),
    (EXIT_INTERNAL, "internal error", ("a bug: one line `internal error: <type>: <message>`; "
                                       "`PDPLAN_DEBUG=1` prints the traceback")),
    (EXIT_INTERRUPTED, "interrupted", "Ctrl-C"),
    (EXIT_BROKEN_PIPE, "broken pipe", "the reader of stdout went away (`head -1` exited); nothing is printed"),
)
"""Exit status, short meaning (``pdplan --help``), long meaning (docs/reference/cli.md)."""
DEBUG_ENV = "PDPLAN_DEBUG"
PIPE_WIDTH = 160
"""Columns when stdout is not a terminal (a pipe, a file): wide enough that tables are not cut."""


def exit_codes_text() -> str:
    """The exit statuses in one paragraph, the epilog of ``pdplan --help``."""
    return ("Exit status: " + "; ".join(f"{code} {short}" for code, short, _ in EXIT_CODES)
            + f". Errors are one line on stderr ({DEBUG_ENV}=1 adds the traceback).")


def exit_codes_markdown() -> str:
    """The exit statuses as a Markdown table (docs/reference/cli.md)."""
    rows = "\n".join(f"| {code} | {short} | {long} |" for code, short, long in EXIT_CODES)
    return "| status | meaning | when |\n|---:|---|---|\n" + rows


class CliFailure(Exception):
    """A failure the CLI reports with its own exit status (not an input error)."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(message)


class _OutputError(Exception):
    """Writing stdout failed. Not an OSError, so that click's own EPIPE handling does not see it."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        super().__init__(str(error))


class _GuardedStdout:
    """``sys.stdout`` while pdplan runs: a failed write or flush raises ``_OutputError``, and a
    closed stdout (``None`` when fd 1 was closed at start) fails on the first write."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _guard(self, op: Callable[[], Any]) -> Any:
        try:
            return op()
        except UnicodeEncodeError as e:
            raise _OutputError(ValueError(f"stdout cannot encode {e.object[e.start:e.end]!r} "
                                          "(set PYTHONIOENCODING=utf-8)")) from e
        except (OSError, ValueError) as e:  # ValueError: the stream was closed
            raise _OutputError(e) from e

    def write(self, text: str) -> int:
        if self._stream is None:
            raise _OutputError(OSError(errno.EBADF, "stdout is closed"))
        return self._guard(lambda: self._stream.write(text))

    def flush(self) -> None:
        if self._stream is not None:
            self._guard(self._stream.flush)

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _validation_message(e: Any) -> str:
    """``loc: msg`` of a pydantic ValidationError's first error."""
    first = e.errors()[0]
    return f"{'.'.join(map(str, first['loc'])) or 'input'}: {first['msg']}"


def classify(e: BaseException) -> tuple[int, str | None]:
    """The exit status of a failure and the line that explains it (None: print nothing)."""
    if isinstance(e, _OutputError):
        if isinstance(e.error, OSError) and e.error.errno == errno.EPIPE:
            return EXIT_BROKEN_PIPE, None
        reason = e.error.strerror if isinstance(e.error, OSError) and e.error.strerror else str(e.error)
        return EXIT_OUTPUT, f"cannot write the output: {reason}"
    if isinstance(e, SystemExit):
        return (e.code, None) if isinstance(e.code, int) else (0, None) if e.code is None else (1, str(e.code))
    if isinstance(e, typer.Exit):
        return e.exit_code, None
    if isinstance(e, (KeyboardInterrupt, typer.Abort)):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(e, _CLICK_EXCEPTION):
        if not e.format_message():  # no command given: the help was printed instead
            return EXIT_INPUT, None
        hint = ""
        if isinstance(e, _USAGE_ERROR) and e.ctx is not None:
            hint = f" (see {e.ctx.command_path} --help)"
        return EXIT_INPUT, e.format_message() + hint
    if isinstance(e, CliFailure):
        return e.code, str(e)
    # These modules are looked up, not imported: an error of theirs can only come after they loaded.
    hdb = sys.modules.get("hardware_db.errors")
    if hdb is not None and isinstance(e, hdb.HardwareDBError):
        return EXIT_HARDWARE_DB, f"hardware database: {e}"
    pydantic_core = sys.modules.get("pydantic_core")
    if pydantic_core is not None and isinstance(e, pydantic_core.ValidationError):
        return EXIT_INPUT, _validation_message(e)
    if isinstance(e, ValueError):  # InputError, UnknownIdError, the service's own checks
        return EXIT_INPUT, str(e)
    return EXIT_INTERNAL, f"internal error: {type(e).__name__}: {e} (set {DEBUG_ENV}=1 for the traceback)"


def _report(message: str | None, e: BaseException) -> None:
    """Print the one line (and, with PDPLAN_DEBUG=1, the traceback) on stderr; never raises."""
    try:
        if message is None:
            return
        if os.environ.get(DEBUG_ENV):
            import traceback

            traceback.print_exception(e, file=sys.stderr)
        text = _one_line(message)
        head = "" if text.startswith("internal error:") else "error: "
        Console(stderr=True, width=PIPE_WIDTH).print(f"[bold red]{head}[/]{escape(text)}", highlight=False,
                                                     soft_wrap=True)
    except Exception:  # noqa: BLE001, S110 - stderr itself is gone; the exit status still says what happened
        pass


def _silence_stdout(stream: Any) -> None:
    """Point fd 1 at /dev/null after a failed write, so that the interpreter's last flush of the
    data still buffered neither fails nor prints 'Exception ignored'."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except Exception:  # noqa: BLE001, S110 - not a real file (a test runner's buffer): nothing to silence
        pass


def run_guarded(call: Callable[[], Any]) -> int:
    """Run ``call`` with a guarded stdout; its exit status, every failure reported by ``classify``."""
    real = sys.stdout
    sys.stdout = _GuardedStdout(real)  # type: ignore[assignment]
    try:
        rv = call()
        sys.stdout.flush()
        return rv if isinstance(rv, int) else EXIT_OK
    except BaseException as e:  # noqa: BLE001 - every failure becomes one line and an exit status
        code, message = classify(e)
        if isinstance(e, _OutputError):
            _silence_stdout(real)
        _report(message, e)
        return code
    finally:
        sys.stdout = real


class _Group(TyperGroup):
    """The ``pdplan`` group: click runs non-standalone inside ``run_guarded``, so that usage errors,
    exceptions and failed writes all end as one line and an exit status."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        def call() -> Any:
            return super(_Group, self).main(args=args, prog_name=prog_name, complete_var=complete_var,
                                            standalone_mode=False, **extra)

        code = run_guarded(call)
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(cls=_Group, help="pdplan: closed-form capacity planning for LLM serving.",
                  epilog=exit_codes_text(), no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)


class _Out:
    """stdout console resolved at print time, so a pipe gets full-width tables and a terminal its own."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        Console(width=None if sys.stdout.isatty() else PIPE_WIDTH).print(*objects, **kwargs)


out = _Out()

JsonOpt = Annotated[bool, typer.Option("--json", help="print the response as JSON")]
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s|m|min)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "m": 60.0, "min": 60.0}


def parse_duration(text: str, name: str) -> float:
    """Seconds from '2s', '50ms', '200us', '1.5', '1m'; bare numbers are seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{name}: cannot read {text!r} as a duration (e.g. 2s, 50ms, 0.05)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def package_version() -> str:
    """The installed pdplan version, or ``0+unknown`` when it is not installed (run from a checkout)."""
    from importlib import metadata

    try:
        return metadata.version("pdplan")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"pdplan {package_version()}\n")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    pass


def _model_ref(text: str) -> Any:
    """A database id, or a Hugging Face config.json: a path ending in .json, a directory holding
    one, or any other existing path with a separator (read safely: never a FIFO or a device)."""
    p = Path(text)
    if not (text.endswith(".json") or p.is_dir() or (os.sep in text and os.path.lexists(text))):
        return text
    from pydantic import ValidationError

    from .errors import InputError
    from .files import read_text_file
    from .limits import MAX_CONFIG_BYTES
    from .service import HFConfig

    target = p / "config.json" if p.is_dir() else p
    if p.is_dir() and not os.path.lexists(target):
        raise InputError("model", f"{p}: a directory without a config.json")
    try:
        config = json.loads(read_text_file(target, "model", MAX_CONFIG_BYTES))
    except json.JSONDecodeError as e:
        raise InputError("model", f"{target}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise InputError("model", f"{target}: a config.json holds a JSON object, not a {type(config).__name__}")
    try:
        return HFConfig(hf_config=config)
    except ValidationError as e:
        raise InputError("model", f"{target}: {_validation_message(e)}") from None


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
    from . import service as s

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
    from . import service as s

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
    from . import service as s

    r = s.kv_cache(s.KVRequest(model=_model_ref(model), kv_dtype=kv_dtype, context_tokens=tokens, batch=batch,
                               tp=tp))
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
    from . import service as s

    eff = None
    if calibration is not None:
        from .calibration import load_calibration
        from .files import read_text_file
        from .limits import MAX_CONFIG_BYTES

        read_text_file(calibration, "calibration", MAX_CONFIG_BYTES)  # refuses a FIFO, a device, a binary file
        eff = load_calibration(calibration)
    r = s.run_estimate(s.EstimateRequest(model=_model_ref(model), gpu=gpu, tp=tp, pp=pp, isl=isl, osl=osl,
                                         batch=batch, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                         prefix_hit=prefix_hit, calibration=eff, rows=rows))
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


def _length(mean: int, cv: float) -> int | dict[str, float]:
    """A length distribution for the workload: a fixed length, or a mean with a coefficient of variation."""
    return {"mean": mean, "cv": cv} if cv else mean


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
    itl: Annotated[str | None, typer.Option(help="inter-token latency target (every gap), e.g. 200ms")] = None,
    attainment: Annotated[str, typer.Option(help="per_metric, or joint: p% of requests meet TTFT and TPOT "
                                                 "together")] = "per_metric",
    scheduler: Annotated[str, typer.Option(help="mixed mode: hybrid (vLLM V1, SGLang, TensorRT-LLM) or "
                                                "prefill_first (vLLM V0)")] = "hybrid",
    gpu: Annotated[list[str] | None, typer.Option(help="candidate GPU (repeat); default: all")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="mixed, chunked, disaggregated (repeat)")] = None,
    objective: Annotated[str, typer.Option(help="gpus, cost or cost_per_token")] = "gpus",
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    prefix_hit: float = 0.0,
    whole_nodes: Annotated[bool, typer.Option(help="bill whole 8-GPU nodes")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The deployment (mode, GPU, tp, instances) that meets the SLO at the rate, and why (exit 1: none does)."""
    slo = {"ttft_s": parse_duration(ttft, "ttft"), "tpot_s": parse_duration(tpot, "tpot"), "percentile": percentile,
           "attainment": attainment, "itl_s": None if itl is None else parse_duration(itl, "itl")}
    from . import service as s

    workload = {"rate": rate, "isl": _length(isl, isl_cv), "osl": _length(osl, osl_cv), "prefix_hit": prefix_hit}
    r = s.run_plan(s.PlanRequest.model_validate({
        "model": _model_ref(model), "workload": workload, "slo": slo, "gpus": gpu or None, "modes": mode or None,
        "objective": objective, "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "whole_nodes": whole_nodes,
        "scheduler": scheduler}))
    if as_json:
        _print_json(r)
        if not r.plan.feasible:
            raise typer.Exit(EXIT_INFEASIBLE)
        return
    out.print(escape(r.explanation), highlight=False)
    if not r.plan.feasible:
        if r.plan.nearest_feasible_slo is not None:
            n = r.plan.nearest_feasible_slo
            out.print(f"Nearest feasible SLO: TTFT {n.ttft_s:g} s, TPOT {n.tpot_s * 1e3:g} ms at p{n.percentile:g}")
        raise typer.Exit(EXIT_INFEASIBLE)
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
    deadline: Annotated[str, typer.Option(help="wall-clock budget of one plan, evaluate or sweep; "
                                               "past it the work stops and the answer is 504")] = "5s",
) -> None:
    """Serve the REST API (OpenAPI docs at /docs) with uvicorn: connections that send no complete
    request within 10 s and idle keep-alive connections after 5 s are closed."""
    from .errors import InputError

    if not 1 <= port <= 65535:
        raise InputError("port", f"must be in 1 ... 65535, got {port}")
    if workers < 1:
        raise InputError("workers", f"must be >= 1, got {workers}")
    deadline_s = parse_duration(deadline, "deadline")
    if not 0 < deadline_s <= 3600:
        raise InputError("deadline", f"must be in (0 s, 1 h], got {deadline}")
    from api.server import serve as run_server

    try:
        run_server(host=host, port=port, workers=workers, deadline_s=deadline_s)
    except SystemExit as e:  # uvicorn exits 3 when it cannot bind, which would read as our 3
        if e.code not in (None, 0):
            raise CliFailure(EXIT_SERVER, f"serve: uvicorn stopped with status {e.code} (its log above says why)") from None


def prepare_out_dir(path: Path) -> None:
    """Create ``path`` and check that a file can be written in it (``CliFailure``, exit 4, if not),
    so that a bad ``--out`` fails before minutes of measuring rather than after."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except FileExistsError:
        raise CliFailure(EXIT_OUTPUT, f"out: {path} exists and is not a directory") from None
    except NotADirectoryError:
        raise CliFailure(EXIT_OUTPUT, f"out: {path}: a part of the path is a file, not a directory") from None
    except OSError as e:
        raise CliFailure(EXIT_OUTPUT, f"out: {path}: cannot write there ({e.strerror or e})") from None


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
    if device not in ("auto", "cpu", "cuda"):
        from .errors import InputError

        raise InputError("device", f"choose auto, cpu or cuda, got {device!r}")
    if out_dir is not None:
        prepare_out_dir(out_dir)  # before torch is even imported: a bad --out fails at once
    from . import microbench
    from .microbench.cli import summary

    try:
        report = microbench.run(quick=quick, device=device, out_dir=None, seed=seed)
    except microbench.TorchMissingError as e:
        raise CliFailure(EXIT_INPUT, str(e)) from None
    except RuntimeError as e:
        raise CliFailure(EXIT_MEASUREMENT, f"the measurement failed: {e}") from None
    if out_dir is not None:
        from .microbench.report import write_outputs

        try:
            write_outputs(report, out_dir)
        except OSError as e:
            raise CliFailure(EXIT_OUTPUT, f"out: cannot write {e.filename or out_dir} ({e.strerror or e})") from None
    if as_json:
        _print_json(report)
        return
    out.print(escape(summary(report)), highlight=False)
    if out_dir is not None:
        out.print(f"wrote {out_dir}/report.md, points.json, plot.png, calibration.yaml, hardware.yaml")


def main(argv: list[str] | None = None) -> int:
    """The ``pdplan`` console script: the exit status (see ``EXIT_CODES``)."""
    return app(args=argv, prog_name="pdplan", standalone_mode=False)


if __name__ == "__main__":
    sys.exit(main())
