"""Load and validate the YAML hardware database, plus a user's own file of additions and overrides.

The user's file is found from the ``path`` argument, else the ``PDPLAN_HARDWARE_DB`` environment
variable. Its entries replace bundled ones with the same id and add new ones.

An id is looked up as given, then in any case, then among the entries' ``aliases`` (any case), then
as a prefix that ends where a component of one entry's id or alias ends (``h200`` → ``h200-sxm``).
A name that two entries share, as an alias or as such a prefix, is ambiguous: the error lists them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import AmbiguousIdError, HardwareDBError, InputError, UnknownIdError
from .schema import EngineFile, EngineProfile, GPUFile, GPUSpec, ModelFile, ModelSpec, UserFile

DATA_DIR = Path(__file__).parent / "data"
GPU_FILE = DATA_DIR / "gpus.yaml"
MODEL_FILE = DATA_DIR / "models.yaml"
ENGINE_FILE = DATA_DIR / "engines.yaml"
ENV_VAR = "PDPLAN_HARDWARE_DB"
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's C parser when built: ~10x faster


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise HardwareDBError(f"{path}: cannot read ({e.strerror})") from None
    try:
        return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader, C or Python
    except yaml.YAMLError as e:
        raise HardwareDBError(f"{path}: not valid YAML: {e}") from None


def _validate(path: Path, raw: Any, schema: type[BaseModel]) -> Any:
    if not isinstance(raw, dict):
        raise HardwareDBError(f"{path}: expected a mapping with 'schema_version' at the top")
    try:
        return schema.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        loc = list(first["loc"])
        where = _describe_location(raw, loc)
        raise HardwareDBError(f"{path}: {where}: {first['msg']}") from None


def _describe_location(raw: Any, loc: list[Any]) -> str:
    """'gpus[3] (id h20) field peak_tflops.bf16' from a pydantic error location."""
    if len(loc) >= 2 and isinstance(loc[1], int) and isinstance(raw.get(loc[0]), list):
        section, index = loc[0], loc[1]
        items = raw[section]
        entry_id = items[index].get("id", "?") if index < len(items) and isinstance(items[index], dict) else "?"
        rest = ".".join(str(x) for x in loc[2:]) or "(entry)"
        return f"{section}[{index}] (id {entry_id!r}) field {rest}"
    return "field " + ".".join(str(x) for x in loc)


Spec = TypeVar("Spec", GPUSpec, ModelSpec)
PREFIX_MIN_CHARS = 3
"""A shorter prefix ('h', 'l4') is never completed: it would match by accident."""
_BOUNDARY = "-_./"
"""A prefix completes an id or alias only where a component ends: 'h200' finds 'h200-sxm', 'llama-3.1-70' is not
'llama-3.1-70b'."""


@dataclass(frozen=True)
class _Table(Generic[Spec]):
    """Entries by id, and every id and alias folded to lower case with the ids it names (two for an
    ambiguous alias)."""

    by_id: dict[str, Spec]
    names: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, entries: dict[str, Spec], section: str, where: Path, checked: set[str] | None = None) -> _Table[Spec]:
        """The table; ``HardwareDBError`` (naming ``where``) for an alias of a ``checked`` entry (default: all)
        given twice or equal to an id. An unchecked entry's alias that a user's id now takes is dropped."""
        names: dict[str, tuple[str, ...]] = {i: (i,) for i in entries}
        for entry in entries.values():
            strict = checked is None or entry.id in checked
            seen: set[str] = set()
            for alias in entry.aliases:
                key = alias.lower()
                if key in entries and not strict:
                    continue
                if key in entries or key in seen:
                    why = "is given twice" if key in seen else (
                        f"is the id of {'this' if key == entry.id else 'another'} entry (ids match in any case already)")
                    raise HardwareDBError(f"{where}: {section} (id {entry.id!r}) field aliases: {alias!r} {why}")
                seen.add(key)
                names[key] = (*names.get(key, ()), entry.id)
        return cls(entries, names)

    def find(self, kind: str, wanted: str) -> Spec:
        """The entry ``wanted`` names: its id, the id in any case, an alias (any case), or a prefix that
        ends a component of exactly one entry's id or alias. ``UnknownIdError`` (naming the closest
        ids) when none does, ``AmbiguousIdError`` (naming each candidate) when several do."""
        if wanted in self.by_id:
            return self.by_id[wanted]
        key = wanted.lower()
        ids = self.names.get(key)
        if ids is None and len(key) >= PREFIX_MIN_CHARS:
            found = {i for name, named in self.names.items()
                     if name.startswith(key) and name[len(key)] in _BOUNDARY for i in named}
            ids = tuple(sorted(found)) or None
        if ids is None:
            raise UnknownIdError(kind, wanted, sorted(self.by_id))
        if len(ids) > 1:
            raise AmbiguousIdError(kind, wanted, sorted(ids))
        return self.by_id[ids[0]]


@dataclass(frozen=True)
class _Database:
    gpus: _Table[GPUSpec]
    models: _Table[ModelSpec]

    @classmethod
    def of(cls, gpus: dict[str, GPUSpec], models: dict[str, ModelSpec], gpu_file: Path, model_file: Path,
           checked: UserFile | None = None) -> _Database:
        """Both tables; with ``checked`` (a user's file over the bundled data) only its entries' aliases are checked."""
        return cls(_Table.of(gpus, "gpus", gpu_file, None if checked is None else {g.id for g in checked.gpus}),
                   _Table.of(models, "models", model_file, None if checked is None else {m.id for m in checked.models}))


@lru_cache(maxsize=8)
def _bundled() -> _Database:
    gpus: GPUFile = _validate(GPU_FILE, _read(GPU_FILE), GPUFile)
    models: ModelFile = _validate(MODEL_FILE, _read(MODEL_FILE), ModelFile)
    return _Database.of({g.id: g for g in gpus.gpus}, {m.id: m for m in models.models}, GPU_FILE, MODEL_FILE)


@lru_cache(maxsize=8)
def _with_user(path: str, mtime: float) -> _Database:
    """The bundled database with the user's file over it; an alias rule the two break together is the
    user file's error."""
    p = Path(path)
    extra: UserFile = _validate(p, _read(p), UserFile)
    base = _bundled()
    return _Database.of({**base.gpus.by_id, **{g.id: g for g in extra.gpus}},
                        {**base.models.by_id, **{m.id: m for m in extra.models}}, p, p, checked=extra)


def _user_path(path: str | os.PathLike[str] | None) -> Path | None:
    chosen = path if path is not None else os.environ.get(ENV_VAR) or None
    if chosen is None:
        return None
    p = Path(chosen)
    if not p.is_file():
        source = "path argument" if path is not None else f"${ENV_VAR}"
        raise HardwareDBError(f"{p}: user hardware file (from {source}) does not exist")
    return p


def _database(path: str | os.PathLike[str] | None) -> _Database:
    user = _user_path(path)
    if user is None:
        return _bundled()
    return _with_user(str(user.resolve()), user.stat().st_mtime)


def database(path: str | os.PathLike[str] | None = None) -> tuple[dict[str, GPUSpec], dict[str, ModelSpec]]:
    """All GPUs and models by id: the bundled ones, overridden or extended by the user's file."""
    db = _database(path)
    return db.gpus.by_id, db.models.by_id


def load_gpu(gpu_id: str, path: str | os.PathLike[str] | None = None) -> GPUSpec:
    """The GPU this id names (see ``_Table.find``: an alias such as ``H200`` or a component prefix such
    as ``h200`` finds ``h200-sxm``); ``UnknownIdError`` naming the closest ids if there is none."""
    if not isinstance(gpu_id, str):
        raise InputError("gpu", f"a GPU id is a string (see list_gpus()), got {type(gpu_id).__name__}")
    return _database(path).gpus.find("GPU", gpu_id)


def load_model(model_id: str, path: str | os.PathLike[str] | None = None) -> ModelSpec:
    """The model this id names (see ``_Table.find``: a Hugging Face repo id such as
    ``meta-llama/Llama-3.1-70B-Instruct`` finds ``llama-3.1-70b``); ``UnknownIdError`` naming the
    closest ids if there is none."""
    if not isinstance(model_id, str):
        raise InputError("model", f"a model id is a string (see list_models()), got {type(model_id).__name__}")
    return _database(path).models.find("model", model_id)


def list_gpus(path: str | os.PathLike[str] | None = None) -> list[str]:
    return sorted(database(path)[0])


def list_models(path: str | os.PathLike[str] | None = None) -> list[str]:
    return sorted(database(path)[1])


def validate_file(path: str | os.PathLike[str]) -> UserFile:
    """Validate a user hardware file without installing it (for tools and tests): its schema, and its
    aliases against its own entries."""
    p = Path(path)
    user: UserFile = _validate(p, _read(p), UserFile)
    _Database.of({g.id: g for g in user.gpus}, {m.id: m for m in user.models}, p, p)
    return user


@lru_cache(maxsize=1)
def _engines() -> dict[str, EngineProfile]:
    engines: EngineFile = _validate(ENGINE_FILE, _read(ENGINE_FILE), EngineFile)
    return {e.id: e for e in engines.engines}


def load_engine(engine_id: str) -> EngineProfile:
    """The bundled engine profile with this id (``generic``: the GPU entries' own efficiencies);
    ``UnknownIdError`` on ``engine`` naming the closest ids if there is none."""
    if not isinstance(engine_id, str):
        raise InputError("engine", f"an engine profile id is a string (see list_engines()), got "
                                   f"{type(engine_id).__name__}")
    engines = _engines()
    if engine_id not in engines:
        raise UnknownIdError("engine profile", engine_id, sorted(engines), field="engine")
    return engines[engine_id]


def list_engines() -> list[str]:
    return sorted(_engines())
