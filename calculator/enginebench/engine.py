"""vLLM's OpenAI-compatible server as a child process: its command line per configuration, start-up
bounded in time, and a stop that always ends the whole process group it started (by its own PID).

The CPU build's snags (see docs/engine-validation.md): the module entry point rather than the
``vllm`` console script, ``--block-size`` a multiple of 32, the KV cache space in GiB by
``VLLM_CPU_KVCACHE_SPACE``, and the engine's OpenMP threads pinned by ``VLLM_CPU_OMP_THREADS_BIND``.
Prefix caching is off: the serving model under test charges every prompt in full.

The engine core (scheduler and model worker in one process: ``--distributed-executor-backend uni``
with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) is pinned to one core; its API server runs on the
front-end cores. With vLLM's default process layout the engine core spin-waits on a separate worker
process and an instance keeps ~1.7 cores busy, so two instances on two cores (1P1D) starve each
other; and with the API server on the engine's own core, its per-token streaming work slows the
steps by an amount that depends on the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from ..microbench.ceilings import TORCH_DTYPES
from .client import HTTPError, get

HOST = "127.0.0.1"
START_TIMEOUT_S = 300.0
MAX_NUM_SEQS = 64
"""The engine's cap on running sequences (``--max-num-seqs``), and the pool's ``max_batch``."""
MAX_MODEL_LEN = 2048
KV_CACHE_GIB = 1
BLOCK_SIZE = 32


@dataclass(frozen=True)
class EngineConfig:
    """One scheduler configuration under test."""

    name: str
    chunk_tokens: int | None  # None: chunked prefill off (a prompt is one chunk of a step's 2048-token budget)
    disaggregated: bool = False

    @property
    def budget_tokens(self) -> int:
        """The step's token budget (``--max-num-batched-tokens``)."""
        return self.chunk_tokens or MAX_MODEL_LEN


CONFIGS = {
    "off": EngineConfig("chunking off", None),
    "chunk256": EngineConfig("chunk 256", 256),
    "chunk64": EngineConfig("chunk 64", 64),
    "1p1d": EngineConfig("1P1D (disaggregated)", None, disaggregated=True),
}


@dataclass(frozen=True)
class CoreLayout:
    """Which cores each process of a configuration runs on: an engine core per instance, the API server(s) and
    the load client. ``None``: not pinned (it shares every core the run has)."""

    engines: tuple[int, ...]
    front_ends: tuple[frozenset[int] | None, ...]  # one per instance
    client: frozenset[int] | None

    @property
    def shared(self) -> bool:
        """Whether two of its processes share a core (an unpinned one shares them all)."""
        placed = [frozenset({c}) for c in self.engines] + list(self.front_ends) + [self.client]
        return any(a is None or b is None or bool(a & b) for a, b in itertools.combinations(placed, 2))

    def describe(self) -> str:
        """The layout in words, for the report, e.g. "engine core on core 0, API server on core 1, client on
        core 2"."""
        n = len(self.engines)
        parts = [("engine core on " if n == 1 else "engine cores on ") + _cores_text(frozenset(self.engines))]
        if all(f is None for f in self.front_ends):
            parts.append(("API server" if n == 1 else "API servers") + " unpinned")
        elif len(set(self.front_ends)) == 1:
            parts.append(("API server on " if n == 1 else "API servers on ") + _cores_text(self.front_ends[0]))
        else:
            parts += [f"API server {i + 1} on {_cores_text(f)}" for i, f in enumerate(self.front_ends) if f]
        parts.append("client unpinned" if self.client is None else "client on " + _cores_text(self.client))
        return ", ".join(parts)


def _cores_text(cores: frozenset[int]) -> str:
    c = [str(x) for x in sorted(cores)]
    return f"core {c[0]}" if len(c) == 1 else "cores " + ", ".join(c[:-1]) + " and " + c[-1]


