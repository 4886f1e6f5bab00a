"""The GPU and model database, with sources."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from calculator.engines import PhaseError, engine_errors
from calculator.service import ModelInfo, engine_catalog, gpu_catalog, model_catalog, model_info
from hardware_db.loader import load_engine, load_gpu, load_model
from hardware_db.schema import EngineProfile, GPUSpec

from ..errors import ERROR_RESPONSES, Detail

router = APIRouter(prefix="/v1", tags=["database"], responses={
    503: {"model": Detail, "description": "the hardware database cannot be read"}})


@router.get("/gpus", response_model=list[GPUSpec], summary="All GPUs, with datasheet sources")
async def gpus() -> list[GPUSpec]:
    return gpu_catalog()


@router.get("/gpus/{gpu_id}", response_model=GPUSpec, responses=ERROR_RESPONSES, summary="One GPU")
async def gpu(gpu_id: Annotated[str, Path(max_length=64, examples=["h100-sxm"])]) -> GPUSpec:
    return load_gpu(gpu_id)


@router.get("/models", response_model=list[ModelInfo], summary="All models, with parameter counts and sources")
async def models() -> list[ModelInfo]:
    return model_catalog()


@router.get("/models/{model_id}", response_model=ModelInfo, responses=ERROR_RESPONSES, summary="One model")
async def model(model_id: Annotated[str, Path(max_length=64, examples=["llama-3.1-70b"])]) -> ModelInfo:
    return model_info(load_model(model_id))


@router.get("/engines", response_model=list[EngineProfile], summary="All engine profiles, with what they were fitted on")
async def engines() -> list[EngineProfile]:
    return engine_catalog()


class EngineProfileErrors(BaseModel):
    profile: EngineProfile
    errors: list[PhaseError] = Field(description="|predicted / measured - 1| of prefill and decode step times per "
                                     "published source (the one fitted and the ones held out), per GPU and tp; "
                                     "source \"served\": the TTFT (phase prefill) and TPOT (decode) of public "
                                     "serving benchmarks of the profile's engine, fitted, held out and per source")


@router.get("/engines/{engine_id}", response_model=EngineProfileErrors, responses=ERROR_RESPONSES,
            summary="One engine profile and its error against public step latencies and serving benchmarks")
def engine(engine_id: Annotated[str, Path(max_length=64, examples=["trtllm-0.9"])]) -> EngineProfileErrors:
    profile = load_engine(engine_id)
    return EngineProfileErrors(profile=profile, errors=engine_errors(profile.id))
