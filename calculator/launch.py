"""``to_launch``: a deployment as the commands that run it on a real engine, one per pool, or as Kubernetes
manifests (``k8s``: vLLM's commands in a Deployment and a Service per pool).

vLLM (0.8+, its V1 engine; the flags of ``vllm serve`` in 0.32), SGLang (``python -m
sglang.launch_server``, the flags of 0.5.23, with ``sglang_router`` in front of disaggregated pools),
TensorRT-LLM (``trtllm-serve``, 1.x, PyTorch backend) and NVIDIA Dynamo (its vLLM workers and frontend). Each pool's command
starts one instance; ``replicas`` says how many to run. What an engine cannot express is an
``InputError`` naming the field and the reason, never a silent approximation:

- vLLM V1 always schedules new prompts into the running decodes' step (pdplan's ``hybrid``): a
  ``prefill_first`` deployment (vLLM V0's behaviour) has no V1 flag.
- Weights quantised below 8 bits come from a pre-quantised checkpoint (AWQ, GPTQ, NVFP4, MXFP4),
  which the command cannot create: the model path must name one, and the command says so.
- SGLang has no context parallelism for ordinary attention; vLLM's is ``--prefill-context-parallel-size``.

The vLLM command lines (and the vLLM engine flags of Dynamo's workers) are checked by vLLM's own
argument parser, and the SGLang ones by SGLang's ``ServerArgs`` parser, in the test suite (where those
CPU-installable packages are present; CI installs both), so a flag that an engine renames fails there.
"""

from __future__ import annotations

import functools
import json
import math
import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hardware_db.schema import ModelSpec

from .arguments import choice, integer, model_spec
from .errors import InputError
from .serving.base import Deployment, Pool
from .serving.workload import Length, Workload

