"""Pydantic schema of the hardware database: GPU and model records, and the YAML files that hold them.

Records are small frozen models. YAML keeps human units in the key names (``hbm_gb``,
``peak_tflops``); the SI accessors (``hbm_bytes``, ``peak_flops_per_s``) convert once, here.
Derived model quantities (parameter counts, KV bytes) are computed by ``calculator`` from the
sympy formulas (``calculator.params``); this package only describes, and imports nothing of the
calculator.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

WeightDtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp4", "fp32"]
KVDtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp32"]

SCHEMA_VERSION = 1
BlockSide = Annotated[int, Field(strict=True, ge=1, le=65_536)]
"""Rows or columns of weights that share one quantisation scale."""
Alias = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/\-]*$")]
ALIASES_DOC = ("other names that resolve to this id, in any case (Hugging Face repo ids, common names); a name "
               "two entries share is ambiguous, and asking for it lists both")


MEMORY_RUNTIME_RATIO = (0.9, 1.12)
"""Bounds of runtime bytes / datasheet decimal bytes: datasheets name binary capacities in GB (an
80 GB H100 shows 81,559 MiB, 1.07x), and a runtime reserves a little (B300's 288 GB shows 1.00x)."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class PeakTflops(_Record):
    """Dense (no 2:4 sparsity) tensor-core peak of one GPU, in TFLOP/s (TOPS for int8)."""

    bf16: float = Field(ge=1e-4, le=1e6, description="bf16/fp16 dense peak, TFLOP/s (a CPU that emulates bf16: ~0.001)")
    fp8: float | None = Field(default=None, ge=0.01, le=1e6, description="fp8 dense peak, TFLOP/s; null if no fp8 path")
    int8: float | None = Field(default=None, ge=0.01, le=1e6, description="int8 dense peak, TOPS")
    fp4: float | None = Field(default=None, ge=0.01, le=1e6, description="fp4 dense peak, TFLOP/s; null if no native fp4")
    fp32: float | None = Field(default=None, ge=1e-4, le=1e6,
                               description="fp32 matmul peak, TFLOP/s; null if not recorded (a CPU without bf16 units)")


class Efficiency(_Record):
    """Achieved fractions of the datasheet ceilings and fixed latencies (calibration constants).

    Defaults are fitted to published TensorRT-LLM measurements (see ``bench/fit_defaults.py``);
    ``pdplan validate`` fits them to the user's own machine.
    """

    compute: float = Field(default=0.6, ge=0.01, le=1, description="achieved / peak FLOP/s for GEMMs and attention")
    memory: float = Field(default=0.8, ge=0.01, le=1, description="achieved / peak HBM bandwidth")
    link: float = Field(default=0.8, ge=0.01, le=1, description="achieved / peak scale-up and scale-out bandwidth")
    kernel_latency_us: float = Field(default=4.0, ge=0, le=1e6, description="fixed latency per kernel launch, microseconds")
    step_overhead_us: float = Field(default=100.0, ge=0, le=1e7, description="fixed cost per forward step (scheduling, sampling), us")
    decode_attention: float = Field(
        default=1.0, ge=0.01, le=1, description="the decode attention kernel's share of the compute and memory "
        "efficiencies (one new token per sequence reading its cached KV, a paged-attention kernel: it runs at "
        "decode_attention x compute and x memory; 1: as the GEMMs). Prompt and chunk attention (a flash-attention "
        "kernel over many query tokens) runs at the GEMM efficiencies. Fitted by the serving validation where an "
        "engine's decode attention is slower")
    hybrid_attention_kernels: int = Field(default=2, ge=1, le=2, description="attention kernels a hybrid step (decodes "
                                          "and a prompt piece together) runs: 2, a paged decode kernel beside a "
                                          "prefill kernel, each on its own roofline (the decode one at "
                                          "decode_attention's share: TensorRT-LLM, FlashInfer's two wrappers); 1, one "
                                          "variable-length kernel over every sequence's queries at the prompt "
                                          "kernel's efficiencies (vLLM's CPU backend: cpu_attention_with_kv_cache "
                                          "over the whole batch; FlashAttention's varlen kernel)")
    sequence_overhead_us: float = Field(default=0.0, ge=0, le=1e5, description="cost per sequence in a step (the "
                                        "scheduler's and sampler's per-request work, output processing), us; 0 in "
                                        "the bundled defaults, fitted by the serving validation on engines where "
                                        "it shows")
    gemm_half_tokens: float = Field(default=0.0, ge=0, le=1e6, description="tokens in a step at which the linear "
                                    "layers reach half the compute efficiency (``gemm_compute_efficiency``: "
                                    "compute x T / (T + this)); 0: compute at every size (the bundled GPU defaults)")
    gemv_speedup: float = Field(default=1.0, ge=0.1, le=10, description="how many times faster than ``memory`` a "
                                "linear layer of one row (a lone decode, a prompt's LM head) streams its weights "
                                "(``gemm_memory_efficiency``): CPU BLAS runs it as a GEMV that reads the weights "
                                "once, where a GEMM of two or more rows packs them first; fitted by the CPU "
                                "microbenchmark; 1: as any GEMM (the bundled GPU defaults)")
    decode_attention_block_gb_s: float = Field(default=0.0, ge=0, le=1e5, description="KV bandwidth one decode "
                                               "attention thread block streams (one sequence, one KV head), GB/s: "
                                               "a decode step with few sequences x KV heads per GPU reads its cache "
                                               "at most that many times this (``decode_attention_memory_efficiency``"
                                               "); 0: no such limit (the bundled GPU defaults)")
    decode_graph_launch: float = Field(default=1.0, ge=0, le=1, description="share of the per-kernel latency a "
                                       "decode step pays (``launch_latency``): below 1 where the engine replays decode "
                                       "steps from CUDA graphs; 1: every kernel launched on its own")
    block_scaled_memory: float = Field(default=0.0, ge=0, le=1, description="achieved / peak HBM bandwidth of a linear "
                                       "layer over fp8 weights with fine-grained block scales (DeepSeek-V3's 128 x 128; "
                                       "a model's ``weight_block_size``) where the tensor cores cannot apply the scales "
                                       "and the kernel rescales its partial sums on the CUDA cores (Hopper): such GEMMs "
                                       "stream their weights at min(memory, this) "
                                       "(``block_scaled_memory_efficiency``); 0: no limit (Blackwell's tensor cores apply "
                                       "block scales; other GPUs without a published figure, such as Ada and MI300X, "
                                       "are taken at their ``memory``). A calibration that does not set it keeps the "
                                       "GPU entry's value (``pdplan calibrate`` and ``validate`` fit ``memory`` only)")
    collective_latency_us: float = Field(default=8.0, ge=0, le=1e6, description="latency per collective (all-reduce, all-to-all), us")
    request_overhead_us: float = Field(default=0.0, ge=0, le=1e7, description="time a served request spends outside "
                                       "the engine's steps before its first token reaches the client (the HTTP "
                                       "server, chat template and tokenisation, the hand-off to the engine core, "
                                       "detokenising and streaming the first token), us: added to every TTFT "
                                       "(``served_ttft``); 0 in the bundled GPU defaults, which model the engine's "
                                       "steps only, and in profiles fitted on engine-only benchmarks")
    fitted_on: str | None = Field(default=None, description="which measurements the values were fitted to")

    @model_validator(mode="after")
    def _block_scaled_limit(self) -> Efficiency:
        if 0 < self.block_scaled_memory < 0.01:
            raise ValueError(f"block_scaled_memory {self.block_scaled_memory:g}: give 0 (no limit) or a share of "
                             f"the HBM bandwidth of at least 0.01, as for memory")
        return self


class GPUSpec(_Record):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64)
    aliases: tuple[Alias, ...] = Field(default=(), max_length=32, description=ALIASES_DOC)
    name: str
    vendor: str
    architecture: str
    peak_tflops: PeakTflops
    hbm_gb: float = Field(ge=0.01, le=1e5, description="memory capacity as the datasheet names it, GB (read as decimal "
                          "GB, 1e9 bytes, when memory_runtime_mib is not given)")
    memory_runtime_mib: float | None = Field(
        default=None, ge=1, le=1e9, description="total memory as the runtime reports it (nvidia-smi / rocm-smi / "
        "hl-smi / npu-smi total), MiB (2^20 bytes): what every fit check uses; H100 SXM: 81,559")
    memory_type: str = ""
    hbm_bandwidth_tb_s: float = Field(ge=1e-3, le=1e4, description="memory bandwidth, TB/s (1e12 B/s)")
    scaleup_link: str = ""
    scaleup_bandwidth_gb_s: float = Field(ge=0.01, le=1e6, description="scale-up link per GPU per direction, GB/s "
                                          "(full_mesh: all its links together)")
    scaleup_topology: Literal["switch", "full_mesh", "pcie"] = Field(
        default="switch", description="switch: every GPU reaches every other at its full bandwidth (NVSwitch, NVL72); "
        "full_mesh: a direct link to each peer (AMD xGMI, Intel Gaudi RoCE, Huawei HCCS), so a group of k GPUs uses "
        "k - 1 of them; pcie: through the PCIe host bridge or switch")
    scaleup_links: int = Field(default=1, ge=1, le=1024, description="full_mesh: peers each GPU links to directly; "
                               "scaleup_bandwidth_gb_s is split evenly over them")
    scaleup_domain_gpus: int = Field(default=8, ge=1, le=100_000, description="GPUs reachable over the scale-up link (a node)")
    scaleout_bandwidth_gb_s: float = Field(ge=0.01, le=1e6, description="scale-out NIC per GPU per direction, GB/s")
    tdp_w: float = Field(ge=1, le=1e5)
    price_usd_per_hour: float = Field(ge=1e-4, le=1e4, description="price per GPU-hour, USD")
    price_is_assumption: bool = False
    price_note: str = ""
    confidence: Literal["high", "medium", "low"] = "medium"
    efficiency: Efficiency = Efficiency()
    sources: tuple[str, ...] = Field(min_length=1)
    notes: str = ""

    @model_validator(mode="after")
    def _memory_agrees(self) -> GPUSpec:
        if self.memory_runtime_mib is not None:
            ratio = self.memory_runtime_mib * 2**20 / (self.hbm_gb * 1e9)
            if not MEMORY_RUNTIME_RATIO[0] <= ratio <= MEMORY_RUNTIME_RATIO[1]:
                raise ValueError(f"memory_runtime_mib {self.memory_runtime_mib:g} MiB disagrees with hbm_gb "
                                 f"{self.hbm_gb:g} ({ratio:.2f}x); give the runtime's figure for this memory, or drop "
                                 "memory_runtime_mib to use hbm_gb")
        if self.scaleup_topology == "full_mesh" and self.scaleup_links >= self.scaleup_domain_gpus:
            raise ValueError(f"scaleup_links {self.scaleup_links}: a full mesh of {self.scaleup_domain_gpus} GPUs "
                             f"links each to at most {self.scaleup_domain_gpus - 1} peers")
        return self

    # SI accessors -------------------------------------------------------------------------------
    @property
    def hbm_bytes(self) -> float:
        """Memory as the runtime sees it: ``memory_runtime_mib`` MiB, else ``hbm_gb`` decimal GB."""
        if self.memory_runtime_mib is not None:
            return self.memory_runtime_mib * 2**20
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_tb_s * 1e12

    @property
    def scaleup_bytes_per_s(self) -> float:
        return self.scaleup_bandwidth_gb_s * 1e9

    @property
    def scaleout_bytes_per_s(self) -> float:
        return self.scaleout_bandwidth_gb_s * 1e9

    def peak_flops_per_s(self, math: Literal["bf16", "fp8", "int8", "fp4", "fp32"]) -> float:
        """Dense peak for a math precision, FLOP/s. Falls back when the GPU has no such tensor path:
        fp8 and int8 to bf16; fp4 to bf16, since a GPU without FP4 tensor cores (Hopper, MI300X) runs
        fp4 weights weight-only, dequantised to 16-bit math (MXFP4 gpt-oss on Hopper), not at its fp8
        rate; fp32 has no fallback (its rate is not derivable from the tensor-core ones)."""
        chain = {"fp4": ("fp4", "bf16"), "fp8": ("fp8", "bf16"), "int8": ("int8", "bf16"), "bf16": ("bf16",),
                 "fp32": ("fp32",)}
        for name in chain[math]:
            value = getattr(self.peak_tflops, name)
            if value is not None:
                return value * 1e12
        from .errors import InputError

        raise InputError("weight_dtype", f"{self.id} has no fp32 peak in the database (peak_tflops.fp32); "
                                         "fp32 is for measured devices such as pdplan validate's CPU entry")

    def ridge_point_flops_per_byte(self, math: Literal["bf16", "fp8", "int8", "fp4", "fp32"] = "bf16") -> float:
        """Arithmetic intensity above which a kernel is compute-bound on this GPU: peak / bandwidth."""
        return self.peak_flops_per_s(math) / self.hbm_bytes_per_s


