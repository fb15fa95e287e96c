"""The runner's Landlock domain: writes only beneath the writable dirs, no TCP, and no signals
or abstract unix sockets outside the domain, as far as the kernel's Landlock ABI goes.

Runs inside the sandbox (``launch.py`` embeds it in the bootstrap): standard library only.
"""

from __future__ import annotations

import ctypes
import os
import struct

from . import _syscalls
from ._syscalls import check, syscall

_LL_CREATE_RULESET_VERSION = 1
_LL_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
_NET_ALL = (1 << 0) | (1 << 1)  # bind and connect TCP
_SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract unix sockets, signals


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or disabled."""
    if _syscalls.SYSCALLS is None:
        return 0
    version = syscall("landlock_create_ruleset", None, 0, _LL_CREATE_RULESET_VERSION)
    return max(0, int(version))


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= 1 << 13  # refer
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def install_landlock(writable: list[str], devices: list[str]) -> int:
    """Reads and execution anywhere in this (already private) view; every write only beneath
    ``writable``; read/write on the ``devices`` files; no TCP at all (ABI 4+); no signals or
    abstract unix sockets to processes outside the domain (ABI 6+). Returns the ABI used (0:
    Landlock absent, nothing done). Needs ``no_new_privs``."""
    abi = landlock_abi()
    if abi <= 0:
        return 0
    handled = _fs_rights(abi)
    attr = struct.pack("QQQ", handled, _NET_ALL if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = check(syscall("landlock_create_ruleset", buffer, size, 0), "landlock_create_ruleset")
    try:
        read_only = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
        device = _FS_READ_FILE | _FS_WRITE_FILE | (_FS_TRUNCATE if abi >= 3 else 0) | (_FS_IOCTL_DEV if abi >= 5 else 0)
        rules = [("/", read_only)] + [(path, handled) for path in writable] + [(path, device) for path in devices]
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = _PathBeneath(rights, fd)
                check(
                    syscall("landlock_add_rule", ruleset, _LL_RULE_PATH_BENEATH, ctypes.byref(rule), 0),
                    f"landlock_add_rule {path}",
                )
            finally:
                os.close(fd)
        check(syscall("landlock_restrict_self", ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi
