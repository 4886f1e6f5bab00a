"""Numeric formats: bytes per element and which peak FLOP/s rate a format runs at."""

from __future__ import annotations

from typing import Literal, get_args

from hardware_db.schema import KVDtype, WeightDtype

from .errors import InputError

MathRate = Literal["bf16", "fp8", "int8", "fp4", "fp32"]

WEIGHT_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5,
                                  "fp32": 4.0}
KV_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp32": 4.0}
ACTIVATION_BYTES = 2.0
"""Activations stay in 16-bit in every quantised scheme (fp8/fp4 GEMMs quantise on the fly); an fp32
model (a CPU without bf16 units) keeps everything in 4 bytes, see ``wide_bytes``."""

EMBEDDING_BYTES = 2.0
"""Embedding and LM head stay 16-bit under weight quantisation (vLLM, TensorRT-LLM, ModelOpt default)."""

# Weight format -> tensor-core rate of the GEMMs. int4 is weight-only (w4a16): dequantised to bf16.
GEMM_RATE: dict[str, MathRate] = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "int8", "int4": "bf16", "fp4": "fp4",
                                  "fp32": "fp32"}
ATTENTION_RATE: MathRate = "bf16"
"""Attention matmuls run in 16-bit (flash-attention); an fp8 KV cache is dequantised on load."""


def wide_bytes(weight_dtype: str, sixteen_bit: float) -> float:
    """Bytes of an activation or embedding element: 16-bit, or 4 in an fp32 model."""
    return 4.0 if weight_dtype == "fp32" else sixteen_bit


def attention_rate(weight_dtype: str) -> MathRate:
    """The math rate of the attention matmuls: 16-bit, or fp32 in an fp32 model."""
    return "fp32" if weight_dtype == "fp32" else ATTENTION_RATE

WEIGHT_DTYPES: tuple[str, ...] = get_args(WeightDtype)
KV_DTYPES: tuple[str, ...] = get_args(KVDtype)


def weight_bytes(dtype: str) -> float:
    if not isinstance(dtype, str) or dtype not in WEIGHT_BYTES:
        raise InputError("weight_dtype", f"unknown {dtype!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
    return WEIGHT_BYTES[dtype]


def kv_bytes(dtype: str) -> float:
    if not isinstance(dtype, str) or dtype not in KV_BYTES:
        raise InputError("kv_dtype", f"unknown {dtype!r}; choose one of {', '.join(KV_DTYPES)}")
    return KV_BYTES[dtype]
