"""Fleet planning: many plans at once (``plan_many``, ``pdplan batch``).

A scenario is a plan request (``service.PlanRequest``: model, workload, SLO, GPU types, ...) with an
``id``. Scenarios come from a YAML/JSON list, a ``{defaults, scenarios}`` mapping whose scenarios are
merged over the defaults, or a CSV whose dotted column names are the request's fields
(``workload.rate``, ``slo.tpot_s``; list fields such as ``gpus`` separated by ``;``).

Each scenario gives one flat ``BatchRow``: the best deployment and its figures, ``infeasible`` with
the planner's reason, or ``error`` with the failing field and why. A scenario's error is its row's,
never the batch's. Plans run in a process pool by default (one worker per core), or as tasks on a
Ray cluster (``ray_address``; the ``ray`` extra). A plan is a pure function of its request, so both
give the same rows, bit for bit.

With an output file the run is resumable: each row is appended and flushed as its plan finishes,
and a rerun keeps the rows whose scenario is unchanged (same ``id`` and same request hash), plans the
rest, and finally rewrites the file in the scenarios' order. A run killed at any point loses at most
the plans in flight; a half-written last line is dropped, not read.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InputError
from .files import read_text_file, yaml_document

MAX_SCENARIO_FILE_BYTES = 50_000_000
MAX_SCENARIOS = 100_000
"""Scenarios in one batch: a bound on one run's work (split larger fleets into several files)."""
MAX_ID_CHARS = 200
LIST_SEPARATOR = ";"
"""Separates the items of a list field (``gpus``, ``modes``, ``tps`` ...) in a CSV cell."""
TEXT_LISTS = frozenset({"gpus", "modes"})
"""List fields whose items stay text in a CSV cell (GPU ids, mode names); the others are numbers."""
OUTPUT_SUFFIXES = (".csv", ".parquet")
IN_FLIGHT_PER_WORKER = 4
"""Plans submitted ahead per worker: enough to keep every worker busy, few enough that a killed run
loses little and memory stays flat."""

Status = Literal["feasible", "infeasible", "error"]


class BatchRow(BaseModel):
    """One scenario's answer, flat (one CSV/Parquet row). Times in seconds, rates in requests/s."""

    model_config = ConfigDict(frozen=True)

    id: str
    scenario_hash: str = Field(description="sha256 (first 16 hex digits) of the validated request: a resumed run "
                                           "re-plans a scenario whose request changed")
    status: Status
    model: str | None = None
    rate_rps: float | None = None
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    percentile: float | None = None
    mode: str | None = None
    gpu: str | None = Field(default=None, description="GPU type of the best deployment (pools joined by '+')")
    layout: str | None = Field(default=None, description="the best deployment: mode, instances x GPU and layout "
                                                         "per pool")
    num_gpus: int | None = None
    nodes: int | None = None
    cost_per_hour: float | None = None
    cost_per_million_tokens: float | None = None
    ttft_p_s: float | None = Field(default=None, description="TTFT at the SLO's percentile")
    tpot_p_s: float | None = Field(default=None, description="TPOT at the SLO's percentile")
    capacity_rps: float | None = None
    utilisation: float | None = None
    binding: str | None = None
    output_tokens_per_s_per_gpu: float | None = None
    searched: int | None = Field(default=None, description="configurations the planner evaluated")
    message: str | None = Field(default=None, description="infeasible: the planner's reason; error: the field "
                                                          "and why")


COLUMNS: tuple[str, ...] = tuple(BatchRow.model_fields)


# ---------------------------------------------------------------------------------------- reading

