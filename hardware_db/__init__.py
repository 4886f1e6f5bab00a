"""pdplan's hardware and model database: YAML data, its pydantic schema and the loader."""

from .errors import AmbiguousIdError, HardwareDBError, InputError, PdplanError, UnknownIdError
from .loader import (
    ENV_VAR,
    database,
    list_engines,
    list_gpus,
    list_models,
    load_engine,
    load_gpu,
    load_model,
    validate_file,
)
from .schema import Efficiency, EngineProfile, GPUSpec, MLASpec, ModelSpec, MoESpec, PeakTflops

__all__ = [
    "ENV_VAR",
    "AmbiguousIdError",
    "Efficiency",
    "EngineProfile",
    "GPUSpec",
    "HardwareDBError",
    "InputError",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "PdplanError",
    "PeakTflops",
    "UnknownIdError",
    "database",
    "list_engines",
    "list_gpus",
    "list_models",
    "load_engine",
    "load_gpu",
    "load_model",
    "validate_file",
]
