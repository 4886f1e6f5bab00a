"""Fleet planning throughput: ``pdplan batch`` (``calculator.fleet.plan_many``) over seeded random
scenarios, in one process, in the process pool and on a local Ray instance; checks that every path
gives the same rows and prints plans/s and plans/s per core.

    python bench/batch_speed.py [--scenarios 1000] [--ray]

``--ray`` starts a Ray head on 127.0.0.1 (``ray start --head``), plans through it and stops it.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import cpu_name

from calculator.fleet import plan_many

MODELS = ("llama-3.1-8b", "qwen2.5-7b", "mistral-7b", "gemma-2-9b")
GPUS = ("l4", "l40s", "a100-sxm-80gb", "h100-sxm")


def scenarios(n: int, seed: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """``n`` small-model plans on one or two GPU types: chat to long-prompt traffic, loose to tight
    SLOs (some infeasible), and every 50th one invalid (a negative rate) so error rows are exercised."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        raw: dict[str, Any] = {
            "model": rng.choice(MODELS),
            "workload": {"rate": round(rng.uniform(0.5, 40.0), 2), "isl": rng.choice((256, 1000, 3000, 8000)),
                         "osl": rng.choice((64, 200, 500))},
            "slo": {"ttft_s": rng.choice((0.3, 1.0, 3.0)), "tpot_s": rng.choice((0.02, 0.05, 0.1))},
            "gpus": rng.sample(GPUS, rng.choice((1, 2))),
        }
        if i % 50 == 49:
            raw["workload"]["rate"] = -1.0
        out.append((f"s{i:05d}", raw))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRay:
    """A Ray head on 127.0.0.1 for the duration of a ``with`` block (``ray start`` / ``ray stop``).

    The head and this process (the driver) must agree on Ray's token authentication: Ray turns it on
    for a head whenever ~/.ray/auth_token exists (any earlier ``ray.init()`` writes one), and a driver
    that does not send the token is refused. Both get the caller's ``RAY_AUTH_MODE``, else "disabled"
    (the head listens on 127.0.0.1 only)."""

    def __init__(self, cpus: int) -> None:
        self.cpus, self.port = cpus, free_port()
        self.tmp = tempfile.mkdtemp(prefix="pdplan-ray-")
        self.auth = os.environ.get("RAY_AUTH_MODE", "disabled")
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": self.auth}
        self._saved: str | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._saved = os.environ.get("RAY_AUTH_MODE")
        os.environ["RAY_AUTH_MODE"] = self.auth
        ray = Path(sys.executable).with_name("ray")
        try:
            subprocess.run([str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={self.port}",
                            f"--num-cpus={self.cpus}", "--include-dashboard=false", "--disable-usage-stats",
                            f"--temp-dir={self.tmp}"], check=True, env=self.env, capture_output=True, timeout=180)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        ray = Path(sys.executable).with_name("ray")
        subprocess.run([str(ray), "stop", "--force"], env=self.env, capture_output=True, timeout=120, check=False)
        if self._saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = self._saved


def timed(label: str, cores: int, **kw: Any) -> list[Any]:
    t = time.perf_counter()
    rows = plan_many(**kw)
    dt = time.perf_counter() - t
    n = len(rows)
    print(f"{label:<28} {n} plans in {dt:6.1f} s: {n / dt:6.1f} plans/s, {n / dt / cores:5.1f} plans/s per core")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", type=int, default=1000)
    ap.add_argument("--ray", action="store_true", help="also plan through a local Ray instance")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    items = scenarios(args.scenarios)
    print(f"{cpu_name()} ({cores} cores), Python {platform.python_version()}")
    serial = timed("one process", 1, scenarios=items[:200], workers=1)
    pool = timed(f"process pool ({cores} workers)", cores, scenarios=items)
    assert [r for r in pool[:200]] == serial, "the process pool's rows differ from one process's"
    if args.ray:
        with LocalRay(cores) as ray:
            on_ray = timed(f"Ray at {ray.address}", cores, scenarios=items, ray_address=ray.address)
        assert on_ray == pool, "Ray's rows differ from the process pool's"
        print(f"identical rows: {len(pool)} through the process pool and Ray")
    status = {s: sum(r.status == s for r in pool) for s in ("feasible", "infeasible", "error")}
    print("rows:", ", ".join(f"{v} {k}" for k, v in status.items()))


if __name__ == "__main__":
    main()
