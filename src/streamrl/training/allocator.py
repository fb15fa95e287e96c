"""Keep freed memory in the process (glibc's malloc), so the learner's per-update tensors are not
page-faulted in afresh every update.

Each update allocates the same large tensors again (activations, logits, weight gradients, the
tied embedding's gradient sum). By default glibc serves blocks over its mmap threshold (at most
32 MiB) with a fresh ``mmap`` and returns them with ``munmap`` on free, and gives the top of the
heap back to the kernel past ``M_TRIM_THRESHOLD``; every reuse then page-faults the memory in
again, zeroed by the kernel. On virtual machines whose host reclaims freed guest pages a fault
costs up to about 15 us: SmolLM2's update (two micro-batches of four rows of 64-192 tokens) spent
about 7.5 of its 18 CPU-seconds in the kernel on 680,000 faults (``benchmarks/learner_throughput.py``;
docs/results/speed.md). ``keep_freed_memory`` serves every block from the heap and never trims
it, so the process keeps its peak (which an update reaches anyway) and later updates reuse it.
"""

from __future__ import annotations

import ctypes
import ctypes.util

#: mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Set glibc's ``M_MMAP_MAX`` to 0 and ``M_TRIM_THRESHOLD`` to its largest value for this
    process; True when applied, False where the C library has no ``mallopt`` (not glibc)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)) and bool(mallopt(_M_MMAP_MAX, 0))
