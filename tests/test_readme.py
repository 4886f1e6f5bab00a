"""Every ```bash and ```python example of README.md runs: shell commands in a subprocess (``curl``
against a ``pdplan serve`` started on a free port), Python blocks in this process. Skipped, each by
name: lines that install packages, start a long-running server or run the tests or the
microbenchmark. A ``# 404`` or ``# 422`` after a request is the status it documents."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SKIP = (
    (re.compile(r"\bpip install\b"), "installs packages"),
    (re.compile(r"\b(pdplan|mkdocs) serve\b"), "starts a long-running server"),
    (re.compile(r"\bpytest\b"), "runs the test suite"),
    (re.compile(r"\bpdplan validate\b"), "runs the torch microbenchmark"),
)
TIMEOUT_S = 120
STATUS = re.compile(r"#\s*(4\d\d|5\d\d)\b")


def _blocks() -> list[tuple[str, str, int]]:
    text = README.read_text(encoding="utf-8")
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2) for m in BLOCK.finditer(text)]


def _commands(body: str, first_line: int) -> list[tuple[str, str, int]]:
    """(command, the comment that documents its answer, line) for each shell command: continued
    lines joined, comment-only lines (a documented answer) attached to the command before them."""
    out: list[tuple[str, str, int]] = []
    pending, start = "", 0
    for i, line in enumerate(body.splitlines()):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            if stripped and out:
                command, comment, at = out[-1]
                out[-1] = (command, f"{comment} {stripped}".strip(), at)
            continue
        if not pending:
            start = first_line + i
        if stripped.endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        if (pending + line).count("'") % 2:  # a quoted -d body goes on to the next line
            pending += line + "\n"
            continue
        command, pending = pending + line, ""
        _, hash_, comment = command.partition(" # ")
        out.append((command, hash_.strip() + " " + comment if hash_ else "", start))
    return out


def _cases() -> list:
    cases = []
    for lang, body, line in _blocks():
        if lang == "python":
            cases.append(pytest.param("python", body, str(line), id=f"README.md:{line} python"))
            continue
        for command, comment, at in _commands(body, line):
            reason = next((why for pattern, why in SKIP if pattern.search(command)), None)
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            cases.append(pytest.param("bash", command, comment, id=f"README.md:{at} {command.split()[0]}", marks=marks))
    return cases


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDPLAN_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's pdplan first
    return env


@pytest.fixture(scope="module")
def server():
    """``pdplan serve`` on a free port for the curl examples; its base URL."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from calculator.cli import main; sys.exit(main())",
                             "serve", "--port", str(port), "--deadline", "60s"], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"pdplan serve exited with {proc.returncode}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the shell examples run: a folder that links every top-level entry of the checkout (they name
    files relative to it), so that a file an example writes (``--out cal.yaml``) lands there, not in the
    checkout."""
    d = tmp_path_factory.mktemp("readme")
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (d / entry.name).symlink_to(entry)
    return d


def test_the_readme_has_examples():
    kinds = [lang for lang, _, _ in _blocks()]
    assert kinds.count("bash") >= 3 and kinds.count("python") >= 3


@pytest.fixture(scope="module")
def python_session() -> dict:
    """The README's Python blocks are one session: a later block uses the names of the earlier ones."""
    return {"namespace": {"__name__": "readme_example"}, "ran": set()}


def _run_python(session: dict, upto: int) -> None:
    """Run the README's Python blocks in order up to the one starting at line ``upto``, each once."""
    for lang, body, line in _blocks():
        if lang != "python" or line > upto or line in session["ran"]:
            continue
        session["ran"].add(line)
        exec(compile("\n" * (line - 1) + body, str(README), "exec"), session["namespace"])  # noqa: S102


@pytest.mark.parametrize("lang, code, comment", _cases())
def test_readme_example_runs(lang, code, comment, request, monkeypatch):
    if lang == "python":
        monkeypatch.chdir(ROOT)  # examples name files relative to the checkout
        _run_python(request.getfixturevalue("python_session"), int(comment))
        return
    if code.startswith("curl "):
        code = code.replace("localhost:8000", request.getfixturevalue("server").removeprefix("http://"))
    r = subprocess.run(["bash", "-c", code], cwd=request.getfixturevalue("workdir"), env=_env(), capture_output=True,
                       text=True, timeout=TIMEOUT_S, check=False)
    assert r.returncode == 0, f"{code}\n{r.stderr}"
    if code.startswith("curl "):
        body = json.loads(r.stdout)
        status = STATUS.match(comment.strip())
        assert ("detail" in body) == bool(status), (code, body)
