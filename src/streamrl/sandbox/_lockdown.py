"""What the runner puts up around itself before the model's code runs, in this order (see
``_child._runner``): rlimits, then at the ``kernel`` and ``bwrap`` levels ``harden`` (the kernel's
walls), then the Python-level guards.

Runs inside the sandbox (``launch.py`` embeds it in the bootstrap): standard library only.
"""

from __future__ import annotations

import os
import resource
from typing import Any

from ._confine import DEVICES, WRITABLE
from ._landlock import install_landlock
from ._seccomp import install_seccomp
from ._syscalls import PR_SET_NO_NEW_PRIVS, prctl

_PROCESS_FUNCTIONS = (
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
    "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
    "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
)  # fmt: skip


def apply_limits(rlimits: dict[str, int]) -> None:
    """Hard = soft, so the sandboxed code cannot raise any limit back."""
    for name, value in rlimits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _refuse_processes(*_args: Any, **_kwargs: Any) -> Any:
    raise PermissionError("starting processes is disabled in this sandbox")


class _RefusedPopen:
    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        _refuse_processes()


def _refuse_network(*_args: Any, **_kwargs: Any) -> Any:
    raise PermissionError("network access is disabled in this sandbox")


def _stub_network() -> None:
    """Best-effort block where no network namespace is available (``_socket`` bypasses it)."""
    import socket

    internet = (socket.AF_INET, socket.AF_INET6)

    class GuardedSocket(socket.socket):
        def connect(self, address: Any) -> None:
            if self.family in internet:
                _refuse_network()
            super().connect(address)

        def connect_ex(self, address: Any) -> int:
            if self.family in internet:
                _refuse_network()
            return super().connect_ex(address)

        def bind(self, address: Any) -> None:
            if self.family in internet:
                _refuse_network()
            super().bind(address)

        def sendto(self, *args: Any) -> int:
            if self.family in internet:
                _refuse_network()
            return super().sendto(*args)

    socket.socket = GuardedSocket  # type: ignore[misc]
    for name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        setattr(socket, name, _refuse_network)


def install_guards(stub_network: bool) -> None:
    """Guards against accidental misuse (a determined program can bypass them through ``posix``
    or ``ctypes``; the rlimits, namespaces and cgroup are the real walls)."""
    for name in _PROCESS_FUNCTIONS:
        if hasattr(os, name):
            setattr(os, name, _refuse_processes)
    import subprocess

    subprocess.Popen = _RefusedPopen  # type: ignore[misc, assignment]
    if stub_network:
        _stub_network()


def harden() -> None:
    """no_new_privs, then Landlock and seccomp where the kernel has them (the last walls before
    the code: nothing after this can be undone by it)."""
    try:  # the kernel's memory killer picks the code's processes first, never the init's
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    writable = [path for path in WRITABLE if os.path.isdir(path)]
    devices = [f"/dev/{name}" for name in DEVICES]
    install_landlock(writable, devices)
    install_seccomp()
