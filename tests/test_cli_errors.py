"""How ``pdplan`` fails: one line on stderr, never a traceback, and the exit status of ``EXIT_CODES``.

The output cases (closed stdout, full disk, broken pipe) and the FIFO case run the real console
entry point in a subprocess, because they depend on file descriptors that CliRunner replaces.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calculator import cli
from calculator.cli import app

ROOT = Path(__file__).resolve().parents[1]
ENTRY = "import sys; from calculator.cli import main; sys.exit(main())"  # what the console script runs
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "max_position_embeddings": 131072}
LLAMA_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V x 32 layers x 8 KV heads x head_dim 128 x 2 bytes (bf16)
runner = CliRunner()


def _pdplan(*args: str, timeout: float = 120, env: dict[str, str] | None = None, shell_redirect: str = "",
            **kwargs) -> subprocess.CompletedProcess:
    """Run ``pdplan ARGS`` as the console script does, optionally with a shell redirection of stdout."""
    cmd = [sys.executable, "-c", ENTRY, *args]
    if shell_redirect:
        cmd = ["sh", "-c", f'exec "$@" {shell_redirect}', "sh", *cmd]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PDPLAN_")}
    full_env.update(PYTHONPATH=str(ROOT), **(env or {}))
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(cmd, check=False, stderr=subprocess.PIPE, text=True, timeout=timeout, env=full_env, cwd=ROOT, **kwargs)


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def _invoke(*args: str, **kwargs):
    r = runner.invoke(app, list(args), **kwargs)
    assert "Traceback" not in r.output
    return r


# ----------------------------------------------------------------------------------------- output


def test_closed_stdout_exits_4():
    r = _pdplan("gpus", shell_redirect=">&-")
    assert r.returncode == cli.EXIT_OUTPUT == 4
    assert _one_line(r.stderr) == "error: cannot write the output: stdout is closed"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux /dev/full")
@pytest.mark.parametrize("args", [["gpus"], ["models", "--json"], ["--help"]])
def test_full_disk_exits_4(args):
    with open("/dev/full", "w") as full:
        r = _pdplan(*args, stdout=full)
    assert r.returncode == 4
    assert _one_line(r.stderr) == "error: cannot write the output: No space left on device"


def test_broken_pipe_exits_141_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before pdplan writes a byte
    try:
        r = _pdplan("models", stdout=write_end)
    finally:
        os.close(write_end)
    assert r.returncode == cli.EXIT_BROKEN_PIPE == 141
    assert r.stderr == ""


def test_models_into_head_prints_no_error():
    r = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{ENTRY}" models | head -1'], capture_output=True,
                       check=False, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1
    assert r.stderr == ""  # whether pdplan finished before head exited (0) or met the closed pipe (141)


def test_success_exits_0_with_the_output():
    r = _pdplan("gpus", "--json")
    assert r.returncode == 0 and r.stderr == ""
    assert "h100-sxm" in {g["id"] for g in json.loads(r.stdout)}


# ------------------------------------------------------------------------------------- model files


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "binary.json").write_bytes(b"\x00\x01\x02{}")
    (tmp_path / "latin1.json").write_bytes(b'{"model_type": "caf\xe9"}')
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(LLAMA_8B).encode())
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text('{"hidden_size": ')
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / "hf-dir").mkdir()
    (tmp_path / "hf-dir" / "config.json").write_text(json.dumps(LLAMA_8B))
    return tmp_path


@pytest.mark.parametrize("name, reason", [
    ("binary.json", "binary.json: a binary file (it holds NUL bytes), not UTF-8 text"),
    # '{"model_type": "caf' is 19 bytes, then the Latin-1 é
    ("latin1.json", "latin1.json: not UTF-8 text (invalid byte at offset 19)"),
    ("list.json", "list.json: a config.json holds a JSON object, not a list"),
    ("broken.json", "broken.json: not valid JSON (Expecting value: line 1 column 17 (char 16))"),
    ("empty-dir", "empty-dir: a directory without a config.json"),
    ("missing.json", "missing.json: no such file"),
])
def test_bad_model_files_name_the_file(files, name, reason):
    r = _invoke("kv", str(files / name))
    assert r.exit_code == 2
    assert r.output == f"error: model: {files / reason}\n"


def test_dev_zero_as_the_model_is_refused():
    r = _invoke("estimate", "/dev/zero", "h100-sxm")
    assert r.exit_code == 2
    assert r.output == "error: model: /dev/zero: not a regular file (a pipe, device or socket is not read)\n"


@pytest.mark.parametrize("name", ["bom.json", "hf-dir"])
def test_a_bom_config_and_a_model_directory_work(files, name):
    r = _invoke("kv", str(files / name), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["bytes_per_token"] == LLAMA_8B_KV_BYTES_PER_TOKEN == 131_072


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("args", [["kv", "{fifo}"], ["estimate", "llama-3.1-8b", "h100-sxm", "--calibration", "{fifo}"]])
def test_a_fifo_is_refused_not_waited_on(tmp_path, args):
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    r = _pdplan(*(a.format(fifo=fifo) for a in args), timeout=60)  # a read would block forever
    field = "model" if args[0] == "kv" else "calibration"
    assert r.returncode == 2
    assert _one_line(r.stderr) == f"error: {field}: {fifo}: not a regular file (a pipe, device or socket is not read)"


@pytest.mark.parametrize("name, reason", [
    ("binary.json", "binary.json: a binary file (it holds NUL bytes), not UTF-8 text"),
    ("missing.yaml", "missing.yaml: no such file"),
    ("empty-dir", "empty-dir: is a directory, not a file"),
])
def test_bad_calibration_files_are_one_line(files, name, reason):
    r = _invoke("estimate", "llama-3.1-8b", "h100-sxm", "--calibration", str(files / name))
    assert r.exit_code == 2
    assert r.output == f"error: calibration: {files / reason}\n"


def test_a_calibration_that_is_not_yaml_is_one_line(files):
    r = _invoke("estimate", "llama-3.1-8b", "h100-sxm", "--calibration", str(files / "broken.json"))
    assert r.exit_code == 2 and len(r.output.splitlines()) == 1  # the YAML error's own lines are joined
    assert r.output.startswith(f"error: calibration: {files / 'broken.json'} is not valid YAML: ")


# -------------------------------------------------------------------------------- hardware database


@pytest.mark.parametrize("content, reason", [
    (None, "user hardware file (from $PDPLAN_HARDWARE_DB) does not exist"),
    ("schema_version: [\n", "not valid YAML: "),
    ("schema_version: 1\ngpus:\n  - id: x\n", "gpus[0] (id 'x') field name: Field required"),
])
def test_an_unreadable_hardware_database_exits_3(tmp_path, content, reason):
    db = tmp_path / "hw.yaml"
    if content is not None:
        db.write_text(content)
    r = _invoke("models", "--json", env={"PDPLAN_HARDWARE_DB": str(db)})
    assert r.exit_code == cli.EXIT_HARDWARE_DB == 3
    assert r.stdout == "" and len(r.output.splitlines()) == 1
    assert r.output.startswith("error: hardware database: ") and reason in r.output


# ---------------------------------------------------------------------------------- internal errors


def test_a_bug_is_one_line_exit_70(monkeypatch):
    import calculator.service as s

    def broken():
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(s, "gpu_catalog", broken)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    r = _invoke("gpus")
    assert r.exit_code == cli.EXIT_INTERNAL == 70
    assert r.output == ("internal error: ZeroDivisionError: float division by zero "
                        "(set PDPLAN_DEBUG=1 for the traceback)\n")


def test_pdplan_debug_adds_the_traceback(monkeypatch):
    import calculator.service as s

    monkeypatch.setattr(s, "gpu_catalog", lambda: 1 / 0)
    r = runner.invoke(app, ["gpus"], env={cli.DEBUG_ENV: "1"})
    assert r.exit_code == 70
    assert "Traceback (most recent call last)" in r.output and "ZeroDivisionError" in r.output
    assert r.output.rstrip().endswith("internal error: ZeroDivisionError: division by zero "
                                      "(set PDPLAN_DEBUG=1 for the traceback)")


def test_interrupt_exits_130(monkeypatch):
    import calculator.service as s

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(s, "model_catalog", interrupted)
    r = _invoke("models")
    assert r.exit_code == cli.EXIT_INTERRUPTED == 130


# --------------------------------------------------------------------------------------------- serve


def test_serve_on_a_busy_port_exits_6_not_uvicorns_3():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _pdplan("serve", "--port", str(port), timeout=120)
    assert r.returncode == cli.EXIT_SERVER == 6
    assert "address already in use" in r.stderr  # uvicorn's own log line
    assert r.stderr.rstrip().splitlines()[-1] == "error: serve: uvicorn stopped with status 3 (its log above says why)"


# ------------------------------------------------------------------------------------------ validate


def _no_measuring(monkeypatch):
    import calculator.microbench as mb

    def run(**_kwargs):
        raise AssertionError("measured before checking --out")

    monkeypatch.setattr(mb, "run", run)


def test_validate_out_under_a_file_fails_before_measuring(tmp_path, monkeypatch):
    _no_measuring(monkeypatch)
    (tmp_path / "somefile").write_text("")
    r = _invoke("validate", "--quick", "--out", str(tmp_path / "somefile" / "sub"))
    assert r.exit_code == cli.EXIT_OUTPUT == 4
    assert r.output == f"error: out: {tmp_path / 'somefile' / 'sub'}: a part of the path is a file, not a directory\n"


def test_validate_out_that_is_a_file_fails_before_measuring(tmp_path, monkeypatch):
    _no_measuring(monkeypatch)
    (tmp_path / "somefile").write_text("")
    r = _invoke("validate", "--out", str(tmp_path / "somefile"))
    assert r.exit_code == 4 and r.output == f"error: out: {tmp_path / 'somefile'} exists and is not a directory\n"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only directories")
def test_validate_out_in_a_read_only_directory_fails_before_measuring(tmp_path, monkeypatch):
    _no_measuring(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    r = _invoke("validate", "--out", str(ro / "sub"))
    assert r.exit_code == 4 and "cannot write there" in r.output


def test_validate_out_is_created_before_measuring(tmp_path, monkeypatch):
    import calculator.microbench as mb

    out = tmp_path / "a" / "b"

    def run(**kwargs):
        assert out.is_dir() and kwargs["out_dir"] is None  # created first; written by the CLI afterwards
        raise mb.TorchMissingError("torch and transformers are needed")

    monkeypatch.setattr(mb, "run", run)
    r = _invoke("validate", "--out", str(out))
    assert r.exit_code == 2 and r.output == "error: torch and transformers are needed\n"


def test_validate_measurement_failure_exits_5(monkeypatch):
    import calculator.microbench as mb

    def run(**_kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(mb, "run", run)
    r = _invoke("validate", "--quick")
    assert r.exit_code == cli.EXIT_MEASUREMENT == 5
    assert r.output == "error: the measurement failed: CUDA error: out of memory\n"


def test_real_validate_with_a_bad_out_returns_at_once(tmp_path):
    (tmp_path / "somefile").write_text("")
    t0 = time.perf_counter()
    r = _pdplan("validate", "--out", str(tmp_path / "somefile" / "sub"), timeout=60)  # the full grid takes minutes
    assert r.returncode == 4, r.stderr
    assert _one_line(r.stderr).startswith("error: out: ")
    assert time.perf_counter() - t0 < 30


def test_a_pool_layout_error_names_the_pool_field():
    r = _invoke("evaluate", "deepseek-v3", "--rate", "2", "--isl", "2000", "--osl", "500",
                "--prefill", "h200-sxm:tp8", "--decode", "h200-sxm:dp8:ep4", "--weight-dtype", "fp8")
    assert r.exit_code == 2
    assert "deployment.decode.ep: with attention data-parallelism" in r.output


def test_user_text_in_an_error_is_echoed_as_typed():
    """Rich reads ``:x:`` as an emoji code: an unknown model id ``my:x:model`` must come back as typed, not as
    ``my❌model`` (every console the CLI prints to has emoji off)."""
    r = _invoke("estimate", "my:x:model", "h100-sxm")
    assert r.exit_code == 2 and "'my:x:model'" in r.output and "\u274c" not in r.output
    r = _invoke("plan", "llama-3.1-8b", "--rate", "4", "--ttft", "1s", "--tpot", "50ms", "--gpu", "h100:fire:sxm")
    assert r.exit_code == 2 and "h100:fire:sxm" in r.output
