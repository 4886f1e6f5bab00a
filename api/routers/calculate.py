"""The calculator: KV cache, estimate, plan, evaluate, schedule, trace, calibrate and sweep. Each route parses the body
strictly, calls ``calculator.service`` and returns its model as JSON.

KV cache and estimate are bounded, millisecond work and run on the event loop; plan, evaluate and
sweep search, so they run through ``Runner`` (a worker thread, a deadline, stopped when the client
disconnects); so does calibrate, which evaluates every benchmark run per fit iteration. Responses are serialised by pydantic straight to JSON bytes: the response model is
declared for the OpenAPI document, and the object returned is already of that model."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from calculator import service as s
from calculator.serving import Evaluation

from ..body import body_openapi, json_body, parse_json
from ..errors import COMPUTE_RESPONSES

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)
router = APIRouter(prefix="/v1", tags=["calculator"], responses=COMPUTE_RESPONSES)


async def _heavy(request: Request, model: type[M], fn: Callable[[M], R]) -> R:
    """Parse (a body may hold 20,000 length samples) and compute in the runner's worker thread."""
    raw = await request.body()
    return await request.app.state.runner.run(request, lambda: fn(parse_json(raw, model)))


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


@router.post("/kv-cache", response_model=s.KVResponse, openapi_extra=body_openapi(s.KVRequest),
             summary="KV-cache bytes per token, per request and per batch")
async def kv_cache(request: Request) -> Response:
    return _json(s.kv_cache(await json_body(request, s.KVRequest)))


@router.post("/estimate", response_model=s.EstimateResponse, openapi_extra=body_openapi(s.EstimateRequest),
             summary="Prefill, decode, KV and memory of one configuration, with its formulas")
async def estimate(request: Request) -> Response:
    return _json(s.run_estimate(await json_body(request, s.EstimateRequest)))


@router.post("/plan", response_model=s.PlanResponse, openapi_extra=body_openapi(s.PlanRequest),
             summary="The deployment (mode, GPU, tp, instances) that meets an SLO at a rate; why")
async def plan(request: Request) -> Response:
    return _json(await _heavy(request, s.PlanRequest, s.run_plan))


@router.post("/evaluate", response_model=Evaluation, openapi_extra=body_openapi(s.EvaluateRequest),
             summary="TTFT/TPOT percentiles and goodput of one deployment")
async def evaluate(request: Request) -> Response:
    return _json(await _heavy(request, s.EvaluateRequest, s.run_evaluate))


@router.post("/schedule", response_model=s.Schedule, openapi_extra=body_openapi(s.ScheduleRequest),
             summary="A day of traffic windows on fixed GPU types: disaggregated, colocated and static, in GPU-hours")
async def schedule(request: Request) -> Response:
    return _json(await _heavy(request, s.ScheduleRequest, s.run_schedule))


@router.post("/trace", response_model=s.TraceResponse, openapi_extra=body_openapi(s.TraceRequest),
             summary="A request trace's rate, burstiness, lengths and prefix hits, and the workload it gives")
async def trace(request: Request) -> Response:
    return _json(await _heavy(request, s.TraceRequest, s.run_trace))


@router.post("/calibrate", response_model=s.CalibrateResponse, openapi_extra=body_openapi(s.CalibrateRequest),
             summary="Fit a GPU's efficiencies to your own serving benchmarks (vLLM, SGLang, genai-perf, trtllm-bench results)")
async def calibrate(request: Request) -> Response:
    return _json(await _heavy(request, s.CalibrateRequest, s.run_calibrate))


@router.post("/sweep", response_model=s.SweepResponse, openapi_extra=body_openapi(s.SweepRequest),
             summary="One input varied over a list: series to plot")
async def sweep(request: Request) -> Response:
    return _json(await _heavy(request, s.SweepRequest, s.run_sweep))
