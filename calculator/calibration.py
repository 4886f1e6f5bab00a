"""Calibration profiles: fitted efficiencies that replace a GPU entry's defaults.

A profile is YAML with an ``efficiency`` mapping (the ``Efficiency`` fields) and free-form
provenance (``device``, ``date``, ``fitted_on``). ``pdplan validate`` writes one; ``estimate`` and
``load_gpu`` users pass it as ``calibration=``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hardware_db.schema import Efficiency, GPUSpec


def load_calibration(path: str | os.PathLike[str]) -> Efficiency:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"calibration: cannot read {p} ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"calibration: {p} is not valid YAML: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("efficiency"), dict):
        raise ValueError(f"calibration: {p} needs an 'efficiency' mapping")
    try:
        return Efficiency.model_validate(raw["efficiency"])
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"calibration: {p}: efficiency.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def apply_calibration(gpu: GPUSpec, calibration: Efficiency | dict[str, Any] | str | os.PathLike[str]) -> GPUSpec:
    """The GPU with its efficiencies replaced by a profile (an Efficiency, a mapping or a YAML path)."""
    if isinstance(calibration, Efficiency):
        eff = calibration
    elif isinstance(calibration, dict):
        try:
            eff = Efficiency.model_validate(calibration)
        except ValidationError as e:
            first = e.errors()[0]
            raise ValueError(f"calibration.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    else:
        eff = load_calibration(calibration)
    return gpu.model_copy(update={"efficiency": eff})


def save_calibration(path: str | os.PathLike[str], efficiency: Efficiency, **provenance: Any) -> None:
    body = {**provenance, "efficiency": efficiency.model_dump(exclude_none=True)}
    Path(path).write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