class MLASpec(_Record):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)."""

    q_lora_rank: int = Field(ge=0, le=1_000_000, description="0 when queries are projected directly (no q low-rank)")
    kv_lora_rank: int = Field(gt=0, le=1_000_000)
    qk_nope_head_dim: int = Field(gt=0, le=100_000)
    qk_rope_head_dim: int = Field(gt=0, le=100_000)
    v_head_dim: int = Field(gt=0, le=100_000)


class MoESpec(_Record):
    num_experts: int = Field(gt=1, le=100_000, description="routed experts per MoE layer")
    experts_per_token: int = Field(gt=0, le=100_000, description="top-k routed experts per token")
    expert_intermediate_size: int = Field(gt=0, le=10_000_000)
    num_shared_experts: int = Field(default=0, ge=0, le=1_000, description="always-active experts of the same width")
    num_dense_layers: int = Field(default=0, ge=0, le=10_000, description="leading layers with a dense MLP instead of MoE")
    router_bias: bool = Field(default=False, description="router has a bias or a score-correction bias (E params)")
    expert_bias: bool = Field(default=False, description="expert linear layers carry biases (gpt-oss)")

    @model_validator(mode="after")
    def _k_le_e(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token must not exceed num_experts")
        return self


class ModelSpec(_Record):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64)
    aliases: tuple[Alias, ...] = Field(default=(), max_length=32, description=ALIASES_DOC)
    name: str
    family: str = Field(description="Hugging Face model_type")
    hf_repo: str | None = None
    num_layers: int = Field(gt=0, le=10_000)
    hidden_size: int = Field(gt=0, le=1_000_000)
    vocab_size: int = Field(gt=0, le=100_000_000)
    tie_word_embeddings: bool = False
    num_attention_heads: int = Field(gt=0, le=100_000)
    num_kv_heads: int = Field(gt=0, le=100_000)
    head_dim: int = Field(gt=0, le=100_000, description="per-head dimension; not always hidden/heads (Gemma, Qwen3, gpt-oss)")
    mla: MLASpec | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = Field(default=False, description="per-head RMSNorm on q and k (Qwen3, Gemma-3)")
    attention_sinks: bool = Field(default=False, description="one learned logit per head per layer (gpt-oss)")
    sliding_window: int | None = Field(default=None, gt=0, le=1_000_000_000)
    num_sliding_layers: int = Field(default=0, ge=0, le=10_000, description="layers that attend within sliding_window")
    intermediate_size: int = Field(gt=0, le=10_000_000, description="dense MLP width")
    gated_mlp: bool = Field(default=True, description="SwiGLU/GeGLU (3 matrices) rather than a plain 2-matrix MLP")
    mlp_bias: bool = False
    moe: MoESpec | None = None
    parallel_attention: bool = Field(
        default=False, description="attention and MLP read the same input and join the residual together (Falcon, "
        "GPT-J, Cohere): one tensor-parallel all-reduce per layer instead of two")
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norms_per_layer: int = Field(default=2, ge=1, le=4)
    learned_position_embeddings: int = Field(default=0, ge=0, le=100_000_000, description="rows of a learned position table (OPT)")
    max_position_embeddings: int = Field(gt=0, le=1_000_000_000)
    checkpoint_dtype: str = "bf16"
    weight_block_size: tuple[BlockSide, BlockSide] | None = Field(
        default=None, description="the fp8 checkpoint's block-scale tile, rows x columns of weights sharing one scale "
        "(``quantization_config.weight_block_size``: [128, 128] for DeepSeek-V3); None: per-tensor or per-channel "
        "scales. Served at weight_dtype fp8, such weights run block-scaled GEMMs (``Efficiency.block_scaled_memory``)")
    mtp_layers: int = Field(
        default=0, ge=0, le=8, description="multi-token-prediction layers the checkpoint carries (config.json "
        "``num_nextn_predict_layers``: 1 for DeepSeek-V3/R1, 0 for Kimi-K2); speculative decoding of kind mtp needs one")
    published_params_total: float | None = Field(default=None, description="published total parameters")
    published_params_active: float | None = Field(default=None, description="published active parameters (MoE)")
    sources: tuple[str, ...] = Field(min_length=1)
    notes: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.num_attention_heads % self.num_kv_heads != 0:
            raise ValueError("num_attention_heads must be a multiple of num_kv_heads")
        if self.num_sliding_layers > self.num_layers:
            raise ValueError("num_sliding_layers must not exceed num_layers")
        if self.num_sliding_layers and self.sliding_window is None:
            raise ValueError("num_sliding_layers > 0 needs sliding_window")
        if self.moe is not None and self.moe.num_dense_layers >= self.num_layers:
            raise ValueError("moe.num_dense_layers must leave at least one MoE layer (< num_layers)")
        return self

    @property
    def attention_kind(self) -> Literal["mha", "gqa", "mqa", "mla"]:
        if self.mla is not None:
            return "mla"
        if self.num_kv_heads == self.num_attention_heads:
            return "mha"
        return "mqa" if self.num_kv_heads == 1 else "gqa"

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.num_dense_layers


class GPUFile(_Record):
    schema_version: Literal[1]
    gpus: tuple[GPUSpec, ...]

    @field_validator("gpus")
    @classmethod
    def _unique(cls, gpus: tuple[GPUSpec, ...]) -> tuple[GPUSpec, ...]:
        _require_unique([g.id for g in gpus])
        return gpus


class ModelFile(_Record):
    schema_version: Literal[1]
    models: tuple[ModelSpec, ...]

    @field_validator("models")
    @classmethod
    def _unique(cls, models: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
        _require_unique([m.id for m in models])
        return models


class UserFile(_Record):
    """A user's own hardware file: adds or overrides GPUs and models by id."""

    schema_version: Literal[1]
    gpus: tuple[GPUSpec, ...] = ()
    models: tuple[ModelSpec, ...] = ()


