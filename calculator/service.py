"""Requests and responses shared by the REST API and the command line, and the functions that
answer them.

One schema: the API's OpenAPI document and the CLI's ``--json`` output are these models, and the
answers come from ``estimate``, ``plan`` and ``evaluate``. Every request is bounded: lengths,
list sizes and search spaces have caps, each reported by field when exceeded.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import cache, lru_cache
from importlib import metadata
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from hardware_db.loader import ENV_VAR, database, list_engines, load_engine, load_gpu, load_model
from hardware_db.schema import Efficiency, EngineProfile, GPUSpec, KVDtype, ModelSpec, WeightDtype

from .benchfiles import MAX_BENCH_FILE_BYTES
from .calibrate import CalibrationFit
from .errors import InputError
from .estimate import Estimate, estimate
from .formulas import FORMULAS
from .hf_config import model_from_hf_config
from .kv_cache import kv_bytes_per_gpu, kv_bytes_per_token, kv_cache_bytes
from .launch import Engine, Launch, to_launch, workload_max_model_len
from .limits import (
    MAX_BATCH,
    MAX_CHUNK_BUDGETS,
    MAX_EXPERT_PARALLEL,
    MAX_GPU_TYPES,
    MAX_HF_CONFIG_KEYS,
    MAX_PARALLEL,
    MAX_PLAN_SWEEP_POINTS,
    MAX_SWEEP_POINTS,
    MAX_TOKENS,
)
from .optimizer import CHUNKS, CPS, DPS, TPS, Objective, Plan, plan
from .params import active_param_count, param_count
from .phases import DEFAULT_EXPERT_IMBALANCE
from .schedule import MAX_WINDOWS, Schedule, Window, plan_schedule
from .serving import SLO, Deployment, Evaluation, Workload, evaluate
from .serving.base import Mode, Scheduler
from .speculation import Speculation
from .traces import TraceStats

ESTIMATE_SWEEPABLE = ("isl", "osl", "batch", "tp", "pp", "prefix_hit", "gpu_memory_utilisation")
PLAN_SWEEPABLE = ("rate", "isl", "osl", "prefix_hit", "ttft_s", "tpot_s")


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class HFConfig(_Request):
    """A model given as the JSON object of a Hugging Face ``config.json``."""

    hf_config: dict[str, Any] = Field(max_length=MAX_HF_CONFIG_KEYS, description="the config.json object")
    id: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64,
                           description="id to give the model (default: derived from the config)")


ModelId = Annotated[str, Field(min_length=1, max_length=64, description="a model id from GET /v1/models")]
GpuId = Annotated[str, Field(min_length=1, max_length=64, description="a GPU id from GET /v1/gpus")]


def _model_kind(v: Any) -> str | None:
    """Which form a model reference takes: an id (a string), a config.json (an object holding
    ``hf_config``) or an inline ModelSpec (any other object). Picking the form first means an invalid
    reference gets the errors of that form alone, not one list per form of the union."""
    if isinstance(v, str):
        return "~id"
    if isinstance(v, HFConfig) or (isinstance(v, dict) and "hf_config" in v):
        return "~hf_config"
    return "~spec" if isinstance(v, (dict, ModelSpec)) else None


def _gpu_kind(v: Any) -> str | None:
    if isinstance(v, str):
        return "~id"
    return "~spec" if isinstance(v, (dict, GPUSpec)) else None


# Union tags start with '~' so that error locations can drop them (api/errors.py): the user's path
# is ["body", "model", "num_layers"], not ["body", "model", "ModelSpec", "num_layers"].
ModelRef = Annotated[
    Annotated[ModelId, Tag("~id")] | Annotated[ModelSpec, Tag("~spec")] | Annotated[HFConfig, Tag("~hf_config")],
    Discriminator(_model_kind, custom_error_type="model_ref",
                  custom_error_message="a model is an id string, an inline ModelSpec object or {\"hf_config\": {...}}"),
]
GPURef = Annotated[
    Annotated[GpuId, Tag("~id")] | Annotated[GPUSpec, Tag("~spec")],
    Discriminator(_gpu_kind, custom_error_type="gpu_ref",
                  custom_error_message="a GPU is an id string or an inline GPUSpec object"),
]
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
EngineProfileId = Annotated[str, Field(max_length=64, pattern=r"^[a-z0-9][a-z0-9.\-]*$",
                                       examples=["generic", "trtllm-0.9"])]


def resolve_model(ref: ModelRef, field: str = "model") -> ModelSpec:
    """A ModelSpec from a database id, an inline spec or a Hugging Face config."""
    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, HFConfig):
        return model_from_hf_config(dict(ref.hf_config), model_id=ref.id, field=f"{field}.hf_config")
    return load_model(ref)


def resolve_gpu(ref: GPURef) -> GPUSpec:
    return ref if isinstance(ref, GPUSpec) else load_gpu(ref)


# ------------------------------------------------------------------------------------------ database

class ModelInfo(BaseModel):
    """A catalog model with its derived sizes."""

    model_config = ConfigDict(frozen=True)

    spec: ModelSpec
    param_count: int = Field(description="parameters from the layer shapes")
    active_param_count: int = Field(description="parameters one token touches (MoE: k routed + shared experts)")
    kv_bytes_per_token_bf16: float = Field(description="all layers, bf16 KV, before any sliding-window cap")


def model_info(m: ModelSpec) -> ModelInfo:
    return ModelInfo(spec=m, param_count=param_count(m), active_param_count=active_param_count(m),
                     kv_bytes_per_token_bf16=kv_bytes_per_token(m, "bf16"))


def gpu_catalog() -> list[GPUSpec]:
    gpus, _ = database()
    return [gpus[k] for k in sorted(gpus)]


def engine_catalog() -> list[EngineProfile]:
    return [load_engine(e) for e in list_engines()]


def model_catalog() -> list[ModelInfo]:
    _, models = database()
    return [model_info(models[k]) for k in sorted(models)]


class VersionInfo(BaseModel):
    package: str
    version: str
    database_sha256: str = Field(description="hash of the GPU and model records in use")
    gpus: int
    models: int
    python: str


def version_info() -> VersionInfo:
    """Package and database identity; recomputed when the user's hardware file changes."""
    return _version_info(_database_stamp())