Engine = Literal["vllm", "sglang", "trtllm", "dynamo", "k8s"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang", "trtllm", "dynamo", "k8s")
K8S_IMAGE = "vllm/vllm-openai:latest"
"""The container image of the k8s manifests (vLLM's OpenAI server; pin a version in production)."""
NODE_GPUS = 8
GPU_MEMORY_UTILISATION = 0.9
"""The share of each GPU's memory the engine may use: pdplan's default for the KV budget too."""
VLLM_KV_CONNECTOR = "NixlConnector"
"""vLLM's RDMA KV connector (overlapped transfers: pdplan's ``kv_transfer="overlapped"``)."""
SGLANG_TRANSFER_BACKEND = "mooncake"
SGLANG_ACTIVATION_SHARE = 0.05
"""The share of GPU memory taken off ``GPU_MEMORY_UTILISATION`` for SGLang's --mem-fraction-static, which
counts only the weights and the KV pool: the activations' share that the 0.9 includes."""


class PoolLaunch(BaseModel):
    """One pool: the command of one instance, how many to run and on how many GPUs each."""

    model_config = ConfigDict(frozen=True)

    role: Literal["serve", "prefill", "decode"]
    replicas: int = Field(description="instances of this command to run (behind a load balancer or the router)")
    gpus_per_replica: int
    argv: tuple[str, ...] = Field(description="the command, one argument per item")
    command: str = Field(description="the same, quoted for a POSIX shell")
    port: int


class Launch(BaseModel):
    """A deployment as engine commands, and the router in front of disaggregated pools."""

    model_config = ConfigDict(frozen=True)

    engine: Engine
    model: str
    model_path: str
    pools: tuple[PoolLaunch, ...]
    router: tuple[str, ...] | None = Field(description="disaggregated: the router that sends each prompt to a "
                                           "prefill instance and then its decode to a decode instance")
    router_command: str | None = None
    manifests: tuple[dict, ...] | None = Field(default=None, description="k8s: a Deployment and a Service per pool")
    manifests_yaml: str | None = Field(default=None, description="k8s: the same as one multi-document YAML")
    files: dict[str, str] | None = Field(default=None, description="trtllm: the YAML files the commands read "
                                         "(--config, the disaggregated router's -c), by file name")
    notes: tuple[str, ...] = ()


MULTI_NODE = {
    "vllm": "vLLM: --data-parallel-size-local, --data-parallel-address and --data-parallel-rpc-port on each node, "
            "--headless on all but the first; or a Ray cluster for tensor or pipeline parallelism",
    "dynamo": "its vLLM worker takes vLLM's multi-node data-parallel flags; Dynamo's operator runs the group",
    "sglang": "SGLang: --nnodes, --node-rank and --dist-init-addr on each node",
    "trtllm": "TensorRT-LLM: trtllm-serve under mpirun or srun with one rank per GPU",
}
"""How each engine runs an instance wider than one node (a note where a plan's instance is)."""

SINGLE_HOST = "the command is its single-host form"
"""Part of the note on an instance wider than one node (``to_launch``), which the k8s manifests replace with their own."""

LONGEST_QUANTILE = 0.9999
"""Where a length is a (mean, cv) distribution, the quantile taken as its longest (``workload_max_model_len``)."""


def workload_max_model_len(m: ModelSpec, w: Workload) -> int:
    """The longest prompt plus output ``w`` sends, as an engine's ``max_model_len``: the longest samples, a fixed
    length, or a (mean, cv) length's LONGEST_QUANTILE, rounded up; at most the model's context window."""
    def longest(x: Length) -> float:
        return x.longest_tokens if x.samples is not None or x.cv == 0 else x.quantile(LONGEST_QUANTILE)

    return int(min(math.ceil(longest(w.isl) + longest(w.osl)), m.max_position_embeddings))


def to_launch(model: str | ModelSpec, deployment: Deployment, engine: str, model_path: str | None = None,
              port: int = 8000, max_model_len: int | None = None) -> Launch:
    """The commands that run ``deployment`` of ``model`` on ``engine`` (``vllm``, ``sglang``, ``trtllm``,
    ``dynamo``; ``k8s``: vLLM's commands as Kubernetes manifests).

    ``model_path`` is what the engine loads (a Hugging Face repo id or a local folder); by default the
    model's ``hf_repo``. Each pool's instances listen on ``port`` (the prefill pool on ``port``, the
    decode pool on ``port + 1``, the router on ``port + 2``) on their own hosts. ``max_model_len``: the
    longest prompt plus output to serve (``workload_max_model_len`` of the plan's workload; by default the
    model's context window). vLLM with chunked prefill off refuses a token budget below it, so where it
    exceeds the deployment's budget the vLLM commands raise the budget to it and say so.
    """
    m = model_spec(model)
    engine = choice("engine", engine, ENGINES)
    if not isinstance(deployment, Deployment):
        raise InputError("deployment", f"give a Deployment, got {type(deployment).__name__}")
    if max_model_len is not None:
        max_model_len = integer("max_model_len", max_model_len, 1, m.max_position_embeddings)
    if engine == "k8s":
        return _k8s(to_launch(m, deployment, "vllm", model_path, port, max_model_len))
    path = model_path or m.hf_repo or m.id
    notes: list[str] = []
    files: dict[str, str] = {}
    build = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "dynamo": _dynamo}[engine]
    if engine in ("vllm", "dynamo"):
        build = functools.partial(build, max_model_len=max_model_len or m.max_position_embeddings)
    if deployment.mode == "disaggregated":
        assert deployment.prefill is not None and deployment.decode is not None
        pools = (build(m, path, deployment, deployment.prefill, "prefill", port, notes, files),
                 build(m, path, deployment, deployment.decode, "decode", port + 1, notes, files))
        router: tuple[str, ...] | None = _router(engine, port, pools, notes, files)
    else:
        assert deployment.pool is not None
        pools = (build(m, path, deployment, deployment.pool, "serve", port, notes, files),)
        router = _frontend(port + 2, notes) if engine == "dynamo" else None
        if deployment.pool.instances > 1 and engine != "dynamo":
            notes.append(f"run {deployment.pool.instances} replicas behind a load balancer (least outstanding "
                         "requests); each holds its own KV cache")
    for p in pools:
        if p.gpus_per_replica > NODE_GPUS:
            notes.append(f"{p.role}: an instance spans {p.gpus_per_replica} GPUs, more than one {NODE_GPUS}-GPU node, "
                         f"and {SINGLE_HOST}: run it on {-(-p.gpus_per_replica // NODE_GPUS)} "
                         f"nodes ({MULTI_NODE[engine]})")
    return Launch(engine=engine, model=m.id, model_path=path, pools=pools, router=router,
                  router_command=None if router is None else shlex.join(router), files=files or None,
                  notes=tuple(dict.fromkeys(notes)))


