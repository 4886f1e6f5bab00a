"""Load and validate the YAML hardware database, plus a user's own file of additions and overrides.

The user's file is found from the ``path`` argument, else the ``PDPLAN_HARDWARE_DB`` environment
variable. Its entries replace bundled ones with the same id and add new ones.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .errors import HardwareDBError, InputError, UnknownIdError
from .schema import GPUFile, GPUSpec, ModelFile, ModelSpec, UserFile

DATA_DIR = Path(__file__).parent / "data"
GPU_FILE = DATA_DIR / "gpus.yaml"
MODEL_FILE = DATA_DIR / "models.yaml"
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


@lru_cache(maxsize=8)
def _bundled() -> tuple[dict[str, GPUSpec], dict[str, ModelSpec]]:
    gpus: GPUFile = _validate(GPU_FILE, _read(GPU_FILE), GPUFile)
    models: ModelFile = _validate(MODEL_FILE, _read(MODEL_FILE), ModelFile)
    return {g.id: g for g in gpus.gpus}, {m.id: m for m in models.models}


@lru_cache(maxsize=8)
def _user(path: str, mtime: float) -> UserFile:
    p = Path(path)
    return _validate(p, _read(p), UserFile)


def _user_path(path: str | os.PathLike[str] | None) -> Path | None:
    chosen = path if path is not None else os.environ.get(ENV_VAR) or None
    if chosen is None:
        return None
    p = Path(chosen)
    if not p.is_file():
        source = "path argument" if path is not None else f"${ENV_VAR}"
        raise HardwareDBError(f"{p}: user hardware file (from {source}) does not exist")
    return p


def database(path: str | os.PathLike[str] | None = None) -> tuple[dict[str, GPUSpec], dict[str, ModelSpec]]:
    """All GPUs and models: the bundled ones, overridden or extended by the user's file."""
    gpus, models = _bundled()
    user = _user_path(path)
    if user is None:
        return gpus, models
    extra = _user(str(user.resolve()), user.stat().st_mtime)
    return {**gpus, **{g.id: g for g in extra.gpus}}, {**models, **{m.id: m for m in extra.models}}


def load_gpu(gpu_id: str, path: str | os.PathLike[str] | None = None) -> GPUSpec:
    """The GPU with this id; ``UnknownIdError`` (naming the closest ids) if there is none."""
    if not isinstance(gpu_id, str):
        raise InputError("gpu", f"a GPU id is a string (see list_gpus()), got {type(gpu_id).__name__}")
    gpus, _ = database(path)
    try:
        return gpus[gpu_id]
    except KeyError:
        raise UnknownIdError("GPU", gpu_id, sorted(gpus)) from None


def load_model(model_id: str, path: str | os.PathLike[str] | None = None) -> ModelSpec:
    """The model with this id; ``UnknownIdError`` (naming the closest ids) if there is none."""
    if not isinstance(model_id, str):
        raise InputError("model", f"a model id is a string (see list_models()), got {type(model_id).__name__}")
    _, models = database(path)
    try:
        return models[model_id]
    except KeyError:
        raise UnknownIdError("model", model_id, sorted(models)) from None


def list_gpus(path: str | os.PathLike[str] | None = None) -> list[str]:
    return sorted(database(path)[0])


def list_models(path: str | os.PathLike[str] | None = None) -> list[str]:
    return sorted(database(path)[1])


def validate_file(path: str | os.PathLike[str]) -> UserFile:
    """Validate a user hardware file without installing it (for tools and tests)."""
    p = Path(path)
    return _validate(p, _read(p), UserFile)