def _database_stamp() -> tuple[str, int, int] | None:
    """(path, mtime_ns, size) of the user's hardware file, None without one; it keys the cache."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path, -1, -1)
    return (path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _version_info(stamp: tuple[str, int, int] | None) -> VersionInfo:
    gpus, models = database()
    body = json.dumps({"gpus": [g.model_dump(mode="json") for g in gpus.values()],
                       "models": [m.model_dump(mode="json") for m in models.values()]}, sort_keys=True)
    try:
        version = metadata.version("pdplan")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    return VersionInfo(package="pdplan", version=version, database_sha256=hashlib.sha256(body.encode()).hexdigest(),
                       gpus=len(gpus), models=len(models), python=platform.python_version())


# ------------------------------------------------------------------------------------------ KV cache

class KVRequest(_Request):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra={
        "examples": [{"model": "llama-3.1-70b", "kv_dtype": "bf16", "context_tokens": 8192, "batch": 32, "tp": 4}]})

    model: ModelRef
    kv_dtype: KVDtype = "bf16"
    context_tokens: Tokens = Field(default=4096, description="tokens held per request (prompt + generated)")
    batch: int = Field(default=1, ge=1, le=MAX_BATCH, description="concurrent requests")
    tp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="tensor-parallel degree (KV heads split across GPUs)")


class FormulaInfo(BaseModel):
    name: str
    latex: str
    unit: str
    doc: str


@cache
def formula_info(name: str) -> FormulaInfo:
    f = FORMULAS[name]
    return FormulaInfo(name=name, latex=f.latex, unit=f.unit, doc=f.doc)


class KVResponse(BaseModel):
    model: str
    kv_dtype: str
    context_tokens: int
    batch: int
    tp: int
    bytes_per_token: float = Field(description="all layers, before any sliding-window cap")
    bytes_per_request: float = Field(description="one request at context_tokens (sliding layers capped at the window)")
    bytes_batch: float = Field(description="the whole batch, all GPUs")
    bytes_per_gpu_batch: float = Field(description="the whole batch on one GPU of the tp group")
    formula: FormulaInfo


def kv_cache(req: KVRequest) -> KVResponse:
    m = resolve_model(req.model)
    if m.num_attention_heads % req.tp:
        raise ValueError(f"tp: {m.id}'s {m.num_attention_heads} attention heads do not split evenly over tp={req.tp}")
    per_request = float(kv_cache_bytes(m, req.context_tokens, req.kv_dtype, tp=1))
    return KVResponse(
        model=m.id, kv_dtype=req.kv_dtype, context_tokens=req.context_tokens, batch=req.batch, tp=req.tp,
        bytes_per_token=kv_bytes_per_token(m, req.kv_dtype), bytes_per_request=per_request,
        bytes_batch=per_request * req.batch,
        bytes_per_gpu_batch=float(kv_bytes_per_gpu(m, req.context_tokens, req.kv_dtype, tp=req.tp)) * req.batch,
        formula=formula_info("kv_bytes_context"),
    )


# ------------------------------------------------------------------------------------------ estimate

class EstimateRequest(_Request):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra={
        "examples": [{"model": "llama-3.1-70b", "gpu": "h200-sxm", "tp": 4, "isl": 4000, "osl": 500, "batch": 8,
                      "weight_dtype": "bf16", "kv_dtype": "bf16"}]})

    model: ModelRef
    gpu: GPURef
    tp: int = Field(default=1, ge=1, le=MAX_PARALLEL)
    pp: int = Field(default=1, ge=1, le=MAX_PARALLEL)
    ep: int = Field(default=1, ge=1, le=MAX_EXPERT_PARALLEL, description="expert-parallel degree (MoE): divides tp, or is "
                    "dp x tp with attention data-parallelism")
    dp: int = Field(default=1, ge=1, le=MAX_EXPERT_PARALLEL, description="attention data-parallel ranks of tp GPUs (MoE)")
    expert_imbalance: float = Field(default=DEFAULT_EXPERT_IMBALANCE, ge=1.0, le=16.0,
                                    description="with ep > 1: routed tokens on the busiest GPU / the mean")
    spec: Speculation | None = Field(default=None, description="speculative decoding (mtp, eagle or a draft model)")
    cp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="context-parallel ranks of tp GPUs (long prompts)")
    isl: Tokens = 1024
    osl: Tokens = 256
    batch: int = Field(default=1, ge=1, le=MAX_BATCH)
    weight_dtype: WeightDtype = "bf16"
    kv_dtype: KVDtype = "bf16"
    prefix_hit: float = Field(default=0.0, ge=0, lt=1, description="fraction of the prompt in the prefix cache")
    gpu_memory_utilisation: float = Field(default=0.9, gt=0, le=1)
    calibration: Efficiency | None = Field(default=None, description="efficiencies replacing the GPU's defaults")
    engine: EngineProfileId = Field(default="generic", description="engine profile whose efficiencies to use "
                                    "(GET /v1/engines; generic: the GPU entries' own); not with a calibration")
    rows: bool = Field(default=True, description="include the operator rows")


class EstimateResponse(BaseModel):
    estimate: Estimate
    formulas: list[FormulaInfo] = Field(description="every formula the figures came from, as LaTeX")


BASE_ESTIMATE_FORMULAS = ("weights_bytes_per_gpu", "kv_bytes_context", "kv_budget_bytes", "max_batch",
                          "gemm_flops", "attention_flops", "attention_kv_read_bytes", "roofline_time")


def run_estimate(req: EstimateRequest) -> EstimateResponse:
    e = estimate(resolve_model(req.model), resolve_gpu(req.gpu), tp=req.tp, pp=req.pp, ep=req.ep, dp=req.dp,
                 expert_imbalance=req.expert_imbalance, spec=req.spec, cp=req.cp, isl=req.isl,
                 osl=req.osl, batch=req.batch, weight_dtype=req.weight_dtype, kv_dtype=req.kv_dtype,
                 prefix_hit=req.prefix_hit, gpu_memory_utilisation=req.gpu_memory_utilisation,
                 calibration=req.calibration, rows=True, engine=req.engine)
    names = list(BASE_ESTIMATE_FORMULAS) + sorted({r.formula for r in e.rows} - set(BASE_ESTIMATE_FORMULAS))
    if not req.rows:
        e = e.model_copy(update={"rows": ()})
    return EstimateResponse(estimate=e, formulas=[formula_info(n) for n in names])


# ------------------------------------------------------------------------------------------ plan

class PlanRequest(_Request):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra={
        "examples": [{"model": "llama-3.1-70b", "workload": {"rate": 12.0, "isl": 4000, "osl": 500},
                      "slo": {"ttft_s": 2.0, "tpot_s": 0.05, "percentile": 90},
                      "gpus": ["h100-sxm", "h200-sxm", "h20"], "objective": "gpus"}]})

    model: ModelRef
    workload: Workload
    slo: SLO
    gpus: list[GPURef] | None = Field(default=None, min_length=1, max_length=MAX_GPU_TYPES,
                                      description="candidate GPU ids or inline specs; default: the whole database")
    modes: list[Mode] | None = Field(default=None, min_length=1, max_length=3)
    objective: Objective = "gpus"
    tps: list[Literal[1, 2, 4, 8, 16]] = Field(default=list(TPS), min_length=1, max_length=5)
    chunk_sizes: list[Annotated[int, Field(ge=64, le=65_536)]] = Field(default=list(CHUNKS), min_length=1, max_length=MAX_CHUNK_BUDGETS)
    weight_dtype: WeightDtype = "bf16"
    kv_dtype: KVDtype = "bf16"
    kv_link: Literal["scaleout", "scaleup"] = "scaleout"
    whole_nodes: bool = False
    scheduler: Scheduler = Field(default="hybrid", description="mixed mode's scheduler: hybrid (vLLM V1, SGLang, "
                                 "TensorRT-LLM) or prefill_first (vLLM V0)")
    dps: list[Literal[2, 4, 8, 16, 32, 64]] = Field(
        default=list(DPS), max_length=6, description="mixture-of-experts models: attention data-parallel degrees to "
        "try (tp 1, ep = dp); empty: none")
    spec: Speculation | None = Field(default=None, description="speculative decoding to try on every pool that "
                                     "decodes, beside the same pool without it")
    cps: list[Literal[2, 4, 8, 16]] = Field(
        default=list(CPS), max_length=4, description="context-parallel degrees to try when the mean prompt is at "
        "least 32,768 tokens (at the widest tp); empty: none")
    calibration: Efficiency | None = Field(default=None, description="efficiencies replacing every candidate GPU's "
                                           "(from pdplan validate or POST /v1/calibrate)")
    engine: EngineProfileId = Field(default="generic", description="engine profile whose efficiencies to use "
                                    "(GET /v1/engines; generic: the GPU entries' own); not with a calibration")
    emit: Engine | None = Field(default=None, description="also return the best deployment as launch commands for "
                                "this engine (vllm, sglang, trtllm or dynamo), or as Kubernetes manifests of vLLM (k8s)")
    model_path: str | None = Field(default=None, max_length=512, description="with emit: what the engine loads (a "
                                   "Hugging Face repo id or a local folder); default the model's hf_repo")


class PlanResponse(BaseModel):
    plan: Plan
    explanation: str
    launch: Launch | None = Field(default=None, description="with emit: the best deployment's engine commands")


def run_plan(req: PlanRequest) -> PlanResponse:
    p = plan(resolve_model(req.model), workload=req.workload, slo=req.slo,
             gpus=list(req.gpus) if req.gpus is not None else None, modes=list(req.modes) if req.modes else None,
             objective=req.objective, tps=tuple(req.tps), chunk_sizes=tuple(req.chunk_sizes),
             weight_dtype=req.weight_dtype, kv_dtype=req.kv_dtype, kv_link=req.kv_link, whole_nodes=req.whole_nodes,
             scheduler=req.scheduler, dps=tuple(req.dps), cps=tuple(req.cps), spec=req.spec,
             calibration=req.calibration, engine=req.engine)
    launch = None
    if req.emit is not None and p.best is not None:
        m = resolve_model(req.model)
        launch = to_launch(m, p.best.deployment, req.emit, model_path=req.model_path,
                           max_model_len=workload_max_model_len(m, p.workload))
    return PlanResponse(plan=p, explanation=p.explain(), launch=launch)


class EvaluateRequest(_Request):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra={
        "examples": [{"model": "llama-3.1-70b",
                      "deployment": {"mode": "disaggregated",
                                     "prefill": {"gpu": "h100-sxm", "tp": 2, "instances": 3, "weight_dtype": "fp8"},
                                     "decode": {"gpu": "h20", "tp": 4, "instances": 2, "weight_dtype": "fp8"}},
                      "workload": {"rate": 4.0, "isl": 4000, "osl": 500},
                      "slo": {"ttft_s": 2.0, "tpot_s": 0.05}}]})

    model: ModelRef
    deployment: Deployment
    workload: Workload
    slo: SLO | None = None
    gpus: list[GPUSpec] = Field(default_factory=list, max_length=2, description="inline specs for custom pool GPU ids")
    calibration: Efficiency | None = Field(default=None, description="efficiencies replacing every pool GPU's "
                                           "(from pdplan validate or POST /v1/calibrate)")
    engine: EngineProfileId = Field(default="generic", description="engine profile whose efficiencies to use "
                                    "(GET /v1/engines; generic: the GPU entries' own); not with a calibration")


def run_evaluate(req: EvaluateRequest) -> Evaluation:
    """``evaluate`` checks the context window and the pools' GPU ids itself (404 naming the closest)."""
    return evaluate(resolve_model(req.model), req.deployment, req.workload, req.slo, gpus=req.gpus,
                    calibration=req.calibration, engine=req.engine)


