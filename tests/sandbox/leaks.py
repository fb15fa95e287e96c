"""Helpers shared by the sandbox tests: which levels exist here, and finding leftover processes."""

from __future__ import annotations

import time

import psutil

from streamrl.sandbox import available_isolations
from streamrl.sandbox.cgroup import pids_cgroup_parent

LEVELS_HERE = list(available_isolations())
BEST_LEVEL = LEVELS_HERE[-1]
HAS_CGROUP = pids_cgroup_parent() is not None


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


def kill_all(processes: list[psutil.Process]) -> None:
    for proc in processes:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
