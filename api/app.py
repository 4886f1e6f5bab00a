"""``create_app``: the FastAPI application (``uvicorn api:app`` or ``pdplan serve``)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from calculator.errors import HardwareDBError
from calculator.limits import MAX_BODY_BYTES
from calculator.service import VersionInfo, version_info
from hardware_db.loader import database

from . import docs_ui, errors
from .body import add_body_schemas
from .compute import Runner
from .limits import BodySizeLimit
from .routers import calculate, web
from .routers import database as database_router

DESCRIPTION = """Closed-form capacity planning for LLM serving: prefill (TTFT), decode (TPOT), KV cache,
and mixed / chunked / disaggregated deployments sized against latency SLOs. Every figure comes with
the formula that produced it. Model and GPU ids come from `GET /v1/models` and `GET /v1/gpus`; any
endpoint that takes an id also takes an inline spec (a custom GPU, or a model as a Hugging Face
`config.json` under `{"hf_config": {...}}`). Bodies are validated strictly (`true` is not a number,
`"8"` is not 8). Invalid input is a 422 naming the field, an unknown id a 404 naming the closest ids,
a body over 1 MB a 413; a computation past the server's deadline is stopped and answered 504."""


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    gpus: int
    models: int


SWITCH_INTERVAL_S = 0.0005
"""The GIL hand-over interval while serving (Python's default is 5 ms). A plan computing in a worker
thread holds the GIL between hand-overs, and each await of the event loop that releases it waits up
to one interval to get it back; at 5 ms, a health check's dozen such waits added up to 60-130 ms."""


@asynccontextmanager
async def _serving(_: FastAPI) -> AsyncIterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def create_app(deadline_s: float | None = None, max_concurrent: int = 4) -> FastAPI:
    """The app; ``deadline_s`` bounds each plan, evaluate and sweep (default ``PDPLAN_DEADLINE_S`` or 5 s)."""
    app = FastAPI(title="pdplan", version=version_info().version, description=DESCRIPTION, lifespan=_serving,
                  responses={413: {"model": errors.Detail, "description": f"body over {MAX_BODY_BYTES} bytes"}},
                  docs_url=None, redoc_url=None)  # docs_ui serves both pages with their assets, no CDN
    app.state.runner = Runner(deadline_s, max_concurrent)
    errors.install(app)
    docs_ui.install(app)
    app.include_router(database_router.router)
    app.include_router(calculate.router)
    app.include_router(web.router)

    async def healthz() -> Health:
        return Health(status="ok")

    def readyz() -> Any:
        try:
            gpus, models = database()
        except HardwareDBError as e:
            errors.log.error("not ready: %s", e)
            return JSONResponse(status_code=503, content={"detail": "the hardware database cannot be read"})
        return Ready(status="ready", gpus=len(gpus), models=len(models))

    app.get("/healthz", response_model=Health, tags=["service"], summary="Liveness: the process answers")(healthz)
    app.get("/readyz", response_model=Ready, tags=["service"],
            summary="Readiness: the hardware database can be read (503 when it cannot)",
            responses={503: {"model": errors.Detail, "description": "the hardware database cannot be read"}})(readyz)
    for path, endpoint in (("/healthz", healthz), ("/readyz", readyz)):  # load balancers probe with HEAD
        app.head(path, include_in_schema=False)(endpoint)

    @app.get("/v1/version", response_model=VersionInfo, tags=["service"],
             responses={503: {"model": errors.Detail, "description": "the hardware database cannot be read"}})
    def version() -> VersionInfo:
        return version_info()

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_body_schemas(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodySizeLimit, max_bytes=MAX_BODY_BYTES)
    return app


app = create_app()