# ------------------------------------------------------------------------------------------ schedule

class ScheduleRequest(_Request):
    """A day of traffic windows planned on fixed GPU types (``pdplan schedule``, ``pc.plan_schedule``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra={
        "examples": [{"model": "llama-3.1-8b", "gpus": ["h100-sxm"], "slo": {"ttft_s": 2, "tpot_s": 0.05},
                      "profile": [{"label": "day", "duration_s": 43200, "workload": {"rate": 10, "isl": 2000, "osl": 300}},
                                  {"label": "night", "duration_s": 43200, "workload": {"rate": 0.5, "isl": 2000, "osl": 300}}]}]})

    model: ModelRef
    profile: list[Window] = Field(min_length=1, max_length=MAX_WINDOWS)
    slo: SLO
    gpus: list[GPURef] = Field(min_length=1, max_length=MAX_GPU_TYPES, description="the GPU types, fixed for the day")
    weight_dtype: WeightDtype = "bf16"
    kv_dtype: KVDtype = "bf16"
    scheduler: Scheduler = "hybrid"


def run_schedule(req: ScheduleRequest) -> Schedule:
    return plan_schedule(resolve_model(req.model), req.profile, req.slo, gpus=list(req.gpus),
                         weight_dtype=req.weight_dtype, kv_dtype=req.kv_dtype, scheduler=req.scheduler)


# ------------------------------------------------------------------------------------------ trace

class TraceRequest(_Request):
    """A request trace, inline: its traffic statistics and the workload it gives (``pdplan trace``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra={
        "examples": [{"name": "requests.csv", "content": "timestamp_s,isl,osl\n0.0,1000,100\n0.4,2000,50\n1.3,800,200\n"}]})

    name: str = Field(default="trace", min_length=1, max_length=200, description="what error messages cite")
    content: str = Field(min_length=1, max_length=MAX_BENCH_FILE_BYTES, description="the trace's text: Azure CSV, "
                         "Mooncake JSONL, BurstGPT CSV or timestamp_s,isl,osl CSV")
    format: Literal["auto", "azure", "mooncake", "burstgpt", "csv"] = "auto"
    window_s: tuple[float, float] | None = Field(default=None, description="(start, end) seconds after the first "
                                                 "arrival: only the requests arriving in it")
    cache_tokens: int | None = Field(default=None, ge=512, le=10**12, description="prefix cache size for the hit "
                                     "ratio (traces with block hashes); default unbounded")
    rate_scale: float = Field(default=1.0, gt=0, le=1e4, description="the workload's rate is the trace's times this")


