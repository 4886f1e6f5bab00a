"""A deployment as engine commands (``to_launch``, ``pdplan plan --emit``), and vLLM's own parser on them.

The vLLM command lines are parsed by ``vllm serve``'s argument parser (``make_arg_parser`` and
``validate_parsed_serve_args`` of vLLM's CPU build, in its own environment as for the serving
validation): a flag vLLM renamed or a value it refuses fails here. CI installs that environment and
sets ``PDPLAN_REQUIRE_ENGINE=1``, so there the check runs rather than skips.
"""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest
from conftest import engine_python

import calculator as pc
from calculator.errors import InputError
from calculator.launch import to_launch, workload_max_model_len

REQUIRE = os.environ.get("PDPLAN_REQUIRE_ENGINE") == "1"


def _flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def _deployments() -> dict[str, pc.Deployment]:
    return {
        "mixed": pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm", tp=4, instances=3, max_batch=96,
                                                             weight_dtype="fp8", kv_dtype="fp8"),
                               max_batched_tokens=8192),
        "chunked": pc.Deployment(mode="chunked", pool=pc.Pool(gpu="h200-sxm", tp=2, pp=2), chunk_tokens=512),
        "disaggregated": pc.Deployment(mode="disaggregated", prefill=pc.Pool(gpu="h100-sxm", tp=2, instances=3),
                                       decode=pc.Pool(gpu="h200-sxm", tp=4, instances=2)),
        "dep": pc.Deployment(mode="disaggregated", prefill=pc.Pool(gpu="h200-sxm", tp=8, weight_dtype="fp8"),
                             decode=pc.Pool(gpu="h200-sxm", dp=8, ep=8, weight_dtype="fp8",
                                            spec=pc.Speculation(kind="mtp", tokens=2))),
    }


