"""The bundled torch microbenchmark: measure a real transformer on this device and check the model against it.

    python -m calculator.microbench --quick --out DIR      # or: pdplan validate --quick --out DIR

It measures the device's matmul FLOP/s and copy bandwidth (a GPUSpec of the device), runs
random-weight Llama-architecture decoders (and one with sliding-window layers) with transformers,
times prefill and decode over a grid, checks the KV bytes each cache holds against
``calculator.kv_cache_bytes``, fits the efficiencies on half the grid and reports the error of
``calculator.estimate`` on the other half. torch and transformers are imported only when it runs
(``pip install 'pdplan[bench]'``); without them ``run`` raises ``TorchMissingError``.
"""

from __future__ import annotations

from .cli import main
from .fit import Design, design, fit_efficiency
from .models import BENCH_MODELS, GRIDS, Grid, hf_config
from .report import write_calibration, write_hardware_file, write_outputs
from .results import (
    Ceilings,
    FitResult,
    KVCheck,
    MatmulSample,
    Measurement,
    ParamCheck,
    PhaseError,
    Point,
    Stalls,
    ValidationReport,
)
from .runner import INSTALL_HINT, TorchMissingError, analyse, reanalyse, require_torch, run

__all__ = [
    "BENCH_MODELS", "GRIDS", "INSTALL_HINT", "Ceilings", "Design", "FitResult", "Grid", "KVCheck", "MatmulSample",
    "Measurement", "ParamCheck", "PhaseError", "Point", "Stalls", "TorchMissingError", "ValidationReport", "analyse",
    "design", "fit_efficiency", "hf_config", "main", "reanalyse", "require_torch", "run", "write_calibration",
    "write_hardware_file", "write_outputs",
]
