"""Request bodies: parsed straight from the JSON bytes in pydantic's strict mode.

Strict JSON validation takes a number only where a number is asked (``true`` is not 1, ``"8"`` is
not 8, ``4.0`` is not a token count) and is faster than decoding to Python objects first. FastAPI
does not do this for a body parameter, so each route takes the ``Request``, calls
``json_body(request, Model)`` and declares ``body_openapi(Model)``; ``add_body_schemas`` puts the
models into the OpenAPI document, so the documented request schema is the one enforced."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

M = TypeVar("M", bound=BaseModel)
BODY_MODELS: list[type[BaseModel]] = []
"""Every model used as a request body, registered by body_openapi()."""
SCHEMA_SUFFIX = "-Input"


def parse_json(raw: bytes, model: type[M]) -> M:
    """``raw`` validated strictly as ``model`` (a 422 naming each field otherwise)."""
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


async def json_body(request: Request, model: type[M]) -> M:
    """The request body validated strictly as ``model`` (a 422 naming each field otherwise)."""
    return parse_json(await request.body(), model)


def body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose body is ``model`` (registered for add_body_schemas)."""
    if model not in BODY_MODELS:
        BODY_MODELS.append(model)
    ref = {"$ref": f"#/components/schemas/{model.__name__}{SCHEMA_SUFFIX}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def add_body_schemas(spec: dict[str, Any]) -> dict[str, Any]:
    """Add the request models' validation schemas to an OpenAPI document's components, under
    ``<Name>-Input`` so they never clash with a response model's serialisation schema."""
    _, top = models_json_schema([(m, "validation") for m in BODY_MODELS],
                                ref_template="#/components/schemas/{model}" + SCHEMA_SUFFIX)
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in top.get("$defs", {}).items():
        schemas[name + SCHEMA_SUFFIX] = schema
    return spec
