"""pdplan calculator: closed-form LLM serving estimates over frozen model and GPU specs."""

from hardware_db import (
    Efficiency,
    GPUSpec,
    ModelSpec,
    list_gpus,
    list_models,
    load_gpu,
    load_model,
)

from .budget import deadline
from .errors import (
    Cancelled,
    DeadlineExceeded,
    HardwareDBError,
    InputError,
    PdplanError,
    UnknownIdError,
    UnstableError,
)
from .estimate import Estimate, MemoryBreakdown, OpRow, estimate
from .formulas import FORMULAS, Formula
from .hf_config import model_from_hf_config
from .kv_cache import kv_bytes_per_token, kv_cache_bytes

__all__ = [
    "Cancelled", "DeadlineExceeded", "InputError", "PdplanError", "UnstableError", "deadline",
    "FORMULAS", "Efficiency", "Estimate", "Formula", "GPUSpec", "HardwareDBError", "MemoryBreakdown", "ModelSpec",
    "OpRow", "UnknownIdError", "estimate", "kv_bytes_per_token", "kv_cache_bytes", "list_gpus", "list_models",
    "load_gpu", "load_model", "model_from_hf_config",
]

from .optimizer import Candidate, Plan, plan  # noqa: E402
from .serving import SLO, Deployment, Evaluation, Length, Pool, Workload, evaluate  # noqa: E402

__all__ += ["Candidate", "Deployment", "Evaluation", "Length", "Plan", "Pool", "SLO", "Workload", "evaluate", "plan"]
