"""A per-run cgroup: one process limit and one memory limit for the whole group of a run.

cgroup v2 (one directory with ``pids.max``, ``memory.max``, ``memory.swap.max``,
``memory.oom.group``) or v1 (a ``pids`` and a ``memory`` directory with ``pids.max``,
``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes``), wherever the trainer may create
groups (as root on most machines). The group does three jobs that rlimits cannot: ``pids.max``
caps the processes of the run however many it forks (the kernel ignores ``RLIMIT_NPROC`` for
uid 0), the memory limit holds for all of them together (``RLIMIT_AS`` is per process), and its
member list finds every process of the run, even one that left the process group with
``setsid()``, so all of them can be killed.

Where no memory controller is available, the ``kernel`` level falls back to a dedicated uid per
run (``RLIMIT_NPROC`` then caps the run's processes) and to a watchdog in the sandbox's PID 1
that sums the resident memory of every process in the run's PID namespace (see ``_child.py``).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

GROUP_PREFIX = "streamrl-sbx-"
_ROOT = Path("/sys/fs/cgroup")
#: memory the sandbox's own supervising interpreters need on top of the code's limit
SUPERVISOR_MEMORY_BYTES = 64 * 1024 * 1024


def _own_cgroups() -> dict[str, Path]:
    """This process's cgroup directory per controller (``"pids"``, ``"memory"``), v1 preferred
    per controller, else the v2 unified one where it enables that controller."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    v1: dict[str, Path] = {}
    v2 = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",") if controllers else []
        for name in ("pids", "memory"):
            if name in names:
                v1[name] = _ROOT / name / path.lstrip("/")
        if controllers == "":
            for candidate in (_ROOT / path.lstrip("/"), _ROOT / "unified" / path.lstrip("/")):
                if (candidate / "cgroup.controllers").exists():
                    v2 = candidate
                    break
    found = dict(v1)
    if v2 is not None:
        try:
            enabled = (v2 / "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        for name in ("pids", "memory"):
            if name not in found and name in enabled:
                found[name] = v2
    return found


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


def _join_script(count: int) -> str:
    """``sh -c`` text that writes its pid into ``count`` ``cgroup.procs`` files, then execs."""
    writes = " && ".join(f'echo $$ > "${index}"' for index in range(count))
    shift = f" && shift {count - 1}" if count > 1 else ""
    return f"{writes}{shift} && exec \"$@\""


def _try_parent(parent: Path, files: dict[str, str]) -> bool:
    """Create a throw-away group with ``files`` written, move a short-lived shell in, remove it."""
    probe = parent / f"{GROUP_PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        for name, value in files.items():
            (probe / name).write_text(value)
        done = subprocess.run(
            ["/bin/sh", "-c", 'echo $$ > "$0"', str(probe / "cgroup.procs")], capture_output=True, timeout=10
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


def _memory_file(parent: Path) -> str:
    return "memory.max" if (parent / "cgroup.controllers").exists() else "memory.limit_in_bytes"


@functools.cache
def cgroup_parents() -> dict[str, Path]:
    """Where per-run groups can be created, per controller; empty where the machine allows none."""
    usable: dict[str, Path] = {}
    for name, parent in _own_cgroups().items():
        if not (parent / "cgroup.procs").exists():
            continue
        files = {"pids.max": "8"} if name == "pids" else {_memory_file(parent): str(256 * 1024 * 1024)}
        if _try_parent(parent, files):
            usable[name] = parent
            _prune_stale_groups(parent)
    return usable


def pids_cgroup_parent() -> Path | None:
    """Where per-run ``pids`` groups can be created (None: nowhere)."""
    return cgroup_parents().get("pids")


def memory_cgroup_parent() -> Path | None:
    return cgroup_parents().get("memory")


def cgroup_description() -> str:
    parents = cgroup_parents()
    if not parents:
        return "no cgroup"
    parts = []
    for name in ("memory", "pids"):
        if name in parents:
            version = "v2" if (parents[name] / "cgroup.controllers").exists() else "v1"
            parts.append(f"{name} ({version})")
    return "cgroup " + " + ".join(parts)


@dataclass
class RunCgroup:
    """One run's group(s). Processes join through ``join_command``; ``remove`` kills and deletes."""

    #: one directory per distinct hierarchy (v2: one; v1: the pids and the memory ones)
    dirs: list[Path]
    has_pids: bool
    has_memory: bool

    @property
    def path(self) -> Path:
        return self.dirs[0]

    @classmethod
    def create(cls, run_id: str, max_pids: int, memory_bytes: int | None = None) -> RunCgroup | None:
        parents = cgroup_parents()
        if "pids" not in parents:
            return None
        wanted = {"pids": parents["pids"]}
        if memory_bytes is not None and "memory" in parents:
            wanted["memory"] = parents["memory"]
        dirs: dict[Path, Path] = {}
        try:
            for parent in wanted.values():
                if parent not in dirs:
                    path = parent / f"{GROUP_PREFIX}{run_id}"
                    path.mkdir()
                    dirs[parent] = path
            (dirs[wanted["pids"]] / "pids.max").write_text(str(int(max_pids)))
            if "memory" in wanted:
                memory = dirs[wanted["memory"]]
                limit = str(int(memory_bytes) + SUPERVISOR_MEMORY_BYTES)  # type: ignore[arg-type]
                if (wanted["memory"] / "cgroup.controllers").exists():
                    (memory / "memory.max").write_text(limit)
                    for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "0")):
                        try:
                            (memory / name).write_text(value)
                        except OSError:
                            pass
                else:
                    (memory / "memory.limit_in_bytes").write_text(limit)
                    try:  # no swapping around the limit (absent without swap accounting)
                        (memory / "memory.memsw.limit_in_bytes").write_text(limit)
                    except OSError:
                        pass
        except OSError:
            for path in dirs.values():
                _remove_dir(path, attempts=1)
            return None
        return cls(list(dirs.values()), has_pids=True, has_memory="memory" in wanted)

    def join_command(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the group(s), then ``exec``s."""
        procs = [str(path / "cgroup.procs") for path in self.dirs]
        return ["/bin/sh", "-c", _join_script(len(procs)), *procs, *argv]

    def members(self) -> list[int]:
        found: set[int] = set()
        for path in self.dirs:
            try:
                found.update(int(pid) for pid in (path / "cgroup.procs").read_text().split())
            except OSError:
                continue
        return sorted(found)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the group's memory limit."""
        for path in self.dirs:
            for name in ("memory.events", "memory.oom_control"):
                try:
                    text = (path / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

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
        return all([_remove_dir(path) for path in self.dirs])


#: the old name (a pids-only group)
PidsCgroup = RunCgroup
