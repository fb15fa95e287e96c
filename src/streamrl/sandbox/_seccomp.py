"""The runner's seccomp filter: the syscalls that could leave or reshape the sandbox answer EPERM.

Runs inside the sandbox (``launch.py`` embeds it in the bootstrap): standard library only. The
syscall numbers come from ``_syscalls.py``'s per-architecture tables; an architecture without
one gets no filter (the startup line says so).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from . import _syscalls
from ._syscalls import MACHINE, NAMESPACE_FLAGS, ConfineError, libc

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

#: denied outright (EPERM); ``clone`` is denied only with a namespace flag, ``clone3`` answers
#: ENOSYS (its flags sit behind a pointer, so libc falls back to ``clone``), ``ioctl`` only for
#: the terminal-injection requests, and ``prlimit64`` only when it sets another process's limits
#: (the sandbox's own PID 1 shares the code's user: lowering its limits would break the run's
#: supervision; ``setrlimit`` and ``prlimit(0, ...)`` on itself, and reading any, still work)
DENIED_SYSCALLS = (
    "mount", "umount2", "pivot_root", "chroot", "setns", "unshare", "ptrace", "process_vm_readv",
    "process_vm_writev", "kcmp", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "quotactl_fd", "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm",
    "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "lookup_dcookie", "fanotify_init", "io_uring_setup", "io_uring_enter", "io_uring_register", "open_tree",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "pidfd_getfd", "vhangup",
    "uselib", "nfsservctl", "_sysctl",
)  # fmt: skip
TIOCSTI, TIOCLINUX = 0x5412, 0x541C

_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_X32_SYSCALL_BIT = 0x40000000


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program() -> bytes | None:
    """The filter as raw ``sock_filter`` bytes, or None on an architecture without a table."""
    numbers = _syscalls.SYSCALLS
    if numbers is None:
        return None
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog = [
        _insn(_BPF_LD_W_ABS, 0, 0, 4),  # arch
        _insn(_BPF_JEQ_K, 1, 0, _AUDIT_ARCH[MACHINE]),
        _insn(_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_BPF_LD_W_ABS, 0, 0, 0),  # nr
    ]
    if MACHINE == "x86_64":  # the x32 ABI: another syscall table, refuse all of it
        prog += [_insn(_BPF_JGE_K, 0, 1, _X32_SYSCALL_BIT), _insn(_BPF_RET_K, 0, 0, eperm)]
    for name in DENIED_SYSCALLS:
        if name in numbers:
            prog += [_insn(_BPF_JEQ_K, 0, 1, numbers[name]), _insn(_BPF_RET_K, 0, 0, eperm)]
    prog += [
        _insn(_BPF_JEQ_K, 0, 8, numbers["prlimit64"]),
        _insn(_BPF_LD_W_ABS, 0, 0, 16),  # args[0] (pid), low 32 bits: pid_t is an int
        _insn(_BPF_JEQ_K, 5, 0, 0),  # pid 0: the caller itself
        _insn(_BPF_LD_W_ABS, 0, 0, 32),  # args[2] (new limits), low 32 bits
        _insn(_BPF_JEQ_K, 0, 2, 0),
        _insn(_BPF_LD_W_ABS, 0, 0, 36),  # args[2], high 32 bits
        _insn(_BPF_JEQ_K, 1, 0, 0),  # NULL: only reads the limits
        _insn(_BPF_RET_K, 0, 0, eperm),
        _insn(_BPF_RET_K, 0, 0, _RET_ALLOW),
    ]
    prog += [_insn(_BPF_JEQ_K, 0, 1, numbers["clone3"]), _insn(_BPF_RET_K, 0, 0, enosys)]
    prog += [
        _insn(_BPF_JEQ_K, 0, 4, numbers["clone"]),
        _insn(_BPF_LD_W_ABS, 0, 0, 16),  # args[0] (flags), low 32 bits
        _insn(_BPF_JSET_K, 0, 1, NAMESPACE_FLAGS),
        _insn(_BPF_RET_K, 0, 0, eperm),
        _insn(_BPF_RET_K, 0, 0, _RET_ALLOW),
    ]
    prog += [
        _insn(_BPF_JEQ_K, 0, 5, numbers["ioctl"]),
        _insn(_BPF_LD_W_ABS, 0, 0, 24),  # args[1] (request), low 32 bits
        _insn(_BPF_JEQ_K, 2, 0, TIOCSTI),
        _insn(_BPF_JEQ_K, 1, 0, TIOCLINUX),
        _insn(_BPF_RET_K, 0, 0, _RET_ALLOW),
        _insn(_BPF_RET_K, 0, 0, eperm),
    ]
    prog.append(_insn(_BPF_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp() -> bool:
    """Install the filter on this thread (needs ``no_new_privs``); False if unsupported here."""
    program = seccomp_program()
    if program is None:
        return False
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    result = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)
    if result < 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS):
            return False
        raise ConfineError(err, f"seccomp: {os.strerror(err)}")
    return True


def seccomp_available() -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            return _syscalls.SYSCALLS is not None and any(line.startswith("Seccomp:") for line in handle)
    except OSError:
        return False
