"""``dtype: auto``: bfloat16 only where the hardware runs it faster than float32, float32 otherwise.

On x86 CPUs without AVX-512-BF16 or AMX, bfloat16 matrix multiplies are emulated (measured on a
2-core AVX2 EPYC: about 1 GFLOP/s against 90 GFLOP/s in float32). AVX-512-BF16 alone is not enough
either: on a Xeon with avx512_bf16 but no AMX (torch 2.13, oneDNN, one thread) bfloat16 ran at
65-75 GFLOP/s against 75-150 in float32 for every decode and prefill shape of SmolLM2. Only AMX
tiles make it faster (1.5x at batch 32 on an AMX Xeon). CUDA devices that support bfloat16 get it;
MPS and other CPUs get float32.
"""

from __future__ import annotations

import platform
from pathlib import Path


def _cpuinfo(keys: tuple[str, ...], cpuinfo: Path) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line starting with one of ``keys``."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(keys):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The feature flags of the first processor in ``/proc/cpuinfo`` (empty where unreadable)."""
    return set((_cpuinfo(("flags", "Features"), cpuinfo) or "").split())


def processor_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name, for the records of measurements."""
    return _cpuinfo(("model name",), cpuinfo) or platform.processor() or platform.machine()


def choose_dtype(device: str = "cpu", *, flags: set[str] | None = None, cuda_bf16: bool | None = None) -> tuple[str, str]:
    """``(dtype name, reason)`` for ``device``; ``flags`` and ``cuda_bf16`` replace the probes (tests)."""
    if str(device).startswith("cuda"):
        if cuda_bf16 is None:
            import torch

            cuda_bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return ("bfloat16", "CUDA device supports bfloat16") if cuda_bf16 else ("float32", "CUDA device without bfloat16")
    if str(device) != "cpu":
        return "float32", f"device {device!r}: float32 unless asked otherwise"
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "bfloat16", "CPU has AMX-BF16 tiles: bfloat16 matmul is faster than float32"
    if "avx512_bf16" in flags:
        return "float32", "CPU has AVX-512-BF16 but no AMX: bfloat16 matmul is slower than float32 (measured 0.5-0.9x)"
    return "float32", "CPU has no AVX-512-BF16 or AMX: bfloat16 would be emulated, about 90x slower"