class TraceResponse(BaseModel):
    stats: TraceStats
    workload: Workload = Field(description="for plan and evaluate: the trace's rate (scaled), length samples, "
                               "burstiness (arrival_cv) and prefix hits")


def run_trace(req: TraceRequest) -> TraceResponse:
    from .traces import parse_trace, workload_of

    try:
        trace = parse_trace(req.content, req.name, req.format, req.window_s)
    except InputError as e:  # the REST field is window_s
        raise InputError("window_s" if e.field == "window" else e.field, e.reason) from None
    w, st = workload_of(trace, req.cache_tokens, req.rate_scale)
    return TraceResponse(stats=st, workload=w)


# ------------------------------------------------------------------------------------------ calibrate

class BenchFile(_Request):
    """One benchmark result file, inline."""

    name: str = Field(min_length=1, max_length=200, description="the file's name (error messages cite it)")
    content: str = Field(min_length=1, max_length=MAX_BENCH_FILE_BYTES, description="its text: vLLM bench serve JSON/JSONL, "
                         "SGLang bench_serving JSONL, a genai-perf/AIPerf profile export or a trtllm-bench report")


class CalibrateRequest(_Request):
    """Fit a GPU's efficiencies to serving benchmarks of one instance (``pdplan calibrate``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra={
        "examples": [{"model": "llama-3.1-8b", "gpu": "h100-sxm", "tp": 1, "files": [
            {"name": "run.json", "content": "{\"num_prompts\": 200, \"request_rate\": 2.0, \"max_concurrency\": null, "
             "\"completed\": 200, \"total_input_tokens\": 204800, \"total_output_tokens\": 25600, "
             "\"request_throughput\": 2.0, \"median_ttft_ms\": 80.0, \"median_tpot_ms\": 9.0}"}]}]})

    model: ModelRef
    gpu: GPURef
    tp: int = Field(default=1, ge=1, le=MAX_PARALLEL)
    weight_dtype: WeightDtype = "bf16"
    kv_dtype: KVDtype = "bf16"
    scheduler: Scheduler = "hybrid"
    max_batched_tokens: int = Field(default=8192, ge=64, le=1_048_576, description="the engine's token budget per step")
    chunk_tokens: int | None = Field(default=None, ge=64, le=1_048_576, description="chunked prefill's budget, if "
                                     "the engine ran Sarathi-style chunks (then the fit uses the chunked mode)")
    files: list[BenchFile] = Field(min_length=1, max_length=16)


class CalibrateResponse(BaseModel):
    fit: CalibrationFit
    calibration_yaml: str = Field(description="the profile as a calibration YAML (pdplan --calibration FILE)")


def run_calibrate(req: CalibrateRequest) -> CalibrateResponse:
    from .benchfiles import MAX_BENCH_POINTS, parse_benchmark_text
    from .calibrate import calibrate, calibration_yaml

    runs = [r for f in req.files for r in parse_benchmark_text(f.content, f.name)]
    if len(runs) > MAX_BENCH_POINTS:
        raise InputError("files", f"{len(runs)} benchmark runs; at most {MAX_BENCH_POINTS} per calibration")
    fit = calibrate(resolve_model(req.model), resolve_gpu(req.gpu), runs, tp=req.tp, weight_dtype=req.weight_dtype,
                    kv_dtype=req.kv_dtype, scheduler=req.scheduler, max_batched_tokens=req.max_batched_tokens,
                    chunk_tokens=req.chunk_tokens)
    return CalibrateResponse(fit=fit, calibration_yaml=calibration_yaml(fit))


# ------------------------------------------------------------------------------------------ sweep

class SweepRequest(_Request):
    """One input varied over a list of values; the rest fixed by ``estimate`` or ``plan``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, json_schema_extra={
        "examples": [{"target": "estimate", "vary": "batch", "values": [1, 2, 4, 8, 16, 32, 64],
                      "estimate": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "isl": 2000, "osl": 200}}]})

    target: Literal["estimate", "plan"]
    vary: str = Field(description=f"estimate: one of {', '.join(ESTIMATE_SWEEPABLE)}; "
                                  f"plan: one of {', '.join(PLAN_SWEEPABLE)}")
    values: list[float] = Field(min_length=1, max_length=MAX_SWEEP_POINTS)
    estimate: EstimateRequest | None = None
    plan: PlanRequest | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SweepRequest:
        allowed = ESTIMATE_SWEEPABLE if self.target == "estimate" else PLAN_SWEEPABLE
        if self.vary not in allowed:
            raise ValueError(f"vary: {self.vary!r} cannot be swept for target {self.target}; choose one of "
                             f"{', '.join(allowed)}")
        if getattr(self, self.target) is None:
            raise ValueError(f"{self.target}: target {self.target} needs the base '{self.target}' request")
        if self.target == "plan" and len(self.values) > MAX_PLAN_SWEEP_POINTS:
            raise ValueError(f"values: a plan sweep takes at most {MAX_PLAN_SWEEP_POINTS} values")
        return self


