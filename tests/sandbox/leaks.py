"""Helpers shared by the sandbox tests: which levels exist here, and finding what a run left."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from streamrl.sandbox import SAFE_LEVELS, available_isolations, isolation_level
from streamrl.sandbox.cgroup import GROUP_PREFIX, cgroup_parents, memory_cgroup_parent, pids_cgroup_parent
from streamrl.sandbox.launch import UID_BASE

LEVELS_HERE = list(available_isolations())
#: the level "auto" gives here, and whether it meets the default bar
BEST_LEVEL = isolation_level()
SAFE_HERE = BEST_LEVEL in SAFE_LEVELS and available_isolations()[BEST_LEVEL].safe
WEAK_LEVELS_HERE = [level for level in LEVELS_HERE if not available_isolations()[level].safe]
HAS_CGROUP = pids_cgroup_parent() is not None
HAS_MEMORY_CGROUP = memory_cgroup_parent() is not None


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def survivors(run_id: str, wait_s: float = 3.0) -> list[psutil.Process]:
    """Live processes whose command line carries ``run_id``, after waiting up to ``wait_s``
    for them to disappear."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if run_id in " ".join(proc.info["cmdline"] or ()) and alive(proc):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def sandbox_uid_processes() -> list[psutil.Process]:
    """Live processes anywhere on the machine that run as a sandbox uid (``kernel`` level)."""
    found = []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] is not None and UID_BASE <= proc.info["uids"].real < UID_BASE + 8192 * 1024:
                if alive(proc):
                    found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def sandbox_cgroups() -> set[Path]:
    """Per-run cgroup directories that exist now."""
    found: set[Path] = set()
    for parent in cgroup_parents().values():
        found.update(path for path in parent.glob(f"{GROUP_PREFIX}*") if "probe" not in path.name)
    return found


def mounts() -> list[str]:
    """The mount table of this process's mount namespace (the host's), as (mount point, source)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return sorted(" ".join(line.split()[4:5] + line.split(" - ")[1].split()[:2]) for line in lines)


def kill_all(processes: list[psutil.Process]) -> None:
    for proc in processes:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
