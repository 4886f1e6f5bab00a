"""``create_app``: the FastAPI application (``uvicorn api:app`` or ``pdplan serve``)."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from calculator.service import VersionInfo, version_info

from . import errors
from .limits import MAX_BODY_BYTES, BodySizeLimit
from .routers import calculate, database

DESCRIPTION = """Closed-form capacity planning for LLM serving: prefill (TTFT), decode (TPOT), KV cache,
and mixed / chunked / disaggregated deployments sized against latency SLOs. Every figure comes with
the formula that produced it. Model and GPU ids come from `GET /v1/models` and `GET /v1/gpus`; any
endpoint that takes an id also takes an inline spec (a custom GPU, or a model as a Hugging Face
`config.json` under `{"hf_config": {...}}`). Invalid input is a 422 naming the field, an unknown id
a 404 naming the closest ids, a body over 1 MB a 413."""


class Health(BaseModel):
    status: str


def create_app() -> FastAPI:
    app = FastAPI(title="pdplan", version=version_info().version, description=DESCRIPTION,
                  responses={400: {"model": errors.TooLarge, "description": "the body is not valid JSON text"},
                             413: {"model": errors.TooLarge, "description": f"body over {MAX_BODY_BYTES} bytes"}})
    errors.install(app)
    app.include_router(database.router)
    app.include_router(calculate.router)

    @app.get("/healthz", response_model=Health, tags=["service"])
    def healthz() -> Health:
        return Health(status="ok")

    @app.get("/v1/version", response_model=VersionInfo, tags=["service"])
    def version() -> VersionInfo:
        return version_info()

    app.add_middleware(BodySizeLimit, max_bytes=MAX_BODY_BYTES)
    return app


app = create_app()