def _weights(m: ModelSpec, pool: Pool, where: str, notes: list[str]) -> str | None:
    """The on-the-fly quantisation flag value, None for the checkpoint's own precision."""
    w = pool.weight_dtype
    if w in ("bf16", "fp16", "fp32") or w == m.checkpoint_dtype:
        return None
    if w == "fp8":
        return "fp8"
    notes.append(f"{where}: {w} weights come from a pre-quantised checkpoint (AWQ/GPTQ for int4, NVFP4/MXFP4 for "
                 "fp4): pass its path as the model; the engine reads the format from its config")
    return None


def _precision(m: ModelSpec, pool: Pool, where: str, notes: list[str], engine: str, fp8_kv: str) -> list[str]:
    """The quantisation and KV-cache dtype flags (the same names in vLLM and SGLang; their fp8 KV value differs)."""
    flags = []
    q = _weights(m, pool, where, notes)
    if q:
        flags += ["--quantization", q]
    if pool.kv_dtype == "fp8":
        flags += ["--kv-cache-dtype", fp8_kv]
    elif pool.kv_dtype not in ("bf16", "fp16"):
        raise InputError(f"{where}.kv_dtype", f"{engine}'s KV cache is 16-bit or fp8, not {pool.kv_dtype}")
    return flags


def _vllm(m: ModelSpec, path: str, d: Deployment, pool: Pool, role: str, port: int, notes: list[str],
          files: dict[str, str], max_model_len: int) -> PoolLaunch:
    argv = ["vllm", "serve", path, "--port", str(port), *_vllm_engine_args(m, d, pool, role, notes, max_model_len)]
    return PoolLaunch(role=role, replicas=pool.instances, gpus_per_replica=pool.num_gpus // pool.instances, argv=tuple(argv),  # type: ignore[arg-type]
                      command=shlex.join(argv), port=port)


def _dynamo(m: ModelSpec, path: str, d: Deployment, pool: Pool, role: str, port: int, notes: list[str],
            files: dict[str, str], max_model_len: int) -> PoolLaunch:
    """A Dynamo vLLM worker: vLLM's engine flags (Dynamo hands them to vLLM's own parser) and, in a
    disaggregated deployment, the worker's role; the frontend on ``port + 2`` serves HTTP and routes."""
    argv = ["python", "-m", "dynamo.vllm", "--model", path, *_vllm_engine_args(m, d, pool, role, notes, max_model_len)]
    if role != "serve":
        argv += ["--disaggregation-mode", role]
    notes.append("Dynamo's components find each other through its discovery service (etcd and NATS, or its "
                 "Kubernetes operator): start those first; each worker registers itself with the frontend")
    return PoolLaunch(role=role, replicas=pool.instances, gpus_per_replica=pool.num_gpus // pool.instances, argv=tuple(argv),  # type: ignore[arg-type]
                      command=shlex.join(argv), port=port)


