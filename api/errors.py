"""Error bodies and handlers. Client errors name the field, server faults never show the server's
paths or tracebacks (those go to the log):

- 422: invalid input, one item per problem, ``loc`` the user's own field path;
- 404: an unknown model or GPU id, with the closest known ids;
- 413: a body over the size limit;
- 503: the server's hardware database cannot be read, or no computation slot freed up in time;
- 504: the computation ran past its deadline and was stopped;
- 500: anything else (a bug), with no detail beyond that.
Bodies follow FastAPI's validation-error shape."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from calculator.errors import Cancelled, DeadlineExceeded, HardwareDBError, InputError, UnknownIdError

from .compute import Busy

log = logging.getLogger("pdplan.api")
_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.+)$", re.DOTALL)
# the tags of calculator.service's model and GPU reference unions, and pydantic's validator names
_INTERNAL_LOC = re.compile(r"^(~(id|spec|hf_config)$|(function-(after|before|wrap|plain)|tagged-union|union|json-or-python)\[)")
_PREFIXES = ("Value error, ", "Assertion failed, ")


class NotFound(BaseModel):
    detail: str
    closest: list[str] = Field(description="the closest known ids")


class Detail(BaseModel):
    detail: str


class ValidationItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Invalid(BaseModel):
    detail: list[ValidationItem]


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"model": NotFound, "description": "an unknown model or GPU id; the body names the closest known ids"},
}
COMPUTE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    422: {"model": Invalid, "description": "invalid input: one item per problem, naming the field"},
    503: {"model": Detail, "description": "the server's hardware database cannot be read, or the server is busy"},
    504: {"model": Detail, "description": "the computation exceeded the server's deadline and was stopped"},
}


def _path(field: str) -> list[str | int]:
    return [int(p) if p.isdigit() else p for p in field.split(".") if p]


def field_error(message: str, where: str = "body") -> dict[str, Any]:
    """One error item from a calculator message 'field.path: reason'."""
    m = _FIELD.match(message)
    if m:
        return {"loc": [where, *_path(m.group(1))], "msg": m.group(2), "type": "value_error"}
    return {"loc": [where], "msg": message, "type": "value_error"}


def input_error(e: InputError, where: str = "body") -> dict[str, Any]:
    return {"loc": [where, *_path(e.field)], "msg": e.reason, "type": "value_error"}


def clean_item(err: dict[str, Any]) -> dict[str, Any]:
    """A pydantic error item in the user's terms: no union tags or validator names in the location,
    an InputError raised in a validator located at its own field, no 'Value error, ' prefix."""
    loc = [p for p in err["loc"] if not (isinstance(p, str) and _INTERNAL_LOC.match(p))]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, InputError):
        return {"loc": loc + _path(cause.field), "msg": cause.reason, "type": "value_error"}
    msg = err["msg"]
    for prefix in _PREFIXES:
        msg = msg.removeprefix(prefix)
    return {"loc": loc, "msg": msg, "type": err["type"]}


def _unique(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, out = set(), []
    for it in items:
        key = (tuple(it["loc"]), it["msg"])
        if key not in seen:
            seen.add(key)
            out.append(it)
    return out


def install(app: FastAPI) -> None:
    @app.exception_handler(UnknownIdError)
    async def _unknown(_: Request, exc: UnknownIdError) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc), "closest": exc.closest})

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        # the echoed input is left out: it may hold NaN/Infinity, which JSON cannot carry
        return JSONResponse(status_code=422, content={"detail": _unique([clean_item(e) for e in exc.errors()])})

    @app.exception_handler(ValidationError)
    async def _invalid_record(_: Request, exc: ValidationError) -> JSONResponse:
        items = [clean_item({**e, "loc": ("body", *e["loc"])}) for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": _unique(items)})

    @app.exception_handler(InputError)
    async def _input(_: Request, exc: InputError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": [input_error(exc)]})

    @app.exception_handler(ValueError)
    async def _invalid(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": [field_error(str(exc))]})

    @app.exception_handler(HardwareDBError)
    async def _database(_: Request, exc: HardwareDBError) -> JSONResponse:
        log.error("hardware database unavailable: %s", exc)
        return JSONResponse(status_code=503, content={
            "detail": "the server's hardware database cannot be read; the server log says why"})

    @app.exception_handler(DeadlineExceeded)
    async def _deadline(_: Request, exc: DeadlineExceeded) -> JSONResponse:
        return JSONResponse(status_code=504, content={"detail": str(exc)})

    @app.exception_handler(Busy)
    async def _busy(_: Request, exc: Busy) -> JSONResponse:
        return JSONResponse(status_code=503, headers={"retry-after": "1"}, content={
            "detail": "the server is busy with other computations; retry shortly"})

    @app.exception_handler(Cancelled)
    async def _cancelled(_: Request, exc: Cancelled) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc)})  # nobody is listening any more

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return JSONResponse(status_code=500, content={"detail": "internal error; the server log has the details"})
