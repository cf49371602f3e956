"""The number format a run computes in: `model.precision` is `auto`, `float32` or `bfloat16`.

`auto` reads the hardware, never a timing, so the same command on the same kind of machine
resolves the same way (the resolved format is part of every stage's key): a CUDA GPU that
supports bf16 computes in bf16; a CPU computes in bf16 only where its cores have bf16 matrix
instructions (AMX-BF16 or AVX512-BF16), where torch's bf16 matmuls run 3-10x its float32 ones
(measured on an Intel Xeon with AMX). Without them bf16 is emulated: on an AMD EPYC with AVX2
alone, a 1024x1024 bf16 matmul ran at 0.3-0.8 GFLOP/s against float32's 24 (`make bench-train`
prints both bounds), so those CPUs stay in float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Precision = Literal["float32", "bfloat16"]
PRECISION_SETTINGS = ("auto", "float32", "bfloat16")
# /proc/cpuinfo flags of the x86 instructions that compute bf16 products in hardware.
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where /proc/cpuinfo is absent)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_fast_bf16(flags: frozenset[str] | None = None) -> bool:
    return bool(BF16_CPU_FLAGS & (cpu_flags() if flags is None else flags))


def cuda_has_bf16() -> bool:
    """Whether a CUDA device here computes bf16. torch is imported only where an NVIDIA driver
    is present: config files are read on machines without one in well under a second."""
    if not any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidiactl")):
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_precision(
    setting: str, *, gpu_bf16: bool | None = None, flags: frozenset[str] | None = None
) -> Precision:
    """`setting` as the format to compute in on this machine (`gpu_bf16`: whether the work runs
    on a CUDA device with bf16; default: whether one is present; `flags`: the CPU's, default
    read from /proc/cpuinfo)."""
    if setting not in PRECISION_SETTINGS:
        raise ValueError(f"precision {setting!r}: use one of {', '.join(PRECISION_SETTINGS)}")
    if setting != "auto":
        return setting  # type: ignore[return-value]
    if gpu_bf16 is None:
        gpu_bf16 = cuda_has_bf16()
    return "bfloat16" if gpu_bf16 or cpu_has_fast_bf16(flags) else "float32"