def _unbalanced_note(pool: Pool, role: str, where: str, engine: str, notes: list[str]) -> None:
    """A note where the plan took the attention-DP ranks' prompts as balanced (``Pool.dp_balance``) and the
    engine has no such setting: its ranks admit their own prompts, and its steps wait for each other's."""
    if pool.dp_balance and role != "decode":
        notes.append(f"{where}: the plan takes the attention-DP ranks' prompts as balanced (dp_balance), which "
                     f"{engine} does not do: each rank admits its own prompts and every step waits for the slowest "
                     "rank, so its decodes stall more than planned; evaluate with dp_balance=false")


def _vllm_engine_args(m: ModelSpec, d: Deployment, pool: Pool, role: str, notes: list[str],
                      max_model_len: int) -> list[str]:
    """vLLM's engine flags for one pool (what ``vllm serve`` and a Dynamo vLLM worker both take)."""
    where = f"deployment.{'pool' if role == 'serve' else role}"
    if d.mode == "mixed" and d.scheduler == "prefill_first":
        raise InputError("deployment.scheduler", "vLLM V1 puts new prompts into the running decodes' step (pdplan's "
                         "'hybrid'); 'prefill_first' is vLLM V0's behaviour, which 0.8+ cannot be set to")
    argv = ["--tensor-parallel-size", str(pool.tp), "--max-model-len", str(max_model_len),
            "--gpu-memory-utilization", str(GPU_MEMORY_UTILISATION), "--max-num-seqs", str(pool.max_batch)]
    if pool.pp > 1:
        argv += ["--pipeline-parallel-size", str(pool.pp)]
    if pool.dp > 1:
        argv += ["--data-parallel-size", str(pool.dp)]
        _unbalanced_note(pool, role, where, "vLLM", notes)
    if pool.ep > 1:
        argv += ["--enable-expert-parallel"]  # vLLM spreads the experts over every GPU of the instance (dp x tp)
    if pool.cp > 1:
        argv += ["--prefill-context-parallel-size", str(pool.cp)]
    argv += _precision(m, pool, where, notes, "vLLM", "fp8")
    if d.mode == "chunked":
        argv += ["--enable-chunked-prefill", "--max-num-batched-tokens", str(d.chunk_tokens)]
    elif role == "decode":
        argv += ["--max-num-batched-tokens", str(d.max_batched_tokens)]
    else:  # hybrid steps with whole prompts: no chunking, the step's token budget
        # vLLM refuses chunking off with a budget below max_model_len (a prompt must fit one step)
        budget = max(d.max_batched_tokens, max_model_len)
        if budget > d.max_batched_tokens:
            notes.append(f"vLLM needs a token budget of at least max_model_len ({max_model_len:,}) with chunked prefill "
                         f"off: the {role} command raises it from the planned {d.max_batched_tokens:,}, so more whole "
                         "prompts may share a step than planned; pass the workload's longest prompt plus output "
                         "(max_model_len) to keep it")
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]
    if pool.spec is not None:
        argv += ["--speculative-config", json.dumps(_vllm_spec(pool, where), separators=(",", ":"))]
    if role != "serve":
        argv += ["--kv-transfer-config", json.dumps({"kv_connector": VLLM_KV_CONNECTOR, "kv_role": "kv_both"},
                                                    separators=(",", ":"))]
        if d.kv_transfer == "blocking":
            notes.append("kv_transfer 'blocking' describes a synchronous connector; the command uses NIXL, which "
                         "overlaps the move")
    return argv


def _vllm_spec(pool: Pool, where: str) -> dict[str, object]:
    s = pool.spec
    assert s is not None
    if s.kind == "mtp":
        return {"method": "mtp", "num_speculative_tokens": s.tokens}
    if s.kind == "eagle":
        raise InputError(f"{where}.spec", "vLLM's EAGLE needs the draft head's path (speculative_config.model), "
                         "which pdplan does not know: add it to the printed --speculative-config")
    return {"model": s.draft_model, "num_speculative_tokens": s.tokens}


