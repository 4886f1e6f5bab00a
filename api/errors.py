"""Error bodies and handlers: a calculator ValueError is a 422 naming the field, an unknown id a 404
naming the closest ids, an oversized body a 413. Bodies follow FastAPI's validation-error shape."""

from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from hardware_db.loader import UnknownIdError

_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.+)$", re.S)


class NotFound(BaseModel):
    detail: str
    closest: list[str] = Field(description="the closest known ids")


class TooLarge(BaseModel):
    detail: str


ERROR_RESPONSES: dict[int | str, dict] = {
    404: {"model": NotFound, "description": "an unknown model or GPU id; the body names the closest known ids"},
}


def field_error(message: str, where: str = "body") -> dict:
    """One FastAPI-style error item from a calculator message 'field.path: reason'."""
    m = _FIELD.match(message)
    if m:
        loc: list[str | int] = [where, *[int(p) if p.isdigit() else p for p in m.group(1).split(".")]]
        return {"loc": loc, "msg": m.group(2), "type": "value_error"}
    return {"loc": [where], "msg": message, "type": "value_error"}


def install(app: FastAPI) -> None:
    @app.exception_handler(UnknownIdError)
    async def _unknown(_: Request, exc: UnknownIdError) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc), "closest": exc.closest})

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        # the echoed input is left out: it may hold NaN/Infinity, which JSON cannot carry
        items = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": items})

    @app.exception_handler(ValidationError)
    async def _invalid_record(_: Request, exc: ValidationError) -> JSONResponse:
        items = [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": items})

    @app.exception_handler(ValueError)
    async def _invalid(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": [field_error(str(exc))]})
