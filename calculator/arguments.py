"""Checks of the Python API's arguments: each wrong argument is one ``InputError`` naming it.

The checks are plain ``isinstance`` tests and comparisons (microseconds), so ``estimate`` stays a
~1 ms call; a pydantic model is validated only when a mapping is given in its place. Numbers follow
the REST API's rules and bounds (``calculator.limits``): a bool is not a number, NaN and infinities
are refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from hardware_db.loader import load_gpu, load_model
from hardware_db.schema import GPUSpec, ModelSpec

from .errors import InputError, UnknownIdError

M = TypeVar("M", bound=BaseModel)

_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w]*(?:\.[\w]+)*): (.+)$", re.S)


def _what(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def integer(field: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in [low, high] (a bool or a float is refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(field, f"must be an integer, got {_what(value)}")
    if not low <= value <= high:
        raise InputError(field, f"must be in {low:,} ... {high:,}, got {value:,}")
    return int(value)


def real(field: str, value: Any, low: float, high: float, low_open: bool = False,
         high_open: bool = False) -> float:
    """``value`` as a finite float in the interval (open at an end where asked)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(field, f"must be a number, got {_what(value)}")
    x = float(value)
    if not math.isfinite(x):
        raise InputError(field, f"must be finite, got {x!r}")
    if (x <= low if low_open else x < low) or (x >= high if high_open else x > high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise InputError(field, f"must be in {interval}, got {x:g}")
    return x


def choice(field: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """``value`` if it is one of ``allowed`` (compared by type too, so True is not 1)."""
    if not any(type(value) is type(a) and value == a for a in allowed):
        raise InputError(field, f"choose one of {', '.join(map(str, allowed))}; got {_what(value)}")
    return value


def flag(field: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(field, f"must be True or False, got {_what(value)}")
    return bool(value)


def items(field: str, value: Any, limit: int, single: tuple[type, ...] = (str,)) -> list[Any]:
    """A list from a list, tuple or other iterable of at most ``limit`` items; a lone value of a
    ``single`` type (an id string) is taken as a list of one. Strings are never iterated."""
    if isinstance(value, single):
        return [value]
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InputError(field, f"give a list, got {_what(value)}")
    out = list(islice(value, limit + 1))
    if not out:
        raise InputError(field, "give at least one")
    if len(out) > limit:
        raise InputError(field, f"at most {limit} items")
    return out


def from_validation_error(e: ValidationError, field: str) -> InputError:
    """pydantic's first error as one ``InputError`` whose field is the argument path
    (``deployment.prefill.tp``); a validator's own ``"name: reason"`` message extends the path."""
    first = e.errors(include_url=False)[0]
    path = [field, *(str(p) for p in first["loc"])]
    msg = str(first["msg"])
    if first["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
        m = _FIELD_PREFIX.match(msg)
        if m:
            path.append(m.group(1))
            msg = m.group(2)
    return InputError(".".join(p for p in path if p), msg)


def as_model(field: str, value: Any, cls: type[M]) -> M:
    """``value`` if it is a ``cls`` already (no revalidation); a mapping is validated into one."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        try:
            return cls.model_validate(dict(value))
        except ValidationError as e:
            raise from_validation_error(e, field) from None
    if value is None:
        raise InputError(field, f"required: expected {cls.__name__} or a mapping of its fields")
    raise InputError(field, f"expected {cls.__name__} or a mapping of its fields, got {_what(value)}")


def model_spec(value: Any, field: str = "model") -> ModelSpec:
    """A ModelSpec from a database id or a spec."""
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, str):
        return _known(load_model, value, field)
    raise InputError(field, f"give a model id (see pc.list_models()) or a ModelSpec, got {_what(value)}")


def gpu_spec(value: Any, field: str = "gpu") -> GPUSpec:
    """A GPUSpec from a database id, a spec or a mapping of a spec's fields."""
    if isinstance(value, GPUSpec):
        return value
    if isinstance(value, str):
        return _known(load_gpu, value, field)
    if isinstance(value, Mapping):
        return as_model(field, value, GPUSpec)
    raise InputError(field, f"give a GPU id (see pc.list_gpus()) or a GPUSpec, got {_what(value)}")


def _known(load, wanted: str, field: str):
    try:
        return load(wanted)
    except UnknownIdError as e:
        if e.field == field:
            raise
        raise type(e)(e.kind, e.wanted, e.known, field=field) from None  # an ambiguous id stays ambiguous