def _sglang(m: ModelSpec, path: str, d: Deployment, pool: Pool, role: str, port: int, notes: list[str],
            files: dict[str, str]) -> PoolLaunch:
    where = f"deployment.{'pool' if role == 'serve' else role}"
    if pool.cp > 1:
        raise InputError(f"{where}.cp", "SGLang has no context parallelism for this model's attention; plan "
                         "without cp (cps=[]) for SGLang")
    if d.mode == "mixed" and d.scheduler == "prefill_first":
        raise InputError("deployment.scheduler", "SGLang puts new prompts into the running decodes' batch "
                         "(pdplan's 'hybrid'); it has no 'prefill_first' setting")
    # SGLang's static fraction holds the weights and the KV pool only (activations and CUDA graphs come out of the
    # rest), where vLLM's --gpu-memory-utilization and pdplan's KV budget count the activation peak inside the 0.9
    # (``SGLANG_ACTIVATION_SHARE`` less keeps the KV pool the plan sized)
    argv = ["python", "-m", "sglang.launch_server", "--model-path", path, "--host", "0.0.0.0", "--port", str(port),
            "--tp-size", str(pool.tp * pool.dp), "--mem-fraction-static",
            f"{GPU_MEMORY_UTILISATION - SGLANG_ACTIVATION_SHARE:g}",
            "--max-running-requests", str(pool.max_batch * pool.dp)]
    if pool.pp > 1:
        argv += ["--pp-size", str(pool.pp)]
    if pool.dp > 1:  # SGLang's DP attention: tp-size counts every GPU, attn-dp-size the attention ranks
        argv += ["--attn-dp-size", str(pool.dp)]
        _unbalanced_note(pool, role, where, "SGLang", notes)
    if pool.ep > 1:
        argv += ["--ep-size", str(pool.ep)]
    argv += _precision(m, pool, where, notes, "SGLang", "fp8_e4m3")
    chunk = d.chunk_tokens if d.mode == "chunked" else -1  # -1: whole prompts
    argv += ["--chunked-prefill-size", str(chunk)]
    if pool.spec is not None:
        s = pool.spec
        if s.kind == "eagle":
            raise InputError(f"{where}.spec", "SGLang's EAGLE needs the draft head's path "
                             "(--speculative-draft-model-path), which pdplan does not know")
        argv += ["--speculative-algorithm", "NEXTN" if s.kind == "mtp" else "STANDALONE",
                 "--speculative-num-steps", str(s.tokens), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(s.tokens + 1)]
        if s.kind == "draft":
            argv += ["--speculative-draft-model-path", str(s.draft_model)]
    if role != "serve":
        argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", SGLANG_TRANSFER_BACKEND]
    return PoolLaunch(role=role, replicas=pool.instances, gpus_per_replica=pool.num_gpus // pool.instances, argv=tuple(argv),  # type: ignore[arg-type]
                      command=shlex.join(argv), port=port)


