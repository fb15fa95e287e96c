"""The isolation levels and what each one is (``Isolation``), apart from choosing one
(``isolation.py``) so that the launcher, which wraps commands for a level, and the prober, which
launches to see which levels work, depend on this module and not on each other."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

LEVELS = ("process", "process+netns", "process+netns+pidns", "bwrap", "kernel")
#: the levels that meet the default bar, most preferred first
SAFE_LEVELS = ("kernel", "bwrap")


@dataclass(frozen=True)
class Isolation:
    """One isolation level: how to wrap the interpreter command, and what it guarantees."""

    level: str
    _wrap: Callable[[str, list[str], int], list[str]]
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
    #: the bootstrap builds the sandbox itself with the kernel's primitives (``_confine.py``)
    confine: bool = False
    #: the runner adds no_new_privs, Landlock and seccomp before the code runs
    harden: bool = False
    #: meets the default bar (see ``SAFE_LEVELS``)
    safe: bool = False
    #: where the init finds the code file (None: its working directory)
    input_dir: str | None = None

    def command(self, workdir: str, argv: list[str], disk_bytes: int = 64 << 20) -> list[str]:
        """``argv`` (the interpreter command) wrapped for this level, for work dir ``workdir``."""
        return self._wrap(workdir, argv, disk_bytes)

    def workdir_inside(self, workdir: str) -> str:
        return self.inner_workdir or workdir

    def rank(self) -> int:
        return LEVELS.index(self.level)


def interpreter_binds() -> list[tuple[str, str]]:
    """(source, destination) pairs that make the interpreter and its site-packages visible."""
    binds: list[tuple[str, str]] = []
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(path)
        for dest in (path, real):  # the spelled path (a venv's) and the resolved one
            if dest.startswith("/usr/") or (real, dest) in binds:
                continue
            binds.append((real, dest))
    return binds