def test_vllm_commands_carry_the_deployment() -> None:
    d = _deployments()
    mixed = to_launch("llama-3.1-70b", d["mixed"], "vllm", max_model_len=4500)
    (pool,) = mixed.pools
    assert pool.argv[:3] == ("vllm", "serve", pc.load_model("llama-3.1-70b").hf_repo)
    assert _flag(pool.argv, "--tensor-parallel-size") == "4" and _flag(pool.argv, "--max-num-seqs") == "96"
    assert _flag(pool.argv, "--quantization") == "fp8" and _flag(pool.argv, "--kv-cache-dtype") == "fp8"
    assert "--no-enable-chunked-prefill" in pool.argv and _flag(pool.argv, "--max-num-batched-tokens") == "8192"
    assert _flag(pool.argv, "--max-model-len") == "4500" and not any("token budget" in n for n in mixed.notes)
    # without the workload's longest request, the model's context window: the budget rises to it, and a note says so
    whole = to_launch("llama-3.1-70b", d["mixed"], "vllm")
    assert _flag(whole.pools[0].argv, "--max-model-len") == "131072"
    assert _flag(whole.pools[0].argv, "--max-num-batched-tokens") == "131072"
    assert any("raises it from the planned 8,192" in n for n in whole.notes)
    assert pool.replicas == 3 and pool.gpus_per_replica == 4 and mixed.router is None
    chunked = to_launch("llama-3.1-70b", d["chunked"], "vllm").pools[0].argv
    assert "--enable-chunked-prefill" in chunked and _flag(chunked, "--max-num-batched-tokens") == "512"
    assert _flag(chunked, "--pipeline-parallel-size") == "2"
    dis = to_launch("llama-3.1-70b", d["disaggregated"], "vllm")
    assert [p.role for p in dis.pools] == ["prefill", "decode"] and [p.replicas for p in dis.pools] == [3, 2]
    assert json.loads(_flag(dis.pools[0].argv, "--kv-transfer-config"))["kv_connector"] == "NixlConnector"
    assert dis.router is not None and dis.pools[1].port == dis.pools[0].port + 1
    dep = to_launch("deepseek-v3", d["dep"], "vllm").pools[1].argv
    assert _flag(dep, "--data-parallel-size") == "8" and "--enable-expert-parallel" in dep
    assert json.loads(_flag(dep, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 2}
    # the checkpoint is fp8 already: no on-the-fly quantisation flag
    assert "--quantization" not in dep or pc.load_model("deepseek-v3").checkpoint_dtype != "fp8"


def test_vllm_gets_a_token_budget_it_accepts_with_chunking_off() -> None:
    """vLLM's SchedulerConfig refuses chunked prefill off with --max-num-batched-tokens below --max-model-len
    (a prompt must fit one step); without --max-model-len it takes the model's context window (131,072 for
    Llama-3.1), so the commands once failed at start. Every vLLM and Dynamo command now passes both, in that
    order, and a plan passes its workload's longest prompt plus output."""
    for name, dep in _deployments().items():
        model = "deepseek-v3" if name == "dep" else "llama-3.1-70b"
        for engine in ("vllm", "dynamo"):
            for cap in (None, 4500, 100_000):
                for p in to_launch(model, dep, engine, max_model_len=cap).pools:
                    if "--no-enable-chunked-prefill" in p.argv:
                        assert int(_flag(p.argv, "--max-num-batched-tokens")) >= int(_flag(p.argv, "--max-model-len"))
    w = pc.Workload(rate=4, isl={"mean": 2000, "cv": 0.5}, osl=[100, 300, 700])
    longest = workload_max_model_len(pc.load_model("llama-3.1-8b"), w)
    assert longest == math.ceil(w.isl.quantile(0.9999) + 700) and 2000 * 3 < longest < 131072
    assert workload_max_model_len(pc.load_model("llama-3.1-8b"), pc.Workload(rate=1, isl=1024, osl=256)) == 1280
    from typer.testing import CliRunner

    from calculator.cli import app

    r = CliRunner().invoke(app, ["plan", "llama-3.1-70b", "--rate", "5", "--ttft", "2s", "--tpot", "50ms",
                                 "--gpu", "h100-sxm", "--emit", "vllm"])
    assert r.exit_code == 0 and "--max-model-len 1280" in r.output, r.output
    with pytest.raises(pc.InputError, match="max_model_len"):
        to_launch("llama-3.1-8b", _deployments()["mixed"], "vllm", max_model_len=10**9)


def test_an_instance_wider_than_a_node_is_noted_and_k8s_yaml_has_no_aliases() -> None:
    """A 16-GPU DeepSeek-V3 decode instance (dp16 ep16) runs on two nodes: every engine's commands say so and how
    (they are the single-host form); the manifests write the shared labels in full, not as YAML anchors."""
    d = pc.Deployment(mode="disaggregated", prefill=pc.Pool(gpu="h200-sxm", tp=8, weight_dtype="fp8"),
                      decode=pc.Pool(gpu="h200-sxm", dp=16, ep=16, weight_dtype="fp8"))
    how = {"vllm": "--data-parallel-address", "sglang": "--nnodes", "trtllm": "mpirun", "dynamo": "vLLM's multi-node"}
    for engine, flag in how.items():
        notes = [n for n in to_launch("deepseek-v3", d, engine).notes if "spans 16 GPUs" in n]
        assert len(notes) == 1 and "run it on 2 nodes" in notes[0] and flag in notes[0] and notes[0].startswith("decode")
    assert not [n for n in to_launch("llama-3.1-70b", _deployments()["mixed"], "vllm").notes if "spans" in n]
    k8s = to_launch("deepseek-v3", d, "k8s")
    assert len([n for n in k8s.notes if "spans 16 GPUs" in n]) == 1 and "LeaderWorkerSet" in " ".join(k8s.notes)
    assert "&id" not in k8s.manifests_yaml and "*id" not in k8s.manifests_yaml
    assert k8s.manifests_yaml.count("app.kubernetes.io/managed-by: pdplan") >= 4


def test_sglang_commands_and_router() -> None:
    d = _deployments()
    dep = to_launch("deepseek-v3", d["dep"], "sglang")
    decode = dep.pools[1].argv
    # SGLang counts every GPU in --tp-size and the attention ranks in --attn-dp-size
    assert _flag(decode, "--tp-size") == "8" and _flag(decode, "--attn-dp-size") == "8" and "--dp-size" not in decode
    assert _flag(decode, "--ep-size") == "8" and _flag(decode, "--disaggregation-mode") == "decode"
    assert _flag(decode, "--speculative-algorithm") == "NEXTN"
    assert dep.router is not None and "--pd-disaggregation" in dep.router
    mixed = to_launch("llama-3.1-70b", d["mixed"], "sglang").pools[0].argv
    assert _flag(mixed, "--chunked-prefill-size") == "-1" and _flag(mixed, "--kv-cache-dtype") == "fp8_e4m3"
    assert _flag(to_launch("llama-3.1-70b", d["chunked"], "sglang").pools[0].argv, "--chunked-prefill-size") == "512"


def test_what_an_engine_cannot_express_is_an_error() -> None:
    v0 = pc.Deployment(mode="mixed", scheduler="prefill_first", pool=pc.Pool(gpu="h100-sxm"))
    with pytest.raises(InputError) as e:
        to_launch("llama-3.1-8b", v0, "vllm")
    assert e.value.field == "deployment.scheduler" and "V0" in e.value.reason
    cp = pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h200-sxm", tp=8, cp=4))
    with pytest.raises(InputError, match="context parallelism"):
        to_launch("llama-3.1-70b", cp, "sglang")
    assert "--prefill-context-parallel-size" in to_launch("llama-3.1-70b", cp, "vllm").pools[0].argv
    eagle = pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm", spec=pc.Speculation(kind="eagle")))
    with pytest.raises(InputError, match="draft head"):
        to_launch("llama-3.1-8b", eagle, "vllm")
    for engine in ("trtllm", "dynamo", "sglang"):
        with pytest.raises(InputError, match="prefill_first"):
            to_launch("llama-3.1-8b", v0, engine)
    with pytest.raises(InputError, match="engine"):
        to_launch("llama-3.1-8b", v0, "tgi")
    with pytest.raises(InputError, match=r"deployment\.pool\.cp"):
        to_launch("llama-3.1-70b", cp, "trtllm")
    with pytest.raises(InputError, match="draft head"):
        to_launch("llama-3.1-8b", eagle, "trtllm")
    int4 = pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm", weight_dtype="int4"))
    assert any("pre-quantised checkpoint" in n for n in to_launch("llama-3.1-8b", int4, "vllm").notes)


def test_plan_emits_the_best_deployment() -> None:
    from typer.testing import CliRunner

    from calculator.cli import app

    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--rate", "4", "--ttft", "2s", "--tpot", "50ms",
                                 "--gpu", "h100-sxm", "--emit", "vllm"])
    assert r.exit_code == 0, r.output
    assert "vllm serve" in r.output and "--tensor-parallel-size" in r.output
    best = pc.plan("llama-3.1-8b", pc.Workload(rate=4, isl=1024, osl=256), pc.SLO(ttft_s=2, tpot_s=0.05),
                   gpus=["h100-sxm"]).best
    assert best is not None and best.deployment.to_launch("llama-3.1-8b", "sglang").pools