def _trtllm(m: ModelSpec, path: str, d: Deployment, pool: Pool, role: str, port: int, notes: list[str],
            files: dict[str, str]) -> PoolLaunch:
    """``trtllm-serve`` (PyTorch backend) with the options it takes only from its ``--config`` YAML:
    attention data-parallelism, the fp8 KV cache, speculative decoding and the KV cache transceiver."""
    where = f"deployment.{'pool' if role == 'serve' else role}"
    if d.mode == "mixed" and d.scheduler == "prefill_first":
        raise InputError("deployment.scheduler", "TensorRT-LLM's in-flight batching puts new prompts into the "
                         "running decodes' step (pdplan's 'hybrid'); it has no 'prefill_first' setting")
    if pool.cp > 1:
        raise InputError(f"{where}.cp", "TensorRT-LLM's context parallelism is set per model family (cp_config); "
                         "pdplan does not emit it: plan without cp (cps=[]) for TensorRT-LLM")
    if pool.dp > 1 and pool.tp > 1:
        raise InputError(f"{where}.tp", "TensorRT-LLM's attention data-parallelism runs attention at tp 1 on "
                         "every GPU (enable_attention_dp); a dp pool with tp > 1 has no TensorRT-LLM setting")
    w = pool.weight_dtype
    if w not in ("bf16", "fp16", "fp32") and w != m.checkpoint_dtype:
        notes.append(f"{where}: TensorRT-LLM does not quantise at load time: pass a {w} checkpoint (e.g. NVIDIA's "
                     "ModelOpt FP8/NVFP4 checkpoints) as the model")
    tokens = d.chunk_tokens if d.mode == "chunked" else d.max_batched_tokens
    config_name = f"trtllm-{role}.yaml"
    argv = ["trtllm-serve", path, "--host", "0.0.0.0", "--port", str(port), "--backend", "pytorch",
            "--tp_size", str(pool.tp * pool.dp), "--max_batch_size", str(pool.max_batch),
            "--max_num_tokens", str(tokens), "--kv_cache_free_gpu_memory_fraction", str(GPU_MEMORY_UTILISATION)]
    if pool.pp > 1:
        argv += ["--pp_size", str(pool.pp)]
    if pool.ep > 1:
        argv += ["--ep_size", str(pool.ep)]
    if d.mode == "chunked":
        argv += ["--enable_chunked_prefill"]
    config: dict[str, object] = {}
    if pool.dp > 1:
        config["enable_attention_dp"] = True
        if pool.dp_balance and role != "decode":  # the ranks take their prompts in the same steps (the values
            # of TensorRT-LLM's DeepSeek-R1 perf-overview options, docs/source/developer-guide/perf-overview.md)
            config["attention_dp_config"] = {"enable_balance": True, "timeout_iters": 60, "batching_wait_iters": 0}
    if pool.kv_dtype == "fp8":
        config["kv_cache_config"] = {"dtype": "fp8"}
    elif pool.kv_dtype not in ("bf16", "fp16"):
        raise InputError(f"{where}.kv_dtype", f"TensorRT-LLM's KV cache is 16-bit or fp8, not {pool.kv_dtype}")
    if pool.spec is not None:
        s = pool.spec
        if s.kind == "eagle":
            raise InputError(f"{where}.spec", "TensorRT-LLM's EAGLE needs the draft head's path "
                             "(speculative_config.speculative_model_dir), which pdplan does not know")
        config["speculative_config"] = ({"decoding_type": "MTP", "num_nextn_predict_layers": s.tokens}
                                        if s.kind == "mtp" else
                                        {"decoding_type": "DraftTarget", "max_draft_len": s.tokens,
                                         "speculative_model_dir": str(s.draft_model)})
    if role != "serve":
        config["cache_transceiver_config"] = {"backend": "DEFAULT"}
        if role == "prefill":
            config["disable_overlap_scheduler"] = True  # a context server returns after one step
    if config:
        import yaml

        files[config_name] = yaml.safe_dump(config, sort_keys=False)
        argv += ["--config", config_name]
    return PoolLaunch(role=role, replicas=pool.instances, gpus_per_replica=pool.num_gpus // pool.instances, argv=tuple(argv),  # type: ignore[arg-type]
                      command=shlex.join(argv), port=port)


def _frontend(port: int, notes: list[str]) -> tuple[str, ...]:
    notes.append("the Dynamo frontend serves the OpenAI API and routes to the registered workers")
    return ("python", "-m", "dynamo.frontend", "--http-port", str(port))


