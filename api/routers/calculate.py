"""The calculator: KV cache, estimate, plan, evaluate and sweep. Each route parses, calls
``calculator.service`` and returns its model.

KV cache and estimate take about a millisecond of CPU, so they run on the event loop (no thread
hop); plan, evaluate and sweep take tens to hundreds of milliseconds and run in the thread pool
so that the loop keeps answering health checks and fast requests meanwhile."""

from __future__ import annotations

from fastapi import APIRouter

from calculator import service as s
from calculator.serving import Evaluation

from ..errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1", tags=["calculator"], responses=ERROR_RESPONSES)


@router.post("/kv-cache", response_model=s.KVResponse, summary="KV-cache bytes per token, per request and per batch")
async def kv_cache(req: s.KVRequest) -> s.KVResponse:
    return s.kv_cache(req)


@router.post("/estimate", response_model=s.EstimateResponse,
             summary="Prefill, decode, KV and memory of one configuration, with its formulas")
async def estimate(req: s.EstimateRequest) -> s.EstimateResponse:
    return s.run_estimate(req)


@router.post("/plan", response_model=s.PlanResponse,
             summary="The deployment (mode, GPU, tp, instances) that meets an SLO at a rate; why")
def plan(req: s.PlanRequest) -> s.PlanResponse:
    return s.run_plan(req)


@router.post("/evaluate", response_model=Evaluation, summary="TTFT/TPOT percentiles and goodput of one deployment")
def evaluate(req: s.EvaluateRequest) -> Evaluation:
    return s.run_evaluate(req)


@router.post("/sweep", response_model=s.SweepResponse, summary="One input varied over a list: series to plot")
def sweep(req: s.SweepRequest) -> s.SweepResponse:
    return s.run_sweep(req)