class SweepResponse(BaseModel):
    target: str
    vary: str
    values: list[float]
    series: dict[str, list[float | None]] = Field(description="one series per output, aligned with values")
    labels: list[str | None] = Field(description="plan: the best deployment per value; estimate: the bound")


def _with(req: BaseModel, path: tuple[str, ...], value: Any, where: str) -> Any:
    """``req`` with the field at ``path`` set to ``value``, validated again from that field up: each model on the
    path is rebuilt from its validated fields (model instances pass through pydantic as they are), so the
    varied value and every check that involves it run, but 20,000 length samples are not re-read per sweep point
    (a dump and a full validation held the GIL ~80 ms a point, stalling the event loop's answers)."""
    def rebuilt(model: BaseModel, keys: tuple[str, ...]) -> BaseModel:
        fields = {k: getattr(model, k) for k in type(model).model_fields}
        fields[keys[0]] = value if len(keys) == 1 else rebuilt(getattr(model, keys[0]), keys[1:])
        return type(model).model_validate(fields)

    try:
        return rebuilt(req, path)
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"{where}: {first['msg']}") from None


def _number(value: float, integer: bool, where: str) -> float | int:
    if integer:
        if value != int(value):
            raise ValueError(f"{where}: {value:g} must be a whole number for this input")
        return int(value)
    return value


