"""Wall-clock timing of a device call: warm-up, timed repeats, median; and a guard against a stalled machine.

On CUDA each repeat is bracketed by events and the device is synchronised, so queued kernels are
counted; on CPU ``time.perf_counter`` brackets the call, which returns when the work is done.

On a small shared CPU (a 2-vCPU VM) the host sometimes stops running one of the vCPUs for seconds,
or another process takes a core; every parallel region then waits for it and the whole machine runs
several times slower. ``Guard`` times a short probe matmul: its baseline is taken once the probe on
all threads beats the same probe on one thread (parallelism works), and the best time seen after
that; before and after each point it waits until the probe is back within ``tolerance`` of the
baseline. A point whose repeats spread too much, or after which the probe is slow, is measured again.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def time_call_s(fn: Callable[[], Any], warmup: int, repeats: int, device: str) -> tuple[float, ...]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
    import torch

    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(round(start.elapsed_time(end) * 1e-3, 7))  # elapsed_time is in ms
        return tuple(samples)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(round(time.perf_counter() - t0, 7))  # 0.1 us: far below the noise
    return tuple(samples)


def median_s(samples: tuple[float, ...]) -> float:
    return float(statistics.median(samples))


@dataclass
class Guard:
    """Waits until a CPU runs at its best speed again; a no-op on CUDA (``probe`` None)."""

    probe: Callable[[], Any] | None
    tolerance: float = 1.3
    max_wait_s: float = 10.0
    baseline_s: float = float("inf")
    waited_s: float = 0.0
    timeouts: int = 0
    remeasured: int = 0
    unstable: int = 0

    @classmethod
    def for_device(cls, device: str, max_wait_s: float, dtype: str = "bf16") -> Guard:
        """A guard whose probe is a 512 x 512 matmul in the models' precision (``bf16`` or ``fp32``)."""
        if device != "cpu":
            return cls(None)
        import torch

        tdt = torch.float32 if dtype == "fp32" else torch.bfloat16
        a = torch.randn(512, 512, dtype=tdt)
        b = torch.randn(512, 512, dtype=tdt)
        out = torch.empty(512, 512, dtype=tdt)
        guard = cls(lambda: torch.matmul(a, b, out=out), max_wait_s=max_wait_s)
        guard.calibrate(torch.get_num_threads())
        return guard

    def probe_s(self) -> float:
        assert self.probe is not None
        samples = time_call_s(self.probe, 1, 3, "cpu")
        t = median_s(samples)
        self.baseline_s = min(self.baseline_s, t)
        return t

    def calibrate(self, threads: int, min_s: float = 0.3, min_probes: int = 10) -> None:
        """Wait until the probe on ``threads`` threads beats it on one thread, then probe for a while for the baseline."""
        if self.probe is None:
            return
        import torch

        t0 = time.perf_counter()
        while threads > 1:
            torch.set_num_threads(1)
            one = median_s(time_call_s(self.probe, 1, 3, "cpu"))
            torch.set_num_threads(threads)
            many = median_s(time_call_s(self.probe, 1, 3, "cpu"))
            if many < 0.85 * one:
                break
            if time.perf_counter() - t0 > self.max_wait_s:
                self.timeouts += 1
                break
        self.waited_s += time.perf_counter() - t0
        t0, n = time.perf_counter(), 0
        while n < min_probes or time.perf_counter() - t0 < min_s:
            self.probe_s()
            n += 1

    def ok(self) -> bool:
        return self.probe is None or self.probe_s() <= self.tolerance * self.baseline_s

    def wait(self) -> None:
        """Return once the probe is within tolerance of the baseline, or after ``max_wait_s``."""
        if self.probe is None:
            return
        t0 = time.perf_counter()
        while not self.ok():
            if time.perf_counter() - t0 > self.max_wait_s:
                self.timeouts += 1
                break
        self.waited_s += time.perf_counter() - t0

    def measure(self, make_fn: Callable[[], Callable[[], Any]], warmup: int, repeats: int, device: str,
                retries: int = 2, max_spread: float = 1.3) -> tuple[float, ...]:
        """Timed samples of a fresh ``make_fn()``, taken again (up to ``retries``) when the machine stalled.

        Stalled: the median sample is over ``max_spread`` x the fastest (a single slow sample is not), or
        the probe is slow right after.
        """
        samples: tuple[float, ...] = ()
        for attempt in range(retries + 1):
            self.wait()
            samples = time_call_s(make_fn(), warmup, repeats, device)
            if median_s(samples) <= max_spread * min(samples) and self.ok():
                self.remeasured += attempt > 0
                return samples
        self.remeasured += 1
        self.unstable += 1
        return samples
