"""Which isolation the machine allows, found once by trying each level for real.

Levels, weakest first (every level also has the rlimits, a fresh session, a fresh temp dir, a
minimal environment, the wall clock and the bootstrap guards):

* ``process``: the interpreter runs directly; the network is blocked only by socket stubs.
* ``process+netns``: ``unshare -n``: a network namespace with no interfaces up.
* ``process+netns+pidns``: plus a PID namespace (``unshare --net --pid``, no ``--fork``): the
  code runs as PID 1 of a fresh namespace, so when it ends the kernel kills every process it
  left, including ones that called ``setsid()``. (``/proc`` still shows the host's processes.)
* ``bwrap``: bubblewrap with every namespace unshared and a private filesystem view: only the
  system and interpreter directories, read-only, and the work dir at ``/sandbox``, writable.

A ``pids`` cgroup (see ``cgroup.py``) is added on top of any level when the machine allows it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

LEVELS = ("process", "process+netns", "process+netns+pidns", "bwrap")
#: where the work dir appears inside bwrap
BWRAP_WORKDIR = "/sandbox"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")


@dataclass(frozen=True)
class Isolation:
    """One isolation level: how to wrap the interpreter command, and what it guarantees."""

    level: str
    _wrap: Callable[[str, list[str]], list[str]]
    #: a network namespace blocks sockets (otherwise the bootstrap installs stubs)
    network_namespace: bool
    #: every process of the run dies with the sandbox's init, whatever its session
    pid_namespace: bool
    #: the code sees only read-only system dirs and its work dir
    private_filesystem: bool
    #: the work dir as the sandboxed code sees it (None: the host path)
    inner_workdir: str | None = None
    #: the spawned process is the sandbox's init itself (not a wrapper such as bwrap)
    init_is_leader: bool = True

    def command(self, workdir: str, argv: list[str]) -> list[str]:
        """``argv`` (the interpreter command) wrapped for this level, for work dir ``workdir``."""
        return self._wrap(workdir, argv)

    def workdir_inside(self, workdir: str) -> str:
        return self.inner_workdir or workdir

    def rank(self) -> int:
        return LEVELS.index(self.level)


def _plain(_workdir: str, argv: list[str]) -> list[str]:
    return list(argv)


def _unshare_net(unshare: str) -> Callable[[str, list[str]], list[str]]:
    return lambda _workdir, argv: [unshare, "--net", "--", *argv]


def _unshare_net_pid(unshare: str) -> Callable[[str, list[str]], list[str]]:
    # Without --fork the interpreter (the sandbox's init) stays outside the new namespace and
    # its first child, the code, becomes PID 1 in it. The init stays the spawned process, as
    # at the lower levels, and reaps the code itself (``unshare --fork`` would sit in between,
    # and a killed ``unshare`` leaves its child an orphaned zombie for a while).
    return lambda _workdir, argv: [unshare, "--net", "--pid", "--", *argv]


def _interpreter_binds() -> list[tuple[str, str]]:
    """(source, destination) pairs that make the interpreter and its site-packages visible."""
    binds: list[tuple[str, str]] = []
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(path)
        for dest in (path, real):  # the spelled path (a venv's) and the resolved one
            if dest.startswith("/usr/") or (real, dest) in binds:
                continue
            binds.append((real, dest))
    return binds


def _bwrap(bwrap: str) -> Callable[[str, list[str]], list[str]]:
    def wrap(workdir: str, argv: list[str]) -> list[str]:
        args = [bwrap, "--die-with-parent", "--new-session", "--unshare-all"]
        for path in _SYSTEM_DIRS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in _LOADER_FILES:
            args += ["--ro-bind-try", path, path]
        for source, dest in _interpreter_binds():
            args += ["--ro-bind", source, dest]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        args += ["--bind", workdir, BWRAP_WORKDIR, "--remount-ro", "/", "--chdir", BWRAP_WORKDIR, "--", *argv]
        return args

    return wrap


def _candidates() -> list[Isolation]:
    found = [Isolation("process", _plain, network_namespace=False, pid_namespace=False, private_filesystem=False)]
    unshare = shutil.which("unshare")
    if unshare:
        found.append(
            Isolation(
                "process+netns",
                _unshare_net(unshare),
                network_namespace=True,
                pid_namespace=False,
                private_filesystem=False,
            )
        )
        found.append(
            Isolation(
                "process+netns+pidns",
                _unshare_net_pid(unshare),
                network_namespace=True,
                pid_namespace=True,
                private_filesystem=False,
            )
        )
    bwrap = shutil.which("bwrap")
    if bwrap:
        found.append(
            Isolation(
                "bwrap",
                _bwrap(bwrap),
                network_namespace=True,
                pid_namespace=True,
                private_filesystem=True,
                inner_workdir=BWRAP_WORKDIR,
                init_is_leader=False,
            )
        )
    return found


def _works(isolation: Isolation) -> bool:
    """Run a trivial interpreter under ``isolation``; True if it starts and exits cleanly."""
    workdir = tempfile.mkdtemp(prefix="streamrl-sbx-probe-")
    try:
        argv = isolation.command(workdir, [sys.executable, "-I", "-B", "-c", "import os; os.getcwd()"])
        done = subprocess.run(
            argv, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, timeout=20, env={"PATH": os.defpath}
        )
        return done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@functools.cache
def available_isolations() -> dict[str, Isolation]:
    """Every level that works on this machine, weakest first (probed once per process)."""
    return {iso.level: iso for iso in _candidates() if iso.level == "process" or _works(iso)}


def best_isolation() -> Isolation:
    return list(available_isolations().values())[-1]


def isolation_level() -> str:
    """The strongest isolation level in force on this machine."""
    return best_isolation().level


def resolve_isolation(requested: str = "auto") -> Isolation:
    """``"auto"`` -> the strongest level; a level name -> that level, if this machine has it."""
    if requested == "auto":
        return best_isolation()
    if requested not in LEVELS:
        raise ValueError(f"unknown sandbox isolation {requested!r}; choose 'auto' or one of {', '.join(LEVELS)}")
    available = available_isolations()
    if requested not in available:
        raise ValueError(
            f"sandbox isolation {requested!r} is not available on this machine (available: {', '.join(available)})"
        )
    return available[requested]