def _require_unique(ids: list[str]) -> None:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise ValueError(f"duplicate id {i!r}")
        seen.add(i)


ENGINE_EFFICIENCY_FIELDS = frozenset(Efficiency.model_fields) - {"fitted_on"}


class EngineProfile(_Record):
    """An inference engine's efficiencies: fields of ``Efficiency`` that replace a GPU entry's defaults when a user
    names the engine (``engine=``). ``shared`` applies to every GPU; ``gpus`` adds per-GPU values (the compute and
    memory efficiencies the engine reached on each GPU it was fitted on). A GPU the profile has no entry for keeps
    its own compute and memory efficiencies and takes the shared terms."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64)
    engine: Literal["trtllm", "vllm", "sglang", "generic"]
    version: str = Field(default="", max_length=64, description="the engine versions the profile describes")
    description: str = Field(max_length=2000)
    shared: dict[str, float] = Field(default_factory=dict, description="Efficiency fields for every GPU")
    gpus: dict[str, dict[str, float]] = Field(default_factory=dict, description="GPU id -> Efficiency fields")
    fitted_on: str = Field(default="", max_length=2000, description="the measurements and fit the values come from")
    fitted_sources: tuple[str, ...] = Field(default=(), description="the ``source`` values (step_latencies.csv, "
                                            "serving_latencies.csv) whose rows it was fitted on; every other "
                                            "source is held out")
    fitted_models: Literal["all", "dense"] = Field(default="all", description="dense: only the fitted sources' "
                                                   "runs of dense models were fitted (its mixture-of-experts runs "
                                                   "are held out)")
    sources: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _known_fields(self) -> EngineProfile:
        for where, fields in [("shared", self.shared), *((f"gpus.{g}", v) for g, v in self.gpus.items())]:
            unknown = set(fields) - ENGINE_EFFICIENCY_FIELDS
            if unknown:
                raise ValueError(f"{where}: {sorted(unknown)} are not efficiency fields "
                                 f"(known: {sorted(ENGINE_EFFICIENCY_FIELDS)})")
            Efficiency.model_validate({**self.shared, **fields})  # every value within its field's bounds
        return self

    def efficiency(self, gpu_id: str, base: Efficiency) -> Efficiency:
        """``base`` (a GPU entry's efficiencies) with this profile's shared and per-GPU values over it."""
        if self.engine == "generic" and not self.shared and not self.gpus:
            return base
        own = self.gpus.get(gpu_id)
        note = (f"engine profile {self.id} ({self.fitted_on})" if own is not None else
                f"engine profile {self.id}'s shared terms over {gpu_id}'s own compute and memory efficiencies "
                f"(the profile was not fitted on {gpu_id})")
        return Efficiency.model_validate({**base.model_dump(), **self.shared, **(own or {}), "fitted_on": note})


class EngineFile(_Record):
    schema_version: Literal[1]
    engines: tuple[EngineProfile, ...]

    @field_validator("engines")
    @classmethod
    def _unique(cls, engines: tuple[EngineProfile, ...]) -> tuple[EngineProfile, ...]:
        ids = [e.id for e in engines]
        if len(ids) != len(set(ids)):
            raise ValueError(f"duplicate engine ids: {sorted({i for i in ids if ids.count(i) > 1})}")
        if "generic" not in ids:
            raise ValueError("the 'generic' profile (the GPU entries' own efficiencies) must be present")
        return engines
