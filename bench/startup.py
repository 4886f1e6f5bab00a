"""Whole-process wall time of short pdplan commands: start-up included, as a user at a shell sees it.

    python bench/startup.py [--n 10] [--root PATH]

Each command runs ``--n`` times in a fresh ``python3`` (after one unmeasured warm-up run) and the
median, fastest and slowest wall times are printed as a Markdown table with the machine and the
0.3 s target, with the median CPU time (user + system) beside them: on a busy machine the wall time
grows with the load average, the CPU time much less.
``pdplan ...`` rows call the console script's entry point, ``calculator.cli:main``, directly (what
the installed ``pdplan`` script does, without a version manager's shim in front of it). ``--root``
times another checkout (it goes first on PYTHONPATH; default: the one holding this file).

Bytecode is cached, as after ``pip install``: the runs write and reuse ``.pyc`` files under a
temporary ``PYTHONPYCACHEPREFIX``, even where ``PYTHONDONTWRITEBYTECODE`` is set. ``--no-bytecode``
keeps that variable set instead, so every run compiles the sources it imports.
A benchmark, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.3
PDPLAN = ["-c", "import sys; from calculator.cli import main; sys.argv[0] = 'pdplan'; sys.exit(main())"]
COMMANDS: list[tuple[str, list[str]]] = [
    ("pdplan --help", [*PDPLAN, "--help"]),
    ("pdplan estimate llama-3.1-70b h200-sxm --tp 4 --isl 4000 --osl 500",
     [*PDPLAN, "estimate", "llama-3.1-70b", "h200-sxm", "--tp", "4", "--isl", "4000", "--osl", "500"]),
    ("pdplan plan llama-3.1-70b --rate 12 --isl 4000 --osl 500 --ttft 2s --tpot 50ms --gpu h100-sxm --gpu h200-sxm",
     [*PDPLAN, "plan", "llama-3.1-70b", "--rate", "12", "--isl", "4000", "--osl", "500", "--ttft", "2s",
      "--tpot", "50ms", "--gpu", "h100-sxm", "--gpu", "h200-sxm"]),
    ('python3 -c "import calculator"', ["-c", "import calculator"]),
    ('python3 -c "pass" (the interpreter alone, for reference)', ["-c", "pass"]),
]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_once_s(argv: list[str], root: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Wall time and CPU time (user + system) of one process run in ``root`` (``-c`` puts the working
    directory first on sys.path), and its exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], check=False, cwd=root, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def time_all(root: Path, env: dict[str, str], n: int) -> list[str]:
    """One Markdown row per command."""
    rows = []
    for label, argv in COMMANDS:
        time_once_s(argv, root, env)  # warm-up: page cache, __pycache__
        runs = [time_once_s(argv, root, env) for _ in range(n)]
        times = [t for t, _, _ in runs]
        cpu = statistics.median(c for _, c, _ in runs)
        failed = sorted({rc for _, _, rc in runs if rc != 0})
        median = statistics.median(times)
        verdict = f"exit {failed}" if failed else ("yes" if median <= TARGET_S else "no")
        rows.append(f"| `{label}` | {median:.3f} | {min(times):.3f} | {max(times):.3f} | {cpu:.3f} | {verdict} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10, help="timed runs per command")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to time")
    ap.add_argument("--no-bytecode", action="store_true", help="compile every import in every run (no .pyc)")
    a = ap.parse_args()
    root = a.root.resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory(prefix="pdplan-pyc-") as pyc:
        if a.no_bytecode:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = pyc
        rows = time_all(root, env, a.n)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(f"Machine: {cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}; "
          f"load average {load}; {a.n} runs each; bytecode {'not cached' if a.no_bytecode else 'cached'}; "
          f"checkout {root}\n")
    print(f"| command | median s | min s | max s | CPU s (median) | median <= {TARGET_S} s |")
    print("|---|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
