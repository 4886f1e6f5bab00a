"""The calculator: KV cache, estimate, plan, evaluate and sweep. Each route parses the body
strictly, calls ``calculator.service`` and returns its model as JSON.

KV cache and estimate are bounded, millisecond work and run on the event loop; plan, evaluate and
sweep search, so they run through ``Runner`` (a worker thread, a deadline, stopped when the client
disconnects). Responses are serialised by pydantic straight to JSON bytes: the response model is
declared for the OpenAPI document, and the object returned is already of that model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel

from calculator import service as s
from calculator.serving import Evaluation

from ..body import body_openapi, json_body
from ..errors import COMPUTE_RESPONSES

router = APIRouter(prefix="/v1", tags=["calculator"], responses=COMPUTE_RESPONSES)


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


@router.post("/kv-cache", response_model=s.KVResponse, openapi_extra=body_openapi(s.KVRequest),
             summary="KV-cache bytes per token, per request and per batch")
async def kv_cache(req: Annotated[s.KVRequest, Depends(json_body(s.KVRequest))]) -> Response:
    return _json(s.kv_cache(req))


@router.post("/estimate", response_model=s.EstimateResponse, openapi_extra=body_openapi(s.EstimateRequest),
             summary="Prefill, decode, KV and memory of one configuration, with its formulas")
async def estimate(req: Annotated[s.EstimateRequest, Depends(json_body(s.EstimateRequest))]) -> Response:
    return _json(s.run_estimate(req))


@router.post("/plan", response_model=s.PlanResponse, openapi_extra=body_openapi(s.PlanRequest),
             summary="The deployment (mode, GPU, tp, instances) that meets an SLO at a rate; why")
async def plan(request: Request, req: Annotated[s.PlanRequest, Depends(json_body(s.PlanRequest))]) -> Response:
    return _json(await request.app.state.runner.run(request, s.run_plan, req))


@router.post("/evaluate", response_model=Evaluation, openapi_extra=body_openapi(s.EvaluateRequest),
             summary="TTFT/TPOT percentiles and goodput of one deployment")
async def evaluate(request: Request,
                   req: Annotated[s.EvaluateRequest, Depends(json_body(s.EvaluateRequest))]) -> Response:
    return _json(await request.app.state.runner.run(request, s.run_evaluate, req))


@router.post("/sweep", response_model=s.SweepResponse, openapi_extra=body_openapi(s.SweepRequest),
             summary="One input varied over a list: series to plot")
async def sweep(request: Request, req: Annotated[s.SweepRequest, Depends(json_body(s.SweepRequest))]) -> Response:
    return _json(await request.app.state.runner.run(request, s.run_sweep, req))
