"""A per-run ``pids`` cgroup, when ``/sys/fs/cgroup`` is writable (as root on most machines).

It does two jobs that rlimits cannot do for root: ``pids.max`` caps the number of processes
(the kernel ignores ``RLIMIT_NPROC`` for uid 0), and its member list finds every process of
the run, even one that left the process group with ``setsid()``, so all of them can be killed.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from pathlib import Path

GROUP_PREFIX = "streamrl-sbx-"
_V1_ROOT = Path("/sys/fs/cgroup/pids")
_V2_ROOT = Path("/sys/fs/cgroup")


def _own_pids_cgroup_dir() -> Path | None:
    """The directory of this process's ``pids`` cgroup (v1 hierarchy, or the v2 unified one)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            v1 = _V1_ROOT / path.lstrip("/")
        elif controllers == "":
            v2 = _V2_ROOT / path.lstrip("/")
    return v1 if v1 is not None else v2


def _try_group(parent: Path) -> bool:
    """Create a throw-away group, cap it, move a short-lived shell into it and remove it."""
    probe = parent / f"{GROUP_PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / "pids.max").write_text("8")
        done = subprocess.run(
            ["/bin/sh", "-c", 'echo $$ > "$0"', str(probe / "cgroup.procs")],
            capture_output=True,
            timeout=10,
        )
        return done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        _remove_dir(probe)


#: an empty group older than this was left by a process that died before cleaning up
STALE_AFTER_S = 600.0


def _prune_stale_groups(parent: Path) -> None:
    """Remove empty groups that crashed processes left behind (rmdir refuses non-empty ones)."""
    for group in parent.glob(f"{GROUP_PREFIX}*"):
        try:
            if time.time() - group.stat().st_mtime > STALE_AFTER_S:
                group.rmdir()
        except OSError:
            continue


@functools.cache
def pids_cgroup_parent() -> Path | None:
    """Where per-run groups can be created, or None where the machine does not allow it."""
    parent = _own_pids_cgroup_dir()
    if parent is None or not (parent / "cgroup.procs").exists():
        return None
    if not _try_group(parent):
        return None
    _prune_stale_groups(parent)
    return parent


def _remove_dir(path: Path, attempts: int = 50) -> bool:
    for _ in range(attempts):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY while the last members are still exiting
            time.sleep(0.02)
    return False


class PidsCgroup:
    """One run's group. Processes join it through ``join_command``; ``remove`` kills and deletes."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, run_id: str, max_pids: int) -> PidsCgroup | None:
        parent = pids_cgroup_parent()
        if parent is None:
            return None
        path = parent / f"{GROUP_PREFIX}{run_id}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(int(max_pids)))
        except OSError:
            _remove_dir(path, attempts=1)
            return None
        return cls(path)

    def join_command(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the group, then ``exec``s."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def members(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def kill_all(self, rounds: int = 100) -> bool:
        """SIGKILL every member until the group is empty (members may still be forking)."""
        for _ in range(rounds):
            members = self.members()
            if not members:
                return True
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)
        return not self.members()

    def remove(self) -> bool:
        self.kill_all()
        return _remove_dir(self.path)