TRTLLM_SERVE_OPTIONS = frozenset({
    "--host", "--port", "--backend", "--max_batch_size", "--max_num_tokens", "--max_seq_len", "--tp_size",
    "--pp_size", "--cp_size", "--ep_size", "--kv_cache_free_gpu_memory_fraction", "--enable_chunked_prefill",
    "--config", "--extra_llm_api_options", "--server_role", "--trust_remote_code"})
"""Options of ``trtllm-serve`` (its click command in NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py,
1.x). TensorRT-LLM needs a GPU to install, so its parser cannot run here; the emitted flags are
checked against these names instead."""
TRTLLM_CONFIG_KEYS = frozenset({"enable_attention_dp", "attention_dp_config", "kv_cache_config", "speculative_config",
                                "cache_transceiver_config", "disable_overlap_scheduler"})
"""``--config`` YAML keys pdplan writes: fields of TensorRT-LLM's ``LlmArgs`` (tensorrt_llm/llmapi/llm_args.py)."""


def test_trtllm_commands_and_config_files() -> None:
    import yaml

    d = _deployments()
    dep = to_launch("deepseek-v3", d["dep"], "trtllm")
    prefill, decode = dep.pools
    assert prefill.argv[:2] == ("trtllm-serve", "deepseek-ai/DeepSeek-V3") and _flag(prefill.argv, "--tp_size") == "8"
    assert _flag(decode.argv, "--tp_size") == "8" and _flag(decode.argv, "--ep_size") == "8"
    dec = yaml.safe_load(dep.files[_flag(decode.argv, "--config")])
    assert dec["enable_attention_dp"] is True
    assert dec["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 2}
    assert dec["cache_transceiver_config"] == {"backend": "DEFAULT"}
    pre = yaml.safe_load(dep.files[_flag(prefill.argv, "--config")])
    assert pre["disable_overlap_scheduler"] is True and "enable_attention_dp" not in pre
    router = yaml.safe_load(dep.files["trtllm-disagg.yaml"])
    assert dep.router == ("trtllm-serve", "disaggregated", "-c", "trtllm-disagg.yaml")
    assert router["context_servers"]["num_instances"] == 1 and router["generation_servers"]["urls"] == ["DECODE_HOST:8001"]
    mixed = to_launch("llama-3.1-70b", d["mixed"], "trtllm")
    (pool,) = mixed.pools
    assert yaml.safe_load(mixed.files[_flag(pool.argv, "--config")]) == {"kv_cache_config": {"dtype": "fp8"}}
    assert any("does not quantise at load time" in n for n in mixed.notes)  # fp8 weights of a bf16 checkpoint
    chunked = to_launch("llama-3.1-70b", d["chunked"], "trtllm").pools[0].argv
    assert "--enable_chunked_prefill" in chunked and _flag(chunked, "--max_num_tokens") == "512"
    assert _flag(chunked, "--pp_size") == "2" and "--config" not in chunked
    for launch in (dep, mixed, to_launch("llama-3.1-70b", d["disaggregated"], "trtllm")):
        for p in launch.pools:
            assert {a for a in p.argv if a.startswith("--")} <= TRTLLM_SERVE_OPTIONS, p.argv
        for name, text in (launch.files or {}).items():
            if name != "trtllm-disagg.yaml":
                assert set(yaml.safe_load(text)) <= TRTLLM_CONFIG_KEYS, name
    with pytest.raises(InputError, match=r"deployment\.decode\.tp: .*attention data-parallelism"):
        to_launch("deepseek-v3", pc.Deployment(mode="disaggregated", prefill=pc.Pool(gpu="h200-sxm", tp=8),
                                                decode=pc.Pool(gpu="h200-sxm", tp=2, dp=4, ep=8)), "trtllm")


def test_dynamo_workers_and_frontend() -> None:
    d = _deployments()
    dis = to_launch("llama-3.1-70b", d["disaggregated"], "dynamo")
    prefill, decode = dis.pools
    assert prefill.argv[:5] == ("python", "-m", "dynamo.vllm", "--model", "meta-llama/Llama-3.1-70B")
    assert _flag(prefill.argv, "--disaggregation-mode") == "prefill" and _flag(decode.argv, "--disaggregation-mode") == "decode"
    assert json.loads(_flag(decode.argv, "--kv-transfer-config"))["kv_connector"] == "NixlConnector"
    assert dis.router == ("python", "-m", "dynamo.frontend", "--http-port", "8002")
    assert [p.replicas for p in dis.pools] == [3, 2] and "--port" not in prefill.argv
    mixed = to_launch("llama-3.1-70b", d["mixed"], "dynamo")
    assert mixed.router is not None and "--disaggregation-mode" not in mixed.pools[0].argv
    assert any("etcd" in n for n in mixed.notes)


PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.engine.arg_utils import AsyncEngineArgs
out = []
for kind, argv in json.load(sys.stdin):
    try:
        if kind == "serve":
            parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
            args = parser.parse_args(argv)
            validate_parsed_serve_args(args)
        else:  # a Dynamo vLLM worker's engine flags: Dynamo hands them to this parser
            parser = FlexibleArgumentParser()
            AsyncEngineArgs.add_cli_args(parser)
            AsyncEngineArgs.from_cli_args(parser.parse_args(argv))
        out.append(None)
    except SystemExit as e:
        out.append(f"exit {e.code}")
    except Exception as e:
        out.append(repr(e))
print(json.dumps(out))
"""


def test_vllm_parses_the_commands() -> None:
    from calculator.enginebench.engine import check_engine

    python = engine_python()
    if python is None or check_engine(python) is None:
        msg = f"vLLM's CPU build is not importable by {python or '$PDPLAN_ENGINE_PYTHON'} (see the README)"
        if REQUIRE:
            pytest.fail(msg)
        pytest.skip(msg)
    cases = [(name, model, to_launch(model, dep, "vllm")) for name, model, dep in (
        (n, "deepseek-v3" if n == "dep" else "llama-3.1-70b", d) for n, d in _deployments().items())]
    argvs = [("serve", list(p.argv[2:])) for _, _, launch in cases for p in launch.pools]  # after "vllm serve"
    for name, dep in _deployments().items():  # Dynamo's workers, less Dynamo's own --disaggregation-mode
        for p in to_launch("deepseek-v3" if name == "dep" else "llama-3.1-70b", dep, "dynamo").pools:
            argv = list(p.argv[3:])
            if "--disaggregation-mode" in argv:
                i = argv.index("--disaggregation-mode")
                del argv[i:i + 2]
            argvs.append(("engine", argv))
    # a renamed flag must fail, for both parsers: the check is not vacuous
    argvs.append(("serve", [*argvs[0][1], "--max-num-sequences", "4"]))
    argvs.append(("engine", [*argvs[-2][1], "--max-num-sequences", "4"]))
    r = subprocess.run([python, "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True, timeout=300,
                       check=False, env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    verdicts = json.loads(r.stdout.strip().splitlines()[-1])
    assert verdicts[:-2] == [None] * (len(argvs) - 2), list(zip(argvs, verdicts))
    assert verdicts[-2] is not None and verdicts[-1] is not None


SGLANG_PARSE = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
out = []
for argv in json.load(sys.stdin):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    try:
        args = parser.parse_args(argv)
        out.append({"tp_size": args.tp_size, "attn_dp_size": getattr(args, "attn_dp_size", None)})
    except SystemExit as e:
        out.append(f"exit {e.code}")
print(json.dumps(out))
"""


def test_sglang_parses_the_commands() -> None:
    """SGLang's own ``ServerArgs`` argument parser (it imports without a GPU; CI installs it in
    ``.sglang-venv``) takes every emitted SGLang command, and refuses a renamed flag."""
    python = engine_python("PDPLAN_SGLANG_PYTHON", ".sglang-venv")
    probe = python and subprocess.run([python, "-c", "import sglang.srt.server_args"], capture_output=True,
                                      timeout=120, check=False).returncode == 0
    if not probe:
        msg = f"SGLang is not importable by {python or '$PDPLAN_SGLANG_PYTHON'} (see .ci/run)"
        if REQUIRE:
            pytest.fail(msg)
        pytest.skip(msg)
    launches = [to_launch("deepseek-v3" if n == "dep" else "llama-3.1-70b", d, "sglang") for n, d in _deployments().items()]
    argvs = [list(p.argv[3:]) for launch in launches for p in launch.pools]  # after "python -m sglang.launch_server"
    argvs.append([*argvs[0], "--max-num-seqs", "4"])  # vLLM's name for --max-running-requests
    r = subprocess.run([python, "-c", SGLANG_PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    verdicts = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(isinstance(v, dict) for v in verdicts[:-1]), list(zip(argvs, verdicts))
    assert isinstance(verdicts[-1], str)
    dep_decode = verdicts[len(argvs) - 2]  # the DeepSeek decode pool: 8 GPUs, 8 attention ranks
    assert dep_decode == {"tp_size": 8, "attn_dp_size": 8}
    assert "deprecated" not in r.stderr.lower(), r.stderr[-2000:]


def test_k8s_manifests_validate_against_the_kubernetes_schema() -> None:
    import kubernetes_validate
    import yaml

    for name, model in (("mixed", "llama-3.1-70b"), ("disaggregated", "llama-3.1-70b"), ("dep", "deepseek-v3"),
                        ("chunked", "llama-3.1-70b")):
        launch = to_launch(model, _deployments()[name], "k8s")
        assert launch.manifests is not None and launch.manifests_yaml is not None
        docs = list(yaml.safe_load_all(launch.manifests_yaml))
        assert docs == list(launch.manifests) and len(docs) == 2 * len(launch.pools)
        for doc in docs:  # strict: an unknown field fails too
            kubernetes_validate.validate(doc, "1.30", strict=True)
        deployments = [d for d in docs if d["kind"] == "Deployment"]
        for d, pool in zip(deployments, to_launch(model, _deployments()[name], "vllm").pools):
            assert d["spec"]["replicas"] == pool.replicas
            container = d["spec"]["template"]["spec"]["containers"][0]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == pool.gpus_per_replica
            assert [*container["command"], *container["args"]] == list(pool.argv)
    # a pipelined instance of 16 GPUs cannot be one pod on an 8-GPU node: said, not hidden
    big = pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h100-sxm", tp=8, pp=2))
    assert any("multi-node" in n for n in to_launch("llama-3.1-405b", big, "k8s").notes)
    # a broken manifest does fail the schema (the check is not vacuous)
    bad = dict(to_launch("llama-3.1-8b", _deployments()["mixed"], "k8s").manifests[0])
    bad["spec"] = {**bad["spec"], "replicas": "three"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_balanced_attention_dp_ranks_set_tensorrt_llms_balance_and_warn_elsewhere() -> None:
    """A mixed DeepSeek pool planned with the ranks' prompts balanced (``dp_balance``): TensorRT-LLM gets the
    attention_dp_config of its own DeepSeek-R1 perf-overview options; vLLM and SGLang have no such setting, so
    their commands carry a note; an unbalanced pool gets neither."""
    import yaml

    def pool(balanced: bool) -> pc.Deployment:
        return pc.Deployment(mode="mixed", pool=pc.Pool(gpu="h200-sxm", dp=8, ep=8, dp_balance=balanced,
                                                        weight_dtype="fp8", kv_dtype="fp8"))

    trt = to_launch("deepseek-v3", pool(True), "trtllm")
    config = yaml.safe_load(trt.files[_flag(trt.pools[0].argv, "--config")])
    assert config["attention_dp_config"] == {"enable_balance": True, "timeout_iters": 60, "batching_wait_iters": 0}
    plain = to_launch("deepseek-v3", pool(False), "trtllm")
    assert "attention_dp_config" not in yaml.safe_load(plain.files[_flag(plain.pools[0].argv, "--config")])
    for engine in ("vllm", "sglang"):
        assert any("dp_balance" in n for n in to_launch("deepseek-v3", pool(True), engine).notes)
        assert not any("dp_balance" in n for n in to_launch("deepseek-v3", pool(False), engine).notes)