def _list_fields() -> frozenset[str]:
    from .service import PlanRequest

    return frozenset(name for name, f in PlanRequest.model_fields.items() if "list[" in str(f.annotation))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _number(text: str) -> Any:
    """A CSV cell as the number it spells (an int where it is whole), else the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _dotted(row: dict[str, str], lists: frozenset[str], where: str) -> dict[str, Any]:
    """A CSV row (``workload.rate`` -> ``{"workload": {"rate": ...}}``); empty cells are left out, so
    the request's defaults apply; list fields split on ``;``."""
    out: dict[str, Any] = {}
    for key, cell in row.items():
        if key is None:
            raise InputError("scenarios", f"{where}: more cells than the header has columns")
        if cell is None or not cell.strip():
            continue
        parts = key.strip().split(".")
        if not all(parts):
            raise InputError("scenarios", f"{where}: column {key!r} is not a field name")
        value: Any = cell.strip()
        if len(parts) == 1 and parts[0] in lists:
            items = [x.strip() for x in value.split(LIST_SEPARATOR) if x.strip()]
            value = items if parts[0] in TEXT_LISTS else [_number(x) for x in items]
        elif parts not in (["model"], ["id"]):  # names stay text: id '007' is not id '7'
            value = _number(value)
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise InputError("scenarios", f"{where}: column {key!r} conflicts with column {p!r}")
            node = nxt
        if isinstance(node.get(parts[-1]), dict):
            raise InputError("scenarios", f"{where}: column {key!r} conflicts with its sub-columns")
        node[parts[-1]] = value
    return out


def read_scenarios(path: str | os.PathLike[str]) -> list[tuple[str, dict[str, Any]]]:
    """``(id, raw request)`` per scenario of a YAML/JSON or CSV file, in file order. A missing id is
    the scenario's 1-based position; ids must be unique. Request fields are validated per scenario
    when it runs (a bad one is that scenario's error row), the file's shape here."""
    p = Path(path)
    text = read_text_file(p, "scenarios", MAX_SCENARIO_FILE_BYTES)
    if p.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames:
            raise InputError("scenarios", f"{p}: an empty CSV (it needs a header row)")
        lists = _list_fields()
        raw = [_dotted(r, lists, f"{p}: line {reader.line_num}") for r in reader]
        where = [f"{p}: data row {i}" for i in range(1, len(raw) + 1)]
    else:
        doc = yaml_document(text, str(p), "scenarios", "YAML, JSON or CSV")
        defaults: dict[str, Any] = {}
        if isinstance(doc, dict):
            unknown = set(doc) - {"defaults", "scenarios"}
            if unknown:
                raise InputError("scenarios", f"{p}: a mapping takes 'defaults' and 'scenarios', not "
                                              f"{', '.join(sorted(map(str, unknown)))}")
            defaults = doc.get("defaults") or {}
            doc = doc.get("scenarios")
            if not isinstance(defaults, dict):
                raise InputError("scenarios", f"{p}: 'defaults' must be a mapping of request fields")
        if not isinstance(doc, list):
            raise InputError("scenarios", f"{p}: expected a list of scenarios (or a mapping with 'scenarios')")
        raw = []
        for i, s in enumerate(doc, start=1):
            if not isinstance(s, dict):
                raise InputError("scenarios", f"{p}: scenario {i} is not a mapping of request fields")
            raw.append(_merge(defaults, s))
        where = [f"{p}: scenario {i}" for i in range(1, len(raw) + 1)]
    return _with_ids(raw, where)


def _with_ids(raw: list[dict[str, Any]], where: list[str]) -> list[tuple[str, dict[str, Any]]]:
    if not raw:
        raise InputError("scenarios", "no scenarios")
    if len(raw) > MAX_SCENARIOS:
        raise InputError("scenarios", f"{len(raw):,} scenarios, more than the {MAX_SCENARIOS:,} of one batch")
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, str] = {}
    for i, (r, w) in enumerate(zip(raw, where, strict=True), start=1):
        r = dict(r)
        sid = r.pop("id", None)
        sid = str(i) if sid is None or (isinstance(sid, str) and not sid.strip()) else str(sid).strip()
        if len(sid) > MAX_ID_CHARS or any(c in sid for c in "\r\n"):
            raise InputError("id", f"{w}: an id is one line of at most {MAX_ID_CHARS} characters")
        if sid in seen:
            raise InputError("id", f"{w}: id {sid!r} is also {seen[sid]}'s; ids must be unique")
        seen[sid] = w
        out.append((sid, r))
    return out


# ---------------------------------------------------------------------------------------- one plan

