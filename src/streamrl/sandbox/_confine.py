"""The kernel's own primitives for the ``kernel`` isolation level, through ``ctypes`` only.

This module runs INSIDE the sandbox's trusted init, before any model-written code: the parent
prepends its source to the bootstrap (``launch.py``), so it must stay standard-library only and
import nothing from ``streamrl``. The parent also imports it (probes, tests).

What the ``kernel`` level builds, in order (see ``_child._main_kernel``):

1. the spawned *outer* process (root, host namespaces) calls ``unshare(CLONE_NEWPID)`` and forks
   the sandbox's PID 1;
2. PID 1 unshares the mount, network, IPC, UTS and cgroup namespaces, makes every mount private,
   and builds a new root on a small tmpfs: the system directories, the loader files and the
   interpreter's prefixes bound read-only (bound *after* every tmpfs, so none is hidden), a
   private ``/proc`` of its PID namespace, a minimal ``/dev``, and one size-capped tmpfs that
   holds ``/sandbox`` (the work dir), ``/tmp`` and ``/dev/shm`` together (one disk quota);
   then ``pivot_root`` into it, the old root detached, ``/`` remounted read-only;
3. PID 1 drops to a dedicated unprivileged uid/gid (no supplementary groups, an empty
   capability bounding set, no ambient capabilities, ``no_new_privs``) and checks the result
   in ``/proc/self/status``;
4. the runner (PID 1's child) adds Landlock (writes only beneath the writable dirs, no TCP, no
   signals or abstract sockets outside its domain) and a seccomp filter (no mount, setns,
   unshare, namespace clones, ptrace, process_vm_*, keyctl, bpf, io_uring, ...), where the
   kernel offers them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

# ----------------------------------------------------------------------------- libc
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)

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
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


class ConfineError(OSError):
    """A step of building the sandbox failed (the run must not go ahead)."""


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise ConfineError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(_b(target), flags), f"umount {target}")


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_libc.prctl(option, arg2, arg3, arg4, arg5), f"prctl({option})")


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
    "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
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
    "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
}  # fmt: skip
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_TABLES = {"x86_64": _X86_64, "aarch64": _AARCH64}
MACHINE = platform.machine()
SYSCALLS: dict[str, int] | None = _TABLES.get(MACHINE)

#: denied outright (EPERM); ``clone`` is denied only with a namespace flag, ``clone3`` answers
#: ENOSYS (its flags sit behind a pointer, so libc falls back to ``clone``), and ``ioctl`` only
#: for the terminal-injection requests
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


def pivot_root(new_root: str, put_old: str) -> None:
    if SYSCALLS is None:
        raise ConfineError(errno.ENOSYS, f"pivot_root: unknown architecture {MACHINE}")
    _check(_libc.syscall(SYSCALLS["pivot_root"], _b(new_root), _b(put_old)), "pivot_root")


# ----------------------------------------------------------------------------- seccomp
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
    if SYSCALLS is None:
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
        if name in SYSCALLS:
            prog += [_insn(_BPF_JEQ_K, 0, 1, SYSCALLS[name]), _insn(_BPF_RET_K, 0, 0, eperm)]
    prog += [_insn(_BPF_JEQ_K, 0, 1, SYSCALLS["clone3"]), _insn(_BPF_RET_K, 0, 0, enosys)]
    prog += [
        _insn(_BPF_JEQ_K, 0, 4, SYSCALLS["clone"]),
        _insn(_BPF_LD_W_ABS, 0, 0, 16),  # args[0] (flags), low 32 bits
        _insn(_BPF_JSET_K, 0, 1, NAMESPACE_FLAGS),
        _insn(_BPF_RET_K, 0, 0, eperm),
        _insn(_BPF_RET_K, 0, 0, _RET_ALLOW),
    ]
    prog += [
        _insn(_BPF_JEQ_K, 0, 5, SYSCALLS["ioctl"]),
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
    result = _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)
    if result < 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS):
            return False
        raise ConfineError(err, f"seccomp: {os.strerror(err)}")
    return True


def seccomp_available() -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            return SYSCALLS is not None and any(line.startswith("Seccomp:") for line in handle)
    except OSError:
        return False


# ----------------------------------------------------------------------------- Landlock
_LL_CREATE_RULESET_VERSION = 1
_LL_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 14, 1 << 15
_NET_ALL = (1 << 0) | (1 << 1)  # bind and connect TCP
_SCOPE_ALL = (1 << 0) | (1 << 1)  # abstract unix sockets, signals


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or disabled."""
    if SYSCALLS is None:
        return 0
    version = _libc.syscall(SYSCALLS["landlock_create_ruleset"], None, 0, _LL_CREATE_RULESET_VERSION)
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
    ruleset = _check(
        _libc.syscall(SYSCALLS["landlock_create_ruleset"], buffer, size, 0), "landlock_create_ruleset"  # type: ignore[index]
    )
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
                _check(
                    _libc.syscall(SYSCALLS["landlock_add_rule"], ruleset, _LL_RULE_PATH_BENEATH, ctypes.byref(rule), 0),  # type: ignore[index]
                    f"landlock_add_rule {path}",
                )
            finally:
                os.close(fd)
        _check(_libc.syscall(SYSCALLS["landlock_restrict_self"], ruleset, 0), "landlock_restrict_self")  # type: ignore[index]
    finally:
        os.close(ruleset)
    return abi


