"""The device's two roofline ceilings, measured: matmul FLOP/s and copy bandwidth; and the GPUSpec they make.

Matmul: ``n x n @ n x n`` in the models' precision (and fp32 for the record) over several ``n``;
2 n^3 FLOP per call; the ceiling is the best size. Bandwidth: one large buffer copied into another,
``2 x bytes`` (read + written) per call, the buffer far larger than the last-level cache.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from hardware_db.schema import Efficiency, GPUSpec, PeakTflops

from .results import Ceilings, MatmulSample
from .timing import Guard, median_s

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def cpu_model_name() -> str:
    """'model name' from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "neon", "sve")


def cpu_details() -> str:
    """Logical CPUs, last-level cache and the matmul-relevant ISA flags, from /proc/cpuinfo (Linux)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip().lower(), value.strip())
    except OSError:
        return f"{os.cpu_count()} logical CPUs"
    flags = set((info.get("flags") or info.get("features") or "").split())
    have = [f for f in CPU_FEATURES if f in flags]
    parts = [f"{os.cpu_count()} logical CPUs"]
    if info.get("cache size"):
        parts.append(f"cache {info['cache size']}")
    parts.append("ISA: " + (" ".join(have) if have else "none of " + " ".join(CPU_FEATURES)))
    return "; ".join(parts)


def ram_bytes() -> float:
    """MemTotal from /proc/meminfo, else the sysconf page count."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of x86 CPUs with bf16 matrix instructions; without them torch emulates bf16
matmuls some 10-50x slower than fp32 (an AVX2-only EPYC: ~1 GFLOP/s bf16 against ~45 fp32)."""


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (x86 flags above; Arm and others: assumed yes)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    if not flags:  # not x86 (no 'flags' lines): bf16 support is not read here
        return True
    return any(f in flags for f in CPU_BF16_FLAGS)


def model_dtype(device: str) -> str:
    """The precision the models run in: bf16 where the device runs it natively, fp16 on pre-Ampere
    GPUs, fp32 on a CPU that would emulate bf16."""
    import torch

    if device == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_has_bf16() else "fp32"


def measure_matmul(device: str, dtype: str, n: int, guard: Guard, repeats: int) -> MatmulSample:
    import torch

    gen = torch.Generator(device=device).manual_seed(n)
    tdt = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(n, n, device=device, dtype=tdt, generator=gen)
    b = torch.randn(n, n, device=device, dtype=tdt, generator=gen)
    out = torch.empty(n, n, device=device, dtype=tdt)
    with torch.inference_mode():
        t = median_s(guard.measure(lambda: lambda: torch.matmul(a, b, out=out), 1, repeats, device))
    return MatmulSample(dtype=dtype, n=n, time_s=t, flops_per_s=2.0 * n**3 / t)


def measure_copy(device: str, nbytes: int, guard: Guard, repeats: int) -> float:
    """Median seconds of one copy of ``nbytes`` bytes into another buffer."""
    import torch

    src = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    return median_s(guard.measure(lambda: lambda: dst.copy_(src), 2, repeats, device))


def measure_ceilings(device: str, sizes: tuple[int, ...], copy_bytes: int, threads: int, quick: bool,
                     guard: Guard) -> Ceilings:
    import torch

    dtype = model_dtype(device)
    repeats = 3 if quick else 5
    samples = [measure_matmul(device, dt, n, guard, repeats) for dt in dict.fromkeys((dtype, "fp32")) for n in sizes]
    copy_bytes = copy_bytes // 4 * 4
    copy_s = measure_copy(device, copy_bytes, guard, 5 if quick else 9)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, total = props.name, float(props.total_memory)
        details = f"compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs"
    else:
        name, total, details = cpu_model_name(), ram_bytes(), cpu_details()
    return Ceilings(
        device=device, device_name=name, device_details=details, threads=threads if device == "cpu" else 0,
        dtype=dtype,
        matmul=tuple(samples), matmul_flops_per_s=max(s.flops_per_s for s in samples if s.dtype == dtype),
        copy_bytes=copy_bytes, copy_time_s=copy_s, memory_bytes_per_s=2.0 * copy_bytes / copy_s,
        memory_total_bytes=total,
    )


def best_of(first: Ceilings, second: Ceilings) -> Ceilings:
    """The better of two measurements of the same ceilings (each is an upper bound the device reached)."""
    fast = {(s.dtype, s.n): s for s in first.matmul}
    for s in second.matmul:
        if s.flops_per_s > fast[(s.dtype, s.n)].flops_per_s:
            fast[(s.dtype, s.n)] = s
    matmul = tuple(fast[(s.dtype, s.n)] for s in first.matmul)
    copy = min((first, second), key=lambda c: c.copy_time_s)
    return first.model_copy(update={
        "matmul": matmul, "matmul_flops_per_s": max(s.flops_per_s for s in matmul if s.dtype == first.dtype),
        "copy_time_s": copy.copy_time_s, "memory_bytes_per_s": copy.memory_bytes_per_s,
    })


def _peaks(dtype: str, tflops: float) -> PeakTflops:
    """The measured matmul rate as the peak of the models' precision. An fp32 device records it as its
    fp32 peak, and as bf16 too, which the schema requires and nothing of an fp32 run reads."""
    return PeakTflops(bf16=tflops, fp32=tflops) if dtype == "fp32" else PeakTflops(bf16=tflops)


def device_spec(c: Ceilings, efficiency: Efficiency | None = None, date: str = "") -> GPUSpec:
    """A GPUSpec whose ceilings are the measured ones (FLOP/s in the models' precision, copy bandwidth).

    Link bandwidths, TDP and price are placeholders: a single device at tp=1 never uses them.
    """
    flops = c.matmul_flops_per_s / 1e12
    bw = c.memory_bytes_per_s / 1e12
    what = f"{c.threads} threads" if c.device == "cpu" else "CUDA"
    return GPUSpec(
        id=f"{c.device}-local", name=f"{c.device_name} ({what}, measured)", vendor="measured",
        architecture=c.device, peak_tflops=_peaks(c.dtype, flops), hbm_gb=c.memory_total_bytes / 1e9,
        memory_type="RAM" if c.device == "cpu" else "device memory", hbm_bandwidth_tb_s=bw,
        scaleup_bandwidth_gb_s=bw * 1e3, scaleup_domain_gpus=1, scaleout_bandwidth_gb_s=bw * 1e3,
        tdp_w=1.0, price_usd_per_hour=1.0, price_is_assumption=True,
        confidence="high", efficiency=efficiency or Efficiency(),
        sources=(f"measured by calculator.microbench{' on ' + date if date else ''}",),
        notes=f"peak = best {c.dtype} matmul, bandwidth = {c.copy_bytes / 2**20:.0f} MiB copy (read + write); "
              "links, TDP and price are placeholders (unused at tp=1)",
    )