def scenario_hash(raw: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _validation_message(e: ValidationError) -> str:
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    return f"{loc}: {first['msg']}" if loc else first["msg"]


def run_scenario(sid: str, raw: dict[str, Any]) -> BatchRow:
    """One scenario's row. Never raises for the scenario's content: a bad field or a failing plan is
    the row's ``error``."""
    from .optimizer import describe_deployment
    from .service import PlanRequest, run_plan

    digest = scenario_hash(raw)
    try:
        if "emit" in raw:
            raise InputError("emit", "launch commands are not written by a batch; run pdplan plan --emit on the "
                                     "scenario you choose")
        req = PlanRequest.model_validate(raw)
        digest = scenario_hash(req.model_dump(mode="json"))
        p = run_plan(req).plan
    except ValidationError as e:
        return BatchRow(id=sid, scenario_hash=digest, status="error", message=_validation_message(e))
    except InputError as e:
        return BatchRow(id=sid, scenario_hash=digest, status="error",
                        message=f"{e.field}: {e.reason}" if e.field else str(e.reason))
    except Exception as e:  # noqa: BLE001 - one scenario's failure is recorded, the batch goes on
        return BatchRow(id=sid, scenario_hash=digest, status="error", message=f"{type(e).__name__}: {e}")
    head = {"id": sid, "scenario_hash": digest, "model": p.model, "rate_rps": p.workload.rate,
            "ttft_slo_s": p.slo.ttft_s, "tpot_slo_s": p.slo.tpot_s, "percentile": p.slo.percentile,
            "searched": p.searched}
    b = p.best
    if not p.feasible or b is None:
        return BatchRow(status="infeasible", message=p.reason, **head)
    return BatchRow(
        status="feasible", mode=b.mode, gpu="+".join(dict.fromkeys(x.gpu for x in b.deployment.pools)),
        layout=describe_deployment(b.deployment, instances=True), num_gpus=b.num_gpus, nodes=b.nodes, cost_per_hour=b.cost_per_hour,
        cost_per_million_tokens=b.cost_per_million_tokens, ttft_p_s=b.ttft_p_s, tpot_p_s=b.tpot_p_s,
        capacity_rps=b.capacity_rps, utilisation=b.utilisation, binding=b.binding,
        output_tokens_per_s_per_gpu=b.output_tokens_per_s_per_gpu, **head)


def _run_chunk(chunk: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A worker's task: rows as plain dicts (cheap to send back)."""
    return [run_scenario(sid, raw).model_dump() for sid, raw in chunk]


# ---------------------------------------------------------------------------------------- output

def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)  # shortest text that reads back to the same float
    return str(v)


def _row_from_cells(cells: dict[str, str]) -> BatchRow:
    return BatchRow.model_validate({k: (v if v != "" else None) for k, v in cells.items() if k in COLUMNS})


class _Journal:
    """The output's rows so far: a CSV appended to and flushed one row at a time (the output itself
    for ``.csv``; ``OUT.partial.csv`` beside a ``.parquet``)."""

    def __init__(self, out: Path, resume: bool) -> None:
        self.out = out
        self.path = out if out.suffix.lower() == ".csv" else out.with_name(out.name + ".partial.csv")
        self.done: dict[str, BatchRow] = {}
        if resume:
            self.done.update(_read_rows(self.out) if self.out.exists() and self.out != self.path else {})
            self.done.update(_read_rows(self.path) if self.path.exists() else {})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_rows(self.done.values(), self.path)  # the rows kept, without a half-written line
            self.fh = open(self.path, "a", encoding="utf-8", newline="")  # noqa: SIM115 - closed in close()
        except OSError as e:
            raise InputError("out", f"{self.path}: cannot write ({e.strerror or e})") from None
        self.writer = csv.writer(self.fh, lineterminator="\n")

    def add(self, row: BatchRow) -> None:
        self.writer.writerow([_cell(v) for v in row.model_dump().values()])
        self.fh.flush()
        self.done[row.id] = row

    def close(self) -> None:
        self.fh.close()


def _read_rows(path: Path) -> dict[str, BatchRow]:
    """Rows of an earlier run's output; a half-written last line (a killed run) is dropped."""
    if path.suffix.lower() == ".parquet":
        pq = _pyarrow("out")
        try:
            records = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
            raise InputError("out", f"{path}: not a pdplan batch output to resume ({e}); pass --no-resume") from None
        cells = [{k: _cell(v) for k, v in r.items()} for r in records]
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError("out", f"{path}: cannot read it to resume ({e}); pass --no-resume") from None
        if text and not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None:
            return {}
        if tuple(reader.fieldnames) != COLUMNS:
            raise InputError("out", f"{path}: its columns are not a pdplan batch output's; pass --no-resume or "
                                    "another --out")
        cells = list(reader)
    rows: dict[str, BatchRow] = {}
    for c in cells:
        try:
            row = _row_from_cells(c)
        except ValidationError:
            continue  # a damaged row is planned again
        rows[row.id] = row
    return rows


def _pyarrow(field: str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(field, "Parquet output needs pyarrow: pip install 'pdplan[fleet]' (or write .csv)") from None
    return pq


def write_rows(rows: Iterable[BatchRow], out: Path) -> None:
    """The final output, replaced atomically (a temporary file renamed over it)."""
    tmp = out.with_name(out.name + ".tmp")
    rows = list(rows)
    if out.suffix.lower() == ".parquet":
        import pyarrow as pa

        pq = _pyarrow("out")
        schema = pa.schema([(name, _arrow_type(pa, name)) for name in COLUMNS])
        table = pa.Table.from_pylist([r.model_dump() for r in rows], schema=schema)
        pq.write_table(table, tmp)
    else:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(COLUMNS)
            w.writerows([_cell(v) for v in r.model_dump().values()] for r in rows)
    os.replace(tmp, out)


def _arrow_type(pa: Any, name: str) -> Any:
    ann = str(BatchRow.model_fields[name].annotation)
    return pa.int64() if "int" in ann else pa.float64() if "float" in ann else pa.string()


# ---------------------------------------------------------------------------------------- running

Progress = Callable[[int, int], None]
"""Called with (rows done, scenarios in all) as each plan finishes."""


def _chunks(todo: list[tuple[str, dict[str, Any]]], size: int) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    for i in range(0, len(todo), size):
        yield todo[i:i + size]


def _process_pool(todo: list[tuple[str, dict[str, Any]]], workers: int, chunk: int) -> Iterator[list[dict[str, Any]]]:
    import multiprocessing

    # spawn: a fresh interpreter per worker, safe whatever threads the caller runs
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: set[Any] = set()
        chunks = _chunks(todo, chunk)
        for c in chunks:
            pending.add(pool.submit(_run_chunk, c))
            if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                break
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                yield f.result()
                nxt = next(chunks, None)
                if nxt is not None:
                    pending.add(pool.submit(_run_chunk, nxt))


def _ray(todo: list[tuple[str, dict[str, Any]]], address: str, chunk: int) -> Iterator[list[dict[str, Any]]]:
    ray = _ray_module()
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise InputError("ray", f"cannot join the Ray cluster at {address!r}: {e}") from None
        started = True
    try:
        task = ray.remote(_run_chunk)
        width = max(1, int(ray.cluster_resources().get("CPU", 1)))
        chunks = _chunks(todo, chunk)
        pending = [task.remote(c) for c in _take(chunks, width * IN_FLIGHT_PER_WORKER)]
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                yield ray.get(ref)
                pending.extend(task.remote(c) for c in _take(chunks, 1))
    finally:
        if started:
            ray.shutdown()


RAY_CONNECT_TIMEOUT_S = 3.0


def _ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("ray", "the ray package is not installed: pip install 'pdplan[fleet]'") from None
    return ray


def _reachable(address: str) -> None:
    """A ``HOST:PORT`` Ray address must accept a TCP connection at once: ``ray.init`` would retry an
    unreachable one for minutes. (``auto``, ``local`` and ``ray://`` addresses are Ray's to resolve.)"""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not host or "://" in address or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise InputError("ray", f"cannot reach a Ray cluster at {address} ({e.strerror or e}); start one with "
                                "'ray start --head' or pass its HOST:PORT, 'auto' or 'local'") from None


def _take(it: Iterator[Any], n: int) -> list[Any]:
    out = []
    for _ in range(n):
        x = next(it, None)
        if x is None:
            break
        out.append(x)
    return out


def plan_many(scenarios: list[tuple[str, dict[str, Any]]] | str | os.PathLike[str], *,
              out: str | os.PathLike[str] | None = None, resume: bool = True, workers: int | None = None,
              ray_address: str | None = None, chunk: int = 4, progress: Progress | None = None) -> list[BatchRow]:
    """One ``BatchRow`` per scenario, in the scenarios' order.

    ``scenarios``: a file (``read_scenarios``) or ``(id, request mapping)`` pairs. ``workers``: processes
    (default one per core; 1 plans in this process). ``ray_address``: run the plans as tasks on that
    Ray cluster instead (``"auto"``, ``"HOST:PORT"`` or ``"local"`` to start one here). ``out``: a
    ``.csv`` or ``.parquet`` written as rows finish and resumed from (``resume``). ``chunk``: scenarios
    per task."""
    items = read_scenarios(scenarios) if isinstance(scenarios, (str, os.PathLike)) else \
        _with_ids([dict(r, id=sid) for sid, r in scenarios], [f"scenario {sid!r}" for sid, _ in scenarios])
    if workers is not None and not 1 <= workers <= 1024:
        raise InputError("workers", f"{workers} workers; use 1 to 1024")
    if not 1 <= chunk <= 1000:
        raise InputError("chunk", f"{chunk} scenarios per task; use 1 to 1000")
    out_path = Path(out) if out is not None else None
    if out_path is not None and out_path.suffix.lower() not in OUTPUT_SUFFIXES:
        raise InputError("out", f"{out_path}: write .csv or .parquet")
    if out_path is not None and out_path.suffix.lower() == ".parquet":
        _pyarrow("out")
    if ray_address is not None:  # before any output is written: no half-started run for a bad address
        _ray_module()
        _reachable(ray_address)
    journal = _Journal(out_path, resume) if out_path is not None else None
    try:
        done = journal.done if journal is not None else {}
        order = {sid: i for i, (sid, _) in enumerate(items)}
        stale = [sid for sid in done if sid not in order]
        if stale:
            raise InputError("out", f"{out_path} holds results for ids not among the scenarios (e.g. {stale[0]!r}); "
                                    "pass --no-resume or another --out")
        todo = [(sid, raw) for sid, raw in items
                if sid not in done or done[sid].scenario_hash not in _hashes(raw)]
        rows: dict[str, BatchRow] = {sid: r for sid, r in done.items()}
        count = len(items) - len(todo)
        if progress:
            progress(count, len(items))
        if ray_address is not None:
            results: Iterable[list[dict[str, Any]]] = _ray(todo, ray_address, chunk)
        elif (workers or os.cpu_count() or 1) == 1 or len(todo) <= chunk:
            results = (_run_chunk([t]) for t in todo)
        else:
            results = _process_pool(todo, min(workers or os.cpu_count() or 1, -(-len(todo) // chunk)), chunk)
        for batch in results:
            for d in batch:
                row = BatchRow.model_validate(d)
                rows[row.id] = row
                if journal is not None:
                    journal.add(row)
                count += 1
                if progress:
                    progress(count, len(items))
    finally:
        if journal is not None:
            journal.close()
    ordered = sorted(rows.values(), key=lambda r: order[r.id])
    if out_path is not None:
        write_rows(ordered, out_path)
        if journal is not None and journal.path != out_path:
            journal.path.unlink(missing_ok=True)
    return ordered


def _hashes(raw: dict[str, Any]) -> set[str]:
    """The hashes a scenario's row may carry: of the validated request, or of the raw mapping when it
    did not validate."""
    from .service import PlanRequest

    out = {scenario_hash(raw)}
    try:
        out.add(scenario_hash(PlanRequest.model_validate(raw).model_dump(mode="json")))
    except (ValidationError, InputError, ValueError):
        pass
    return out