# ----------------------------------------------------------------------------- the new root
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
DEVICES = ("null", "zero", "full", "random", "urandom")
WORKDIR = "/sandbox"
#: the dirs (in the new root) that the code may write, all on the one quota tmpfs
WRITABLE = (WORKDIR, "/tmp", "/dev/shm")
_PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")


def _mkdirs(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)


def _bind_read_only(source: str, target: str, extra: int = MS_NOSUID | MS_NODEV) -> None:
    mount(source, target, None, MS_BIND)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | extra)


def _placeholder(source: str, target: str) -> None:
    """Create ``target`` (a dir or an empty file, like ``source``) to bind ``source`` onto."""
    if os.path.isdir(source):
        _mkdirs(target)
    else:
        _mkdirs(os.path.dirname(target))
        with open(target, "a"):
            pass


def build_root(root: str, binds: list[list[str]], disk_bytes: int, inodes: int, uid: int, gid: int) -> None:
    """Turn this (fresh, private) mount namespace into the sandbox's view and enter it.

    ``root`` is an existing empty directory (the host work dir) that becomes the new ``/``;
    ``binds`` are (source, destination) pairs bound read-only, last of all.
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("sandbox-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=0755")
    # the one writable filesystem, size- and inode-capped, holding the work dir, /tmp and /dev/shm
    quota = os.path.join(root, ".quota")
    os.mkdir(quota, 0o700)
    mount("sandbox-work", quota, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(disk_bytes)},nr_inodes={int(inodes)},mode=0755")
    for name in ("work", "tmp", "shm"):
        os.mkdir(os.path.join(quota, name), 0o700)
        os.chown(os.path.join(quota, name), uid, gid)
    for name, target in (("work", WORKDIR), ("tmp", "/tmp")):
        _mkdirs(root + target)
        mount(os.path.join(quota, name), root + target, None, MS_BIND)
    # /dev: a few device nodes bound from the host, nothing else
    dev = root + "/dev"
    _mkdirs(dev)
    mount("sandbox-dev", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _placeholder(f"/dev/{name}", f"{dev}/{name}")
            mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
            mount(None, f"{dev}/{name}", None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm", 0o755)
    mount(os.path.join(quota, "shm"), f"{dev}/shm", None, MS_BIND)
    mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    umount(quota)
    os.rmdir(quota)
    # a private /proc of this PID namespace, its kernel knobs read-only
    _mkdirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in _PROC_READ_ONLY:
        path = f"{root}/proc/{name}"
        if os.path.exists(path):
            try:
                _bind_read_only(path, path, MS_NOSUID | MS_NODEV | MS_NOEXEC)
            except ConfineError:
                pass
    # read-only system dirs, loader files and the interpreter: after every tmpfs, so that no
    # later mount hides them (a venv under /tmp stays visible)
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            _mkdirs(root + path)
            _bind_read_only(path, root + path)
    for path in LOADER_FILES:
        if os.path.exists(path):
            _placeholder(path, root + path)
            _bind_read_only(path, root + path)
    for source, dest in binds:
        if not os.path.exists(source):
            continue
        _placeholder(source, root + dest)
        _bind_read_only(source, root + dest)
    os.chdir(root)
    pivot_root(".", ".")
    umount(".")
    os.chdir("/")
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(WORKDIR)


# ----------------------------------------------------------------------------- privileges
def _status_fields() -> dict[str, str]:
    fields = {}
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def drop_privileges(uid: int, gid: int) -> None:
    """For good: no groups, an empty bounding set, no ambient caps, then the uid (which clears
    the permitted and effective sets), then ``no_new_privs``. Raises unless the kernel agrees."""
    try:
        last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())
    except (OSError, ValueError):
        last_cap = 63
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    for cap in range(last_cap + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 0)
    status = _status_fields()
    caps = [int(status.get(name, "1"), 16) for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
    if any(caps) or status.get("NoNewPrivs") != "1" or os.getresuid() != (uid, uid, uid) or os.getgroups():
        raise ConfineError(errno.EPERM, f"dropping privileges did not hold: {status}")


def set_parent_death_signal(signal_number: int) -> None:
    prctl(PR_SET_PDEATHSIG, signal_number)


# ----------------------------------------------------------------------------- memory fallback
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes_of_namespace() -> int:
    """Resident memory of every process this PID namespace's ``/proc`` lists (the fallback
    group total where no memory cgroup is available)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/statm", "rb") as handle:
                total += int(handle.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total
