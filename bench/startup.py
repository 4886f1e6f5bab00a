"""Whole-process wall time of short pdplan commands: start-up included, as a user at a shell sees it.

    python bench/startup.py [--n 10] [--root PATH ...] [--no-bytecode]

Each command runs ``--n`` times in a fresh ``python3``, after one unmeasured warm-up run. The runs
are interleaved (round after round of every command of every checkout), so a change in the
machine's load hits all rows alike. For each command the median, fastest and slowest wall times
are printed as a Markdown table with the machine and the 0.3 s target, with the median CPU time
(user + system) beside them: on a busy machine the wall time grows with the load, the CPU time less.

``pdplan ...`` rows call the console script's entry point, ``calculator.cli:main``, directly (what
the installed ``pdplan`` script does, without a version manager's shim in front of it). ``--root``
times another checkout, or several to compare them (each goes first on PYTHONPATH and is the
working directory; default: the checkout holding this file).

Bytecode is cached, as after ``pip install``: the runs write and reuse ``.pyc`` files under a
temporary ``PYTHONPYCACHEPREFIX``, even where ``PYTHONDONTWRITEBYTECODE`` is set. ``--no-bytecode``
sets that variable instead, so every run compiles the sources it imports.
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

from machine import cpu_name  # bench/machine.py

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


def environment(root: Path, pyc: str | None) -> dict[str, str]:
    """The environment a run of ``root`` gets: the checkout first on PYTHONPATH, bytecode as chosen."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    if pyc is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pyc
    return env


def table(runs: dict[str, list[tuple[float, float, int]]]) -> str:
    """The Markdown table of one checkout's runs, by command label."""
    lines = [f"| command | median s | min s | max s | CPU s (median) | median <= {TARGET_S} s |",
             "|---|---:|---:|---:|---:|---|"]
    for label, results in runs.items():
        walls = [w for w, _, _ in results]
        cpu = statistics.median(c for _, c, _ in results)
        failed = sorted({rc for _, _, rc in results if rc != 0})
        median = statistics.median(walls)
        verdict = f"exit {failed}" if failed else ("yes" if median <= TARGET_S else "no")
        lines.append(f"| `{label}` | {median:.3f} | {min(walls):.3f} | {max(walls):.3f} | {cpu:.3f} | {verdict} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10, help="timed runs per command")
    ap.add_argument("--root", type=Path, action="append", help="checkout to time (repeat to compare several)")
    ap.add_argument("--no-bytecode", action="store_true", help="compile every import in every run (no .pyc)")
    a = ap.parse_args()
    roots = [r.resolve() for r in (a.root or [Path(__file__).resolve().parents[1]])]
    runs: dict[Path, dict[str, list[tuple[float, float, int]]]] = {r: {label: [] for label, _ in COMMANDS}
                                                                 for r in roots}
    with tempfile.TemporaryDirectory(prefix="pdplan-pyc-") as tmp:
        envs = {r: environment(r, None if a.no_bytecode else str(Path(tmp) / str(i))) for i, r in enumerate(roots)}
        for r in roots:
            for _, argv in COMMANDS:
                time_once_s(argv, r, envs[r])  # warm-up: page cache, bytecode
        for _ in range(a.n):
            for r in roots:
                for label, argv in COMMANDS:
                    runs[r][label].append(time_once_s(argv, r, envs[r]))

    load = " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(f"Machine: {cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}; load average {load}; "
          f"{a.n} runs each, interleaved; bytecode {'not cached' if a.no_bytecode else 'cached'}.")
    for r in roots:
        print(f"\nCheckout {r}:\n\n{table(runs[r])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
