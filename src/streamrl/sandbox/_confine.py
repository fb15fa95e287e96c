"""The ``kernel`` isolation level's new root and privilege drop, through ``ctypes`` only.

This module runs INSIDE the sandbox's trusted init, before any model-written code: ``launch.py``
embeds its source in the bootstrap, so it must stay standard-library only and import nothing
from ``streamrl`` (``_syscalls.py`` holds the libc wrappers and flags it uses). The parent also
imports it (probes, tests).

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
4. the runner (PID 1's child) adds Landlock (``_landlock.py``: writes only beneath the writable
   dirs, no TCP, no signals or abstract sockets outside its domain) and a seccomp filter
   (``_seccomp.py``: no mount, setns, unshare, namespace clones, ptrace, process_vm_*, keyctl,
   bpf, io_uring, ...), where the kernel offers them (``_lockdown.harden``).
"""

from __future__ import annotations

import errno
import os

from ._syscalls import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAPBSET_DROP,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    ConfineError,
    libc,
    mount,
    pivot_root,
    prctl,
    umount,
)

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
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 0)
    status = _status_fields()
    caps = [int(status.get(name, "1"), 16) for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
    if any(caps) or status.get("NoNewPrivs") != "1" or os.getresuid() != (uid, uid, uid) or os.getgroups():
        raise ConfineError(errno.EPERM, f"dropping privileges did not hold: {status}")


def set_parent_death_signal(signal_number: int) -> None:
    prctl(PR_SET_PDEATHSIG, signal_number)
