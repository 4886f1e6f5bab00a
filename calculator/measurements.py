"""Published measurements (hardware_db/data/measurements.yaml) and pdplan's prediction of each.

Only vendor-table records with a fixed configuration are comparable to a closed-form estimate:
offline max-throughput, static-batch throughput and batch-1 first-token latency. Paper-level
"capacity gain" records compare whole systems and are left to the serving model's tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from hardware_db.loader import DATA_DIR, load_gpu, load_model
from hardware_db.schema import GPUSpec

from .phases import Setup, step_groups, step_time_s
from .throughput import offline_throughput

MEASUREMENTS_FILE = DATA_DIR / "measurements.yaml"

_MODELS = (("Llama-3.1-8B", "llama-3.1-8b"), ("Llama-3.3-70B", "llama-3.3-70b"), ("Llama-3.1-405B", "llama-3.1-405b"),
           ("Llama-2-70B", "llama-2-70b"), ("DeepSeek-R1", "deepseek-v3"))
_GPUS = (("GB200", "gb200"), ("B200", "b200"), ("H200", "h200-sxm"), ("H100", "h100-sxm"), ("A100", "a100-sxm-80gb"))
DEP_RANK_MAX_BATCH = {"h200-sxm": 128, "b200": 384, "gb200": 384}
"""Sequences per attention-DP rank in TensorRT-LLM's DeepSeek-R1 max-throughput recipes (trtllm-bench
``--max_batch_size`` with ``enable_attention_dp``: 128 on H200, 384 on B200; GB200 taken as B200):
NVIDIA/TensorRT-LLM docs/source/blogs/Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md. The perf-overview
rows these predict (docs/source/developer-guide/perf-overview.md@03e27c7d) set no batch: trtllm-bench chose it
(its ``calc_engine_setting`` from the KV memory), with ``attention_dp_config.enable_balance`` (context requests
batched across the ranks, so the ranks prefill in the same steps, as ``offline_throughput`` takes them). The
recipes' caps stand in for that choice: which cap that heuristic gives depends on the trtllm-bench build
(before TensorRT-LLM PRs 13498 and 16707 it sized MLA's KV cache with the multi-head formula and the whole
instance's memory: 384 a rank for the H200 1000/1000 row, 64 for 1024/8192; after them 896 and 192), and
the page does not name its build (README, "Error of the bundled defaults")."""

_METRICS = {"max_output_throughput_total", "max_output_throughput_per_gpu", "output_throughput_per_gpu",
            "first_token_latency"}


@dataclass(frozen=True)
class Measurement:
    id: str
    source: str
    model: str
    gpu: str
    tp: int
    ep: int
    isl: int
    osl: int
    weight_dtype: str
    kv_dtype: str
    metric: str
    value: float
    static_batch: int | None
    dp: int = 1
    """Attention data-parallel ranks (TensorRT-LLM's DEP rows: their tp column is the attention-DP size)."""
    dp_balance: bool = False
    """The attention-DP ranks took their prompts in the same steps: the perf-overview's DeepSeek-R1 options set
    ``attention_dp_config.enable_balance`` (``offline_throughput``)."""

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp


def _match(text: str, table: tuple[tuple[str, str], ...]) -> str | None:
    return next((ours for theirs, ours in table if theirs in text), None)


def _dtype(text: str) -> str:
    t = str(text).lower()
    for key, ours in (("fp4", "fp4"), ("fp8", "fp8"), ("fp16", "fp16"), ("bf16", "bf16")):
        if t.startswith(key) or t.startswith("nv" + key):
            return ours
    return "bf16"  # 'model default (bf16/fp16 unless fp8 KV enabled)' / 'not stated'


def _kv_dtype(stated: str, model: str) -> str:
    """The record's KV format; where it says 'model default' / 'not stated', a ModelOpt checkpoint
    (``nvidia/...-FP8`` / ``-FP4``) carries ``kv_cache_quant_algo: FP8`` in its hf_quant_config.json,
    which TensorRT-LLM honours, so its KV cache is fp8."""
    explicit = stated.lower().startswith(("fp8", "fp16", "bf16"))
    if not explicit and "nvidia/" in model:
        return "fp8"
    return _dtype(stated)


def load_measurements(path: str | Path = MEASUREMENTS_FILE) -> list[Measurement]:
    records = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    out = []
    for r in records:
        model, gpu = _match(str(r["model"]), _MODELS), _match(str(r["gpu"]), _GPUS)
        if r.get("source_kind") != "vendor_table" or r["metric"] not in _METRICS or not model or not gpu:
            continue
        batch = re.search(r"static batch (\d+)", str(r["batch_or_concurrency_or_rate"]))
        dep = re.search(r"-dep\d+-", r["id"]) is not None  # attention-DP + EP: the tp column is the DP size
        out.append(Measurement(
            id=r["id"], source=r["source"], model=model, gpu=gpu, tp=1 if dep else int(r["tp"]),
            dp=int(r["tp"]) if dep else 1, ep=int(r["ep"] or 1),
            # the perf-overview's DeepSeek-R1 options (same commit) balance the ranks' prompts
            dp_balance=dep and "developer-guide/perf-overview.md" in str(r["source"]),
            isl=int(r["isl"]), osl=int(r["osl"]), weight_dtype=_dtype(r["weights_dtype"]),
            kv_dtype=_kv_dtype(str(r["kv_dtype"]), str(r["model"])),
            metric=r["metric"], value=float(r["value"]), static_batch=int(batch.group(1)) if batch else None,
        ))
    return out


def predict(meas: Measurement, gpu: GPUSpec | None = None) -> float:
    """pdplan's figure for a measurement, in the measurement's own unit."""
    g = gpu or load_gpu(meas.gpu)
    setup = Setup(load_model(meas.model), g, tp=meas.tp, ep=meas.ep, weight_dtype=meas.weight_dtype,
                  kv_dtype=meas.kv_dtype, dp=meas.dp)
    if meas.metric == "first_token_latency":
        return 1e3 * float(step_time_s(step_groups(setup, S=meas.isl, P=0, b=1, phase="prefill"), setup))
    cap = DEP_RANK_MAX_BATCH.get(meas.gpu, 2048) * meas.dp if meas.dp > 1 else 2048
    total = offline_throughput(setup, meas.isl, meas.osl, batch=meas.static_batch, engine_max_batch=cap,
                               dp_balance=meas.dp_balance)
    return total if meas.metric == "max_output_throughput_total" else total / meas.num_gpus