def run_sweep(req: SweepRequest) -> SweepResponse:
    series: dict[str, list[float | None]] = {}
    labels: list[str | None] = []
    for i, value in enumerate(req.values):
        where = f"values.{i}"
        if req.target == "estimate":
            assert req.estimate is not None
            v = _number(value, req.vary in ("isl", "osl", "batch", "tp", "pp"), where)
            e = run_estimate(_with(req.estimate, (req.vary,), v, where).model_copy(update={"rows": False})).estimate
            point = {"ttft_s": e.ttft_s, "tpot_s": e.tpot_s, "e2e_s": e.e2e_s, "output_tokens_per_s": e.output_tokens_per_s,
                     "kv_cache_bytes": e.kv_cache_bytes, "max_batch": float(e.max_batch), "fits": float(e.fits)}
            labels.append(f"prefill {e.prefill_bound}, decode {e.decode_bound}" if e.fits else e.reason)
        else:
            assert req.plan is not None
            path = ("slo", req.vary) if req.vary in ("ttft_s", "tpot_s") else ("workload", req.vary)
            v = _number(value, False, where)
            p = run_plan(_with(req.plan, path, v, where)).plan
            b = p.best
            point = {"num_gpus": float(b.num_gpus) if b else None, "cost_per_hour": b.cost_per_hour if b else None,
                     "ttft_p_s": b.ttft_p_s if b else None, "tpot_p_s": b.tpot_p_s if b else None,
                     "cost_per_million_tokens": b.cost_per_million_tokens if b else None}
            labels.append(_label(p))
        for k, x in point.items():
            series.setdefault(k, []).append(x)
    return SweepResponse(target=req.target, vary=req.vary, values=list(req.values), series=series, labels=labels)


def _label(p: Plan) -> str | None:
    if p.best is None:
        return None
    d = p.best.deployment
    return f"{d.mode}: " + " + ".join(f"{x.instances}x {x.gpu} tp{x.tp}" for x in d.pools)
