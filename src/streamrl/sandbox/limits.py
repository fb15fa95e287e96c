"""Resource limits of one sandboxed run (or one persistent session)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Every limit is enforced with hard = soft rlimits, so the sandboxed code cannot raise it.

    ``memory_mb`` is both each process's ``RLIMIT_AS`` and, for the whole run together, the
    cgroup memory limit (or the fallback watchdog's total; see ``cgroup.py``).

    ``timeout_s`` is a wall clock (it also catches ``time.sleep`` and blocking I/O, which use no
    CPU); the CPU rlimit of a one-shot run is ``ceil(timeout_s) + 1`` as a backstop.
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024  # RLIMIT_AS
    file_size_mb: int = 16  # RLIMIT_FSIZE: larger writes fail with EFBIG
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_processes: int = 64  # the whole run: cgroup pids.max, and RLIMIT_NPROC of its dedicated uid
    max_output_bytes: int = 64 * 1024  # per stream; a one-shot run is killed once over it
    #: the one size-capped filesystem (tmpfs) that holds the work dir, /tmp and /dev/shm together
    #: at the ``kernel`` level (bwrap: the work dir and /tmp each)
    disk_mb: int = 64

    def __post_init__(self) -> None:
        checks = {
            "timeout_s": self.timeout_s,
            "memory_mb": self.memory_mb,
            "file_size_mb": self.file_size_mb,
            "max_open_files": self.max_open_files,
            "max_processes": self.max_processes,
            "max_output_bytes": self.max_output_bytes,
            "disk_mb": self.disk_mb,
        }
        for name, value in checks.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"SandboxLimits.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive and finite, got {value!r}")
        if self.memory_mb < 64:
            raise ValueError(
                f"SandboxLimits.memory_mb must be at least 64 (the interpreter needs it), got {self.memory_mb}"
            )
        if self.max_open_files < 16:
            raise ValueError(f"SandboxLimits.max_open_files must be at least 16, got {self.max_open_files}")
        if self.max_output_bytes < 256:
            raise ValueError(f"SandboxLimits.max_output_bytes must be at least 256, got {self.max_output_bytes}")

    def one_shot_cpu_seconds(self) -> int:
        return math.ceil(self.timeout_s) + 1

    def rlimits(self, cpu_seconds: int) -> dict[str, int]:
        """The rlimits the child applies to itself, by ``resource`` constant name."""
        mib = 1024 * 1024
        return {
            "RLIMIT_AS": int(self.memory_mb) * mib,
            "RLIMIT_CPU": max(1, int(cpu_seconds)),
            "RLIMIT_FSIZE": int(self.file_size_mb) * mib,
            "RLIMIT_NOFILE": int(self.max_open_files),
            "RLIMIT_CORE": 0,
            "RLIMIT_NPROC": int(self.max_processes),
        }
