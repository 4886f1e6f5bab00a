"""pdplan's hardware and model database: YAML data, its pydantic schema and the loader."""

from .loader import (
    ENV_VAR,
    HardwareDBError,
    UnknownIdError,
    database,
    list_gpus,
    list_models,
    load_gpu,
    load_model,
    validate_file,
)
from .schema import Efficiency, GPUSpec, MLASpec, ModelSpec, MoESpec, PeakTflops

__all__ = [
    "ENV_VAR", "Efficiency", "GPUSpec", "HardwareDBError", "MLASpec", "ModelSpec", "MoESpec", "PeakTflops",
    "UnknownIdError", "database", "list_gpus", "list_models", "load_gpu", "load_model", "validate_file",
]
