"""pdplan calculator: closed-form LLM serving estimates over frozen model and GPU specs.

The public names are imported on first use (PEP 562), so that ``import calculator.cli`` (and
``pdplan --help``) does not pay for pydantic, numpy and the formulas; ``calculator.estimate`` etc.
behave exactly as if imported eagerly.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

_SOURCES: dict[str, str] = {
    **dict.fromkeys(("Efficiency", "EngineProfile", "GPUSpec", "ModelSpec", "list_engines", "list_gpus", "list_models",
                     "load_engine", "load_gpu", "load_model"), "hardware_db"),
    **dict.fromkeys(("PhaseError", "StepLatency", "load_step_latencies", "profile_errors"), ".engines"),
    "deadline": ".budget",
    **dict.fromkeys(("BenchPoint", "read_benchmark_files"), ".benchfiles"),
    **dict.fromkeys(("CalibrationFit", "calibrate"), ".calibrate"),
    **dict.fromkeys(("AmbiguousIdError", "Cancelled", "DeadlineExceeded", "HardwareDBError", "InputError", "PdplanError",
                     "UnknownIdError", "UnstableError"), ".errors"),
    **dict.fromkeys(("Estimate", "MemoryBreakdown", "OpRow", "estimate"), ".estimate"),
    **dict.fromkeys(("Launch", "to_launch"), ".launch"),
    **dict.fromkeys(("BatchRow", "plan_many"), ".fleet"),
    **dict.fromkeys(("Schedule", "Window", "plan_schedule"), ".schedule"),
    **dict.fromkeys(("FORMULAS", "Formula"), ".formulas"),
    "model_from_hf_config": ".hf_config",
    **dict.fromkeys(("kv_bytes_per_token", "kv_cache_bytes"), ".kv_cache"),
    **dict.fromkeys(("active_param_count", "param_count"), ".params"),
    "Speculation": ".speculation",
    **dict.fromkeys(("Candidate", "Plan", "plan"), ".optimizer"),
    **dict.fromkeys(("SLO", "ClosedLoop", "Deployment", "Evaluation", "Length", "Pool", "Workload", "closed_loop",
                     "evaluate"), ".serving"),
    **dict.fromkeys(("Simulation", "simulate"), ".serving.simulate"),
}
"""Public name -> the module it comes from."""

__all__ = [
    "FORMULAS", "SLO", "AmbiguousIdError", "BatchRow", "BenchPoint", "CalibrationFit", "Cancelled", "Candidate", "ClosedLoop", "DeadlineExceeded", "Deployment", "Efficiency", "EngineProfile", "Estimate",
    "Evaluation", "Formula", "GPUSpec", "HardwareDBError", "InputError", "Launch", "Length", "MemoryBreakdown",
    "ModelSpec", "OpRow", "PdplanError", "Plan", "Pool", "Schedule", "Simulation", "Speculation", "UnknownIdError", "UnstableError",
    "Workload", "active_param_count", "calibrate", "closed_loop", "deadline", "estimate", "evaluate", "kv_bytes_per_token", "kv_cache_bytes", "list_engines", "list_gpus",
    "list_models", "load_engine", "load_gpu", "load_model", "model_from_hf_config", "param_count", "plan", "read_benchmark_files",
    "plan_many", "plan_schedule", "simulate", "to_launch", "Window", "PhaseError", "StepLatency",
    "load_step_latencies", "profile_errors",
]  # the keys of _SOURCES (a test checks)


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The package module: importing the submodule ``calculator.estimate`` must not rebind the
    name ``calculator.estimate`` (the function) to the module, as the import system would."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _SOURCES.get(name) == f".{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from hardware_db import (
        Efficiency,
        EngineProfile,
        GPUSpec,
        ModelSpec,
        list_engines,
        list_gpus,
        list_models,
        load_engine,
        load_gpu,
        load_model,
    )

    from .benchfiles import BenchPoint, read_benchmark_files
    from .budget import deadline
    from .calibrate import CalibrationFit, calibrate
    from .engines import PhaseError, StepLatency, load_step_latencies, profile_errors
    from .errors import (
        AmbiguousIdError,
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
    from .fleet import BatchRow, plan_many
    from .launch import Launch, to_launch
    from .schedule import Schedule, Window, plan_schedule
    from .optimizer import Candidate, Plan, plan
    from .params import active_param_count, param_count
    from .serving import SLO, ClosedLoop, Deployment, Evaluation, Length, Pool, Workload, closed_loop, evaluate
    from .speculation import Speculation