def _router(engine: Engine, port: int, pools: tuple[PoolLaunch, ...], notes: list[str],
            files: dict[str, str]) -> tuple[str, ...]:
    if engine == "dynamo":
        return _frontend(port + 2, notes)
    prefill, decode = f"http://PREFILL_HOST:{port}", f"http://DECODE_HOST:{port + 1}"
    if engine == "trtllm":
        notes.append("replace PREFILL_HOST and DECODE_HOST in trtllm-disagg.yaml with the instances' addresses (one "
                     "url per instance)")
        import yaml

        files["trtllm-disagg.yaml"] = yaml.safe_dump({
            "hostname": "0.0.0.0", "port": port + 2, "backend": "pytorch",
            "context_servers": {"num_instances": pools[0].replicas, "urls": [f"PREFILL_HOST:{port}"]},
            "generation_servers": {"num_instances": pools[1].replicas, "urls": [f"DECODE_HOST:{port + 1}"]},
        }, sort_keys=False)
        return ("trtllm-serve", "disaggregated", "-c", "trtllm-disagg.yaml")
    notes.append("replace PREFILL_HOST and DECODE_HOST with the instances' addresses (one --prefill / --decode per "
                 "instance)")
    if engine == "sglang":
        return ("python", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--prefill", prefill,
                "--decode", decode, "--host", "0.0.0.0", "--port", str(port + 2))
    notes.append("vLLM ships no production router: run a prefill-then-decode proxy in front (NVIDIA Dynamo, llm-d, "
                 "or vLLM's disaggregated proxy example); the one shown is vLLM's example")
    return ("python", "disagg_proxy_server.py", "--prefiller-hosts", "PREFILL_HOST", "--prefiller-ports", str(port),
            "--decoder-hosts", "DECODE_HOST", "--decoder-ports", str(port + 1), "--port", str(port + 2))


def _dns_name(text: str) -> str:
    """A Kubernetes object name (RFC 1123 label): lower case, digits and '-', at most 63 characters."""
    out = "".join(c if c.isalnum() and c.isascii() else "-" for c in text.lower()).strip("-")
    while "--" in out:
        out = out.replace("--", "-")
    return out[:63].rstrip("-") or "pdplan"


def _no_alias_dumper(yaml: Any) -> type:
    """A safe dumper that writes a dict used twice (the labels, the selector) in full, not as an &anchor / *alias
    (valid YAML, but awkward for kustomize, yq and people)."""

    class NoAliasDumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    return NoAliasDumper


def _k8s(launch: Launch) -> Launch:
    """vLLM's commands as a Deployment (replicas = instances, the GPUs as nvidia.com/gpu limits) and a Service per
    pool."""
    import yaml

    docs: list[dict] = []
    notes = [n for n in launch.notes if SINGLE_HOST not in n]  # its own note below says how, for k8s
    for pool in launch.pools:
        name = _dns_name(f"{launch.model}-{pool.role}")
        labels = {"app.kubernetes.io/name": _dns_name(launch.model), "app.kubernetes.io/component": pool.role,
                  "app.kubernetes.io/managed-by": "pdplan"}
        docs.append({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": pool.replicas, "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                    "name": "vllm", "image": K8S_IMAGE, "command": list(pool.argv[:2]), "args": list(pool.argv[2:]),
                    "ports": [{"containerPort": pool.port, "name": "http"}],
                    "resources": {"limits": {"nvidia.com/gpu": pool.gpus_per_replica}},
                    "readinessProbe": {"httpGet": {"path": "/health", "port": pool.port}, "periodSeconds": 10},
                }]}},
            },
        })
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
                     "spec": {"selector": labels, "ports": [{"name": "http", "port": pool.port, "targetPort": pool.port}]}})
        if pool.gpus_per_replica > NODE_GPUS:
            notes.append(f"{pool.role}: an instance spans {pool.gpus_per_replica} GPUs, more than one {NODE_GPUS}-GPU "
                         "node; run it as a multi-node group (LeaderWorkerSet with Ray) rather than one pod")
    if launch.router is not None:
        notes.append("the router in front of the disaggregated pools is not in the manifests: deploy one (NVIDIA "
                     "Dynamo, llm-d) pointing at the two Services")
    return launch.model_copy(update={"engine": "k8s", "manifests": tuple(docs),
                                     "manifests_yaml": yaml.dump_all(docs, Dumper=_no_alias_dumper(yaml), sort_keys=False),
                                     "notes": tuple(dict.fromkeys(notes))})


__all__ = ["ENGINES", "Launch", "PoolLaunch", "to_launch"]
