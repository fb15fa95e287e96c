"""ctypes access to libc and raw syscalls: the wrappers, flags and per-architecture syscall
numbers that ``_confine.py``, ``_seccomp.py`` and ``_landlock.py`` build the ``kernel`` level from.

Runs inside the sandbox's trusted init (``launch.py`` embeds it in the bootstrap), so it stays
standard-library only and imports nothing from ``streamrl``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

# ----------------------------------------------------------------------------- libc
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
libc.unshare.argtypes = (ctypes.c_int,)
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWTIME
)

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


class ConfineError(OSError):
    """A step of building the sandbox failed (the run must not go ahead)."""


def check(result: int, what: str) -> int:
    """``result`` of a libc call, or the ``ConfineError`` its errno names."""
    if result < 0:
        err = ctypes.get_errno()
        raise ConfineError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def unshare(flags: int) -> None:
    check(libc.unshare(flags), f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def umount(target: str, flags: int = MNT_DETACH) -> None:
    check(libc.umount2(_b(target), flags), f"umount {target}")


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return check(libc.prctl(option, arg2, arg3, arg4, arg5), f"prctl({option})")


# ----------------------------------------------------------------------------- syscall numbers
_X86_64 = {
    "ioctl": 16, "clone": 56, "ptrace": 101, "syslog": 103, "uselib": 134, "vhangup": 153, "pivot_root": 155,
    "_sysctl": 156, "adjtimex": 159, "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
    "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179, "nfsservctl": 180,
    "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249,
    "keyctl": 250, "unshare": 272, "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
    "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446, "prlimit64": 302,
}  # fmt: skip
_AARCH64 = {
    "ioctl": 29, "clone": 220, "ptrace": 117, "syslog": 116, "vhangup": 58, "pivot_root": 41, "adjtimex": 171,
    "chroot": 51, "acct": 89, "settimeofday": 170, "mount": 40, "umount2": 39, "swapon": 224, "swapoff": 225,
    "reboot": 142, "sethostname": 161, "setdomainname": 162, "init_module": 105, "delete_module": 106,
    "quotactl": 60, "nfsservctl": 42, "lookup_dcookie": 18, "clock_settime": 112, "kexec_load": 104,
    "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97, "perf_event_open": 241,
    "fanotify_init": 262, "name_to_handle_at": 264, "open_by_handle_at": 265, "clock_adjtime": 266,
    "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273,
    "kexec_file_load": 294, "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
    "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446, "prlimit64": 261,
}  # fmt: skip
_TABLES = {"x86_64": _X86_64, "aarch64": _AARCH64}
MACHINE = platform.machine()
#: None on an architecture without a table (no ``kernel`` level, no filters); read it as
#: ``_syscalls.SYSCALLS`` when used, so there is one value to patch (tests do)
SYSCALLS: dict[str, int] | None = _TABLES.get(MACHINE)


def syscall(name: str, *args: object) -> int:
    """The raw syscall ``name``, unchecked (only where this architecture has a table)."""
    return libc.syscall(SYSCALLS[name], *args)  # type: ignore[index]


def pivot_root(new_root: str, put_old: str) -> None:
    if SYSCALLS is None:
        raise ConfineError(errno.ENOSYS, f"pivot_root: unknown architecture {MACHINE}")
    check(syscall("pivot_root", _b(new_root), _b(put_old)), "pivot_root")
