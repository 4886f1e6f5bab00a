"""Calibration profiles: fitted efficiencies that replace a GPU entry's defaults.

A profile is YAML with an ``efficiency`` mapping (the ``Efficiency`` fields) and free-form
provenance (``device``, ``date``, ``fitted_on``). ``pdplan validate`` writes one; ``estimate`` and
``load_gpu`` users pass it as ``calibration=``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hardware_db.schema import Efficiency, GPUSpec

from .arguments import as_model, from_validation_error
from .errors import InputError
from .files import read_text_file, yaml_document
from .limits import MAX_CONFIG_BYTES


def load_calibration(path: str | os.PathLike[str]) -> Efficiency:
    """The ``efficiency`` mapping of a calibration YAML file (``InputError`` on ``calibration`` if not)."""
    p = Path(path)
    text = read_text_file(p, "calibration", MAX_CONFIG_BYTES)
    raw = yaml_document(text, str(p), "calibration")
    if not isinstance(raw, dict) or not isinstance(raw.get("efficiency"), dict):
        raise InputError("calibration", f"{p} needs an 'efficiency' mapping")
    try:
        return Efficiency.model_validate(raw["efficiency"])
    except ValidationError as e:
        err = from_validation_error(e, "efficiency")
        raise InputError("calibration", f"{p}: {err}") from None


def apply_calibration(gpu: GPUSpec, calibration: Efficiency | Mapping[str, Any] | str | os.PathLike[str]) -> GPUSpec:
    """The GPU with its efficiencies replaced by a profile (an Efficiency, a mapping or a YAML path)."""
    if isinstance(calibration, Efficiency):
        eff = calibration
    elif isinstance(calibration, Mapping):
        eff = as_model("calibration", calibration, Efficiency)
    elif isinstance(calibration, (str, os.PathLike)):
        eff = load_calibration(calibration)
    else:
        raise InputError("calibration", f"give an Efficiency, a mapping of its fields or a YAML path, got "
                                        f"{type(calibration).__name__}")
    if "block_scaled_memory" not in eff.model_fields_set:
        # a property of the GPU's tensor cores that no calibration measures unless it says so: keep the GPU's
        eff = eff.model_copy(update={"block_scaled_memory": gpu.efficiency.block_scaled_memory})
    return gpu.model_copy(update={"efficiency": eff})


def efficiency_body(efficiency: Efficiency) -> dict[str, Any]:
    """A calibration's ``efficiency`` mapping as written to YAML: the block-scaled limit only where the
    calibration set it (otherwise the GPU it is applied to keeps its own, ``apply_calibration``)."""
    unset = set() if "block_scaled_memory" in efficiency.model_fields_set else {"block_scaled_memory"}
    return efficiency.model_dump(exclude_none=True, exclude=unset)


def save_calibration(path: str | os.PathLike[str], efficiency: Efficiency, **provenance: Any) -> None:
    body = {**provenance, "efficiency": efficiency_body(efficiency)}
    Path(path).write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