def core_layout(cores: set[int] | frozenset[int], instances: int) -> CoreLayout:
    """Where a configuration's processes run on a machine with ``cores``: each engine core alone on a core
    (the lowest ones), then, as cores allow, the API servers and the client on cores of their own, so that no
    front end takes time from a step. On 2 cores a co-located engine's API server and the client share the
    other core, and 1P1D's front ends share the engines' cores (the layout of the runs committed so far); with
    3 cores every process of a co-located configuration has a core of its own; 1P1D needs 5 for that (with 3
    its front ends and the client share the third, with 4 its two API servers share one)."""
    c = sorted(cores)
    if not c:
        raise ValueError("cores: the run has no core to pin to")
    engines = tuple(c[min(i, len(c) - 1)] for i in range(instances))
    rest = c[instances:]
    if not rest:
        return CoreLayout(engines, (None,) * instances, None)
    if len(rest) == 1:
        one = frozenset(rest)
        return CoreLayout(engines, (one,) * instances, one)
    fronts = rest[:-1]
    front_ends = tuple(frozenset({fronts[min(i, len(fronts) - 1)]}) for i in range(instances))
    return CoreLayout(engines, front_ends, frozenset({rest[-1]}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def server_argv(python: str, model_dir: Path, served_name: str, port: int, cfg: EngineConfig,
                kv_role: str | None = None, kv_dir: Path | None = None, dtype: str = "bf16") -> list[str]:
    """The engine's command line; ``dtype``: the precision the model is served in (bf16 where the CPU
    computes it natively, else fp32: ``calculator.microbench.ceilings.model_dtype``)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", served_name, "--host", HOST, "--port", str(port), "--dtype", TORCH_DTYPES[dtype],
            "--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", str(MAX_NUM_SEQS), "--no-enable-prefix-caching",
            "--max-num-batched-tokens", str(cfg.budget_tokens), "--distributed-executor-backend", "uni",
            "--uvicorn-log-level", "warning"]
    if cfg.chunk_tokens is None:
        argv.append("--no-enable-chunked-prefill")
    if kv_role is not None:
        argv += ["--kv-transfer-config", json.dumps({
            "kv_connector": "ExampleConnector", "kv_role": kv_role,
            "kv_connector_extra_config": {"shared_storage_path": str(kv_dir)}})]
    return argv


class EngineStartError(RuntimeError):
    """The engine did not answer /health in time or exited; the message ends with its log's tail."""


class Server:
    """One engine process group; ``with Server(...) as s:`` starts it and always stops it."""

    def __init__(self, argv: list[str], log_path: Path, core: int, port: int, front_cores: set[int] | None = None):
        self.argv, self.log_path, self.core, self.port = argv, log_path, core, port
        self.front_cores = front_cores
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB), VLLM_CPU_OMP_THREADS_BIND=str(self.core),
                   OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1",
                   DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.log = self.log_path.open("wb")
        front = self.front_cores

        def pin() -> None:  # in the child, before exec: the API server on the front-end cores
            if front:
                with contextlib.suppress(AttributeError, OSError):
                    os.sched_setaffinity(0, front)

        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=pin)  # noqa: PLW1509 (no threads here)
        try:
            self._wait_healthy()
            self.pin_engine()
        except BaseException:
            self.stop()
            raise
        return self

    def group_pids(self) -> list[int]:
        """The processes of the engine's process group (Linux /proc)."""
        assert self.proc is not None
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) == self.proc.pid:
                        out.append(int(d.name))
        return out

    def engine_cpu_s(self) -> float:
        """CPU seconds the engine-core process(es) have used (user + system, Linux /proc)."""
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        for pid in self.group_pids():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::"):
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def pin_engine(self) -> None:
        """Every thread of the engine-core process(es) onto ``core`` (threads they start later inherit it)."""
        for pid in self.group_pids():
            with contextlib.suppress(OSError):
                if not Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::"):
                    continue
                for task in Path(f"/proc/{pid}/task").iterdir():
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(int(task.name), {self.core})

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise EngineStartError(f"the engine exited with status {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, HTTPError, asyncio.TimeoutError):
                asyncio.run(asyncio.wait_for(get(HOST, self.port, "/health"), 5))
                return
            time.sleep(1.0)
        raise EngineStartError(f"the engine did not answer /health within {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM to the process group the engine leads (its own PID), SIGKILL after 20 s."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # workers left behind by a clean exit
        self.proc = None
        self.log.close()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def check_engine(python: str) -> str | None:
    """vLLM's version in ``python``'s environment, or None when it cannot be imported there."""
    try:
        r = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                           capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return r.stdout.strip()
