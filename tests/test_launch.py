"""A deployment as engine commands (``to_launch``, ``pdplan plan --emit``), and vLLM's own parser on them.

The vLLM command lines are parsed by ``vllm serve``'s argument parser (``make_arg_parser`` and
``validate_parsed_serve_args`` of vLLM's CPU build, in its own environment as for the serving
validation): a flag vLLM renamed or a value it refuses fails here. CI installs that environment and
sets ``PDPLAN_REQUIRE_ENGINE=1``, so there the check runs rather than skips.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import engine_python

import calculator as pc
from calculator.errors import InputError
from calculator.launch import to_launch

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
    mixed = to_launch("llama-3.1-70b", d["mixed"], "vllm")
    (pool,) = mixed.pools
    assert pool.argv[:3] == ("vllm", "serve", pc.load_model("llama-3.1-70b").hf_repo)
    assert _flag(pool.argv, "--tensor-parallel-size") == "4" and _flag(pool.argv, "--max-num-seqs") == "96"
    assert _flag(pool.argv, "--quantization") == "fp8" and _flag(pool.argv, "--kv-cache-dtype") == "fp8"
    assert "--no-enable-chunked-prefill" in pool.argv and _flag(pool.argv, "--max-num-batched-tokens") == "8192"
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


def test_sglang_commands_and_router() -> None:
    d = _deployments()
    dep = to_launch("deepseek-v3", d["dep"], "sglang")
    decode = dep.pools[1].argv
    # SGLang counts every GPU in --tp-size and the attention ranks in --dp-size
    assert _flag(decode, "--tp-size") == "8" and _flag(decode, "--dp-size") == "8" and "--enable-dp-attention" in decode
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
    with pytest.raises(InputError, match="engine"):
        to_launch("llama-3.1-8b", v0, "trtllm")
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




PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.load(sys.stdin):
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    try:
        args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
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
    argvs = [list(p.argv[2:]) for _, _, launch in cases for p in launch.pools]  # after "vllm serve"
    # a renamed flag must fail: the check is not vacuous
    argvs.append([*argvs[0], "--max-num-sequences", "4"])
    r = subprocess.run([python, "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True, timeout=300,
                       check=False, env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    verdicts = json.loads(r.stdout.strip().splitlines()[-1])
    assert verdicts[:-1] == [None] * (len(argvs) - 1), list(zip(argvs, verdicts))
    assert verdicts[-1] is not None


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
