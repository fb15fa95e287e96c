"""Which isolation the machine allows, found once by trying each level for real.

Levels, weakest first (every level also has the rlimits, a fresh session, a fresh temp dir, a
minimal environment, the wall clock and the bootstrap guards):

* ``process``: the interpreter runs directly, as the trainer's user; the network is blocked only
  by socket stubs. **Weak.**
* ``process+netns``: ``unshare -n``: a network namespace with no interfaces up. **Weak.**
* ``process+netns+pidns``: plus a PID namespace (``unshare --net --pid``). **Weak**: as root the
  code is root with every capability, on the host filesystem and the host ``/proc``.
* ``bwrap``: bubblewrap, with a user namespace (``--unshare-user --uid``), ``--cap-drop ALL``,
  every namespace unshared, the host filesystem absent except the system and interpreter dirs
  (bound read-only *after* every tmpfs), a size-capped tmpfs work dir at ``/sandbox`` and
  ``/tmp``, ``/`` remounted read-only; the runner adds Landlock and seccomp. Safe only for a
  trainer that is not root (bwrap maps the trainer's uid into the sandbox) and only with a bwrap
  that knows ``--size``.
* ``kernel``: the kernel's own primitives, for a root trainer (see ``_confine.py``): PID, mount,
  network, IPC, UTS and cgroup namespaces; a new root with the host dirs read-only; a private
  ``/proc``, ``/tmp`` and ``/dev``; one size-capped tmpfs for everything writable; a dedicated
  unprivileged uid per run with no capabilities and ``no_new_privs``; Landlock and seccomp
  where the kernel offers them.

``SAFE_LEVELS`` meet the default safety bar. ``"auto"`` picks the preferred safe level that
works here and **refuses to run** (``SandboxUnavailableError``) where none does, unless weaker
isolation was opted into (``allow_weak=True``, ``set_allow_weak(True)``, the config's
``sandbox.allow_weak: true``, or ``STREAMRL_SANDBOX_ALLOW_WEAK=1``). Asking for a weak level
by name needs the same opt-in. The level in force is announced (stderr and the
``streamrl.sandbox`` logger) the first time a process resolves it.

A cgroup (see ``cgroup.py``) is added on top of any level when the machine allows it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

from streamrl.sandbox.levels import LEVELS, SAFE_LEVELS, Isolation, interpreter_binds

#: where the work dir appears inside the private filesystem levels
BWRAP_WORKDIR = "/sandbox"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
#: the uid (and gid) the code has inside bwrap, mapped to the trainer's own uid outside
BWRAP_UID = 1000
#: where bwrap shows the host work dir (the code file), read-only
BWRAP_INPUT_DIR = "/run/sandbox-input"
ALLOW_WEAK_ENV = "STREAMRL_SANDBOX_ALLOW_WEAK"

logger = logging.getLogger("streamrl.sandbox")


class SandboxUnavailableError(RuntimeError):
    """No isolation level that meets the default bar works on this machine (and weaker
    isolation was not opted into)."""


def _plain(_workdir: str, argv: list[str], _disk: int) -> list[str]:
    return list(argv)


def _unshare_net(unshare: str) -> Callable[[str, list[str], int], list[str]]:
    return lambda _workdir, argv, _disk: [unshare, "--net", "--", *argv]


def _unshare_net_pid(unshare: str) -> Callable[[str, list[str], int], list[str]]:
    # Without --fork the interpreter (the sandbox's init) stays outside the new namespace and
    # its first child, the code, becomes PID 1 in it.
    return lambda _workdir, argv, _disk: [unshare, "--net", "--pid", "--", *argv]


@functools.cache
def bwrap_features(bwrap: str) -> frozenset[str]:
    """The options this bwrap knows, from its ``--help``."""
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(re.findall(r"--[a-z][a-z-]+", done.stdout + done.stderr))


def bwrap_command(bwrap: str, workdir: str, argv: list[str], disk_bytes: int, features: frozenset[str]) -> list[str]:
    """The fixed bubblewrap command line: user namespace with an unprivileged uid, every
    capability dropped, tmpfs first and the read-only binds after them (a venv under ``/tmp``
    stays visible), a size-capped work dir, ``/`` read-only at the end."""
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user"]
    args += ["--uid", str(BWRAP_UID), "--gid", str(BWRAP_UID), "--cap-drop", "ALL"]
    if "--disable-userns" in features:
        args += ["--disable-userns"]
    size = ["--size", str(int(disk_bytes))] if "--size" in features else []
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", BWRAP_WORKDIR]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _LOADER_FILES:
        args += ["--ro-bind-try", path, path]
    for source, dest in interpreter_binds():
        args += ["--ro-bind", source, dest]
    args += ["--ro-bind", workdir, BWRAP_INPUT_DIR]
    args += ["--remount-ro", "/", "--chdir", BWRAP_WORKDIR, "--", *argv]
    return args


def _bwrap(bwrap: str) -> Callable[[str, list[str], int], list[str]]:
    return lambda workdir, argv, disk: bwrap_command(bwrap, workdir, argv, disk, bwrap_features(bwrap))


def _has_memory_cgroup() -> bool:
    from streamrl.sandbox.cgroup import memory_cgroup_parent

    return memory_cgroup_parent() is not None


def _kernel_possible() -> bool:
    from streamrl.sandbox import _syscalls

    return os.geteuid() == 0 and _syscalls.SYSCALLS is not None and sys.platform.startswith("linux")


def _candidates() -> list[Isolation]:
    found = [Isolation("process", _plain, network_namespace=False, pid_namespace=False, private_filesystem=False)]
    unshare = shutil.which("unshare")
    if unshare:
        found.append(
            Isolation(
                "process+netns", _unshare_net(unshare), network_namespace=True, pid_namespace=False, private_filesystem=False
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
                harden=True,
                # as root, bwrap maps the sandbox's uid onto host uid 0; without --size the
                # work dir has no disk quota; without a memory cgroup nothing holds the
                # group's memory (the PID 1 watchdog is the ``kernel`` level's alone)
                safe=os.geteuid() != 0 and "--size" in bwrap_features(bwrap) and _has_memory_cgroup(),
                input_dir=BWRAP_INPUT_DIR,
            )
        )
    if _kernel_possible():
        found.append(
            Isolation(
                "kernel",
                _plain,
                network_namespace=True,
                pid_namespace=True,
                private_filesystem=True,
                inner_workdir=BWRAP_WORKDIR,
                confine=True,
                harden=True,
                safe=True,
            )
        )
    return found


def _works(isolation: Isolation) -> bool:
    """Run a trivial interpreter under ``isolation`` through the real launcher; True if it
    starts, runs and exits cleanly."""
    from streamrl.sandbox.launch import probe_launch

    try:
        return probe_launch(isolation)
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return False


@functools.cache
def available_isolations() -> dict[str, Isolation]:
    """Every level that works on this machine, weakest first (probed once per process)."""
    return {iso.level: iso for iso in _candidates() if iso.level == "process" or _works(iso)}


def best_isolation() -> Isolation:
    """The preferred safe level that works here, else the strongest weak one."""
    available = available_isolations()
    for level in SAFE_LEVELS:
        if level in available and available[level].safe:
            return available[level]
    return max(available.values(), key=Isolation.rank)


def isolation_level() -> str:
    """The isolation level ``"auto"`` gives on this machine (it may be a weak one: see
    ``resolve_isolation``, which refuses those without an opt-in)."""
    return best_isolation().level


# ----------------------------------------------------------------------------- opt-in to weak levels
_allow_weak_setting: bool | None = None


def set_allow_weak(allow: bool | None) -> None:
    """Process-wide opt-in to isolation weaker than the default safe level (None: back to the
    ``STREAMRL_SANDBOX_ALLOW_WEAK`` environment variable, default off)."""
    global _allow_weak_setting
    if allow is not None and not isinstance(allow, bool):
        raise TypeError(f"allow_weak must be a bool, got {allow!r}")
    _allow_weak_setting = allow


def allow_weak() -> bool:
    if _allow_weak_setting is not None:
        return _allow_weak_setting
    return os.environ.get(ALLOW_WEAK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def describe(isolation: Isolation) -> str:
    """One line: the level and what holds at it on this machine."""
    from streamrl.sandbox._landlock import landlock_abi
    from streamrl.sandbox._seccomp import seccomp_available
    from streamrl.sandbox.cgroup import cgroup_description

    if isolation.confine:
        parts = [
            "dedicated unprivileged uid per run, no capabilities, no_new_privs",
            "own pid+mount+net+ipc+uts+cgroup namespaces",
            "host filesystem read-only (system and interpreter dirs only), private /proc, /tmp, /dev",
            "work dir, /tmp and /dev/shm on one size-capped tmpfs",
        ]
    elif isolation.level == "bwrap":
        parts = [
            f"bubblewrap, user namespace (uid {BWRAP_UID}), --cap-drop ALL, all namespaces",
            "system and interpreter dirs read-only, size-capped tmpfs work dir and /tmp",
        ]
    else:
        parts = ["WEAK: host filesystem and host /proc visible; the code has the trainer's uid and capabilities"]
    if isolation.harden:
        abi = landlock_abi()
        parts.append(f"Landlock ABI {abi}" if abi else "no Landlock (kernel lacks it)")
        parts.append("seccomp filter" if seccomp_available() else "no seccomp (kernel lacks it)")
    parts.append(cgroup_description())
    if isolation.confine and "memory" not in cgroup_description():
        parts.append("group memory by the PID 1 watchdog (no memory cgroup)")
    return f"{isolation.level} ({'; '.join(parts)})"


_announced: set[str] = set()


def announce(isolation: Isolation) -> None:
    """Say once per process which isolation level is in force (stderr and the logger)."""
    if isolation.level in _announced:
        return
    _announced.add(isolation.level)
    line = f"streamrl.sandbox: isolation level {describe(isolation)}"
    if isolation.safe:
        logger.info(line)
    else:
        logger.warning(line)
    print(line, file=sys.stderr, flush=True)


def resolve_isolation(requested: str = "auto", allow_weak: bool | None = None) -> Isolation:
    """``"auto"`` -> the preferred safe level; a level name -> that level, if this machine has
    it. A level weaker than the safe ones needs ``allow_weak`` (None: the process-wide setting);
    without it ``"auto"`` raises ``SandboxUnavailableError`` and a named weak level ``ValueError``."""
    allowed = globals()["allow_weak"]() if allow_weak is None else bool(allow_weak)
    if requested == "auto":
        chosen = best_isolation()
        if not chosen.safe and not allowed:
            raise SandboxUnavailableError(
                f"no sandbox isolation level that meets the default bar ({' or '.join(SAFE_LEVELS)}) works on this "
                f"machine (the strongest here is {chosen.level!r}: {describe(chosen)}); run as root, or install a "
                "bubblewrap with --size and run as a non-root user, or opt into weaker isolation with "
                f"sandbox.allow_weak: true (allow_weak=True, {ALLOW_WEAK_ENV}=1)"
            )
        announce(chosen)
        return chosen
    if requested not in LEVELS:
        raise ValueError(f"unknown sandbox isolation {requested!r}; choose 'auto' or one of {', '.join(LEVELS)}")
    available = available_isolations()
    if requested not in available:
        raise ValueError(
            f"sandbox isolation {requested!r} is not available on this machine (available: {', '.join(available)})"
        )
    chosen = available[requested]
    if not chosen.safe and not allowed:
        raise ValueError(
            f"sandbox isolation {requested!r} is weaker than the default safe level; opt in with "
            f"sandbox.allow_weak: true (allow_weak=True, {ALLOW_WEAK_ENV}=1)"
        )
    announce(chosen)
    return chosen
