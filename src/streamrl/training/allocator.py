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

It also keeps one heap (``M_ARENA_MAX`` 1) for every thread. By default glibc gives each thread
that allocates its own arena, and memory freed in one arena serves only that arena's later
allocations: the learner's activations (freed after each update, in the learner's thread) could not
hold the engine's KV cache (its worker thread) and the other way round, so a run kept the peak of
each side at once. SmolLM2's two-step RL run of 8 episodes (``benchmarks/pretrained_step.py``)
peaked at 8.35 GB with an arena per thread and 5.04 GB with one; the threads allocate seldom (large
tensors), so sharing the heap's lock costs nothing measurable.
"""

from __future__ import annotations

import ctypes
import ctypes.util

#: mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def keep_freed_memory() -> bool:
    """Set glibc's ``M_MMAP_MAX`` to 0, ``M_TRIM_THRESHOLD`` to its largest value and
    ``M_ARENA_MAX`` to 1 for this process (call it before other threads allocate); True when
    applied, False where the C library has no ``mallopt`` (not glibc)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)) and bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_ARENA_MAX, 1))
