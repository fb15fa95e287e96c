"""The escape suite of issue 12: every row must be CONTAINED at the default isolation level.

Each test runs model-style attack code through ``run_python`` at ``isolation="auto"`` (on a root
machine without bwrap that is the ``kernel`` level) and checks, from the host, that nothing
happened. No xfail: where the default level cannot hold, ``run_python`` must refuse to run
(``test_refuses_to_run_when_no_safe_level_works``). The autouse fixture in ``conftest.py`` checks
that no process, work dir, mount or cgroup is left behind after each test.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sysconfig
import uuid
from pathlib import Path

import psutil
import pytest

import streamrl
from streamrl.sandbox import SandboxLimits, SandboxUnavailableError, run_python

from .leaks import HAS_CGROUP, HAS_MEMORY_CGROUP, SAFE_HERE, survivors

pytestmark = pytest.mark.skipif(not SAFE_HERE, reason="no safe level here: covered by the refusal test")

PROJECT_SRC = Path(streamrl.__file__).resolve().parent


def _attempt_writes(paths: list[str]) -> str:
    """Code that tries to create each path and prints one JSON map path -> outcome."""
    return (
        "import json\n"
        "out = {}\n"
        f"for path in {paths!r}:\n"
        "    try:\n"
        "        with open(path, 'a') as handle:\n"
        "            handle.write('escaped')\n"
        "        out[path] = 'written'\n"
        "    except OSError as exc:\n"
        "        out[path] = type(exc).__name__\n"
        "print(json.dumps(out))\n"
    )


def test_writes_outside_the_work_dir_do_not_reach_the_host(no_leftovers: Path):
    name = f"streamrl-escape-{uuid.uuid4().hex[:8]}"
    site_packages = sysconfig.get_paths()["purelib"]
    stdlib = sysconfig.get_paths()["stdlib"]
    targets = {
        f"../{name}": None,  # relative to the work dir: its parent on the host
        f"/tmp/{name}": Path("/tmp", name),
        f"/root/{name}": Path("/root", name),
        f"{PROJECT_SRC}/{name}.py": PROJECT_SRC / f"{name}.py",
        f"{PROJECT_SRC}/__init__.py": None,  # appending code to the package itself
        f"{site_packages}/{name}.pth": Path(site_packages, f"{name}.pth"),
        f"{stdlib}/{name}.py": Path(stdlib, f"{name}.py"),
        "/etc/passwd": None,
        f"/usr/{name}": Path("/usr", name),
        f"/{name}": Path("/", name),
        "/proc/sys/kernel/core_pattern": None,
    }
    init_before = (PROJECT_SRC / "__init__.py").read_bytes()
    passwd_before = Path("/etc/passwd").read_bytes()
    core_pattern_before = Path("/proc/sys/kernel/core_pattern").read_bytes()
    result = run_python(_attempt_writes(list(targets)))
    assert result.status == "ok", result
    outcomes = json.loads(result.stdout)
    for path, host in targets.items():
        if host is not None:
            assert not host.exists(), f"{path} reached the host"
        if not path.startswith("/tmp/"):  # /tmp is the sandbox's own, private one
            assert outcomes[path] != "written", f"writing {path} succeeded inside the sandbox"
    assert not any(p.name == name for p in no_leftovers.rglob("*"))  # ../ is the host temp root
    assert not list(no_leftovers.parent.glob(f"{name}*"))
    assert (PROJECT_SRC / "__init__.py").read_bytes() == init_before
    assert Path("/etc/passwd").read_bytes() == passwd_before
    assert Path("/proc/sys/kernel/core_pattern").read_bytes() == core_pattern_before


def test_host_secrets_cannot_be_read(monkeypatch):
    monkeypatch.setenv("STREAMRL_ESCAPE_SECRET", "hunter2-" + uuid.uuid4().hex)
    secret = os.environ["STREAMRL_ESCAPE_SECRET"]
    me = os.getpid()
    code = (
        "import os\n"
        f"paths = ['/proc/{me}/environ', '/proc/%d/environ' % os.getppid(), '/proc/1/environ', "
        f"'/proc/{psutil.Process().ppid()}/environ', '/etc/shadow', '/proc/{me}/cmdline', '/root/.bashrc']\n"
        "for path in paths:\n"
        "    try:\n"
        "        print(path, open(path, 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(path, type(exc).__name__)\n"
        "print('environ', dict(os.environ))\n"
    )
    result = run_python(code)
    assert result.status == "ok", result
    assert secret not in result.stdout
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["/etc/shadow"] == "FileNotFoundError"
    assert lines[f"/proc/{me}/environ"] in ("FileNotFoundError", "PermissionError")


def test_setns_into_the_host_network_namespace_fails_and_the_listener_sees_nothing():
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    me = os.getpid()
    code = (
        "import ctypes, os, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for path in ['/proc/{me}/ns/net', '/proc/1/ns/net', '/proc/self/ns/net', '/proc/{me}/ns/mnt']:\n"
        "    try:\n"
        "        fd = os.open(path, os.O_RDONLY)\n"
        "    except OSError as exc:\n"
        "        print('open', path, type(exc).__name__)\n"
        "        continue\n"
        "    rc = libc.setns(fd, 0)\n"
        "    print('setns', path, rc, ctypes.get_errno())\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('connect', type(exc).__name__)\n"
    )
    try:
        result = run_python(code)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever arrived
    finally:
        listener.close()
    assert result.status == "ok", result
    assert "connected" not in result.stdout
    for line in result.stdout.splitlines():
        if line.startswith("setns"):
            assert line.split()[2] == "-1", f"setns succeeded: {line}"


def test_writing_another_process_memory_through_proc_mem_fails():
    victim = ctypes.create_string_buffer(b"intact" * 4)
    address = ctypes.addressof(victim)
    me = os.getpid()
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for pid in [{me}, 1, os.getppid()]:\n"
        "    try:\n"
        "        fd = os.open(f'/proc/{pid}/mem', os.O_RDWR)\n"
        f"        os.pwrite(fd, b'PWNED!', {address})\n"
        "        print('wrote', pid)\n"
        "    except OSError as exc:\n"
        "        print('mem', pid, type(exc).__name__)\n"
        "class IoVec(ctypes.Structure):\n"
        "    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "data = ctypes.create_string_buffer(b'PWNED!')\n"
        f"local, remote = IoVec(ctypes.addressof(data), 6), IoVec({address}, 6)\n"
        f"rc = libc.process_vm_writev({me}, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
        "print('process_vm_writev', rc, ctypes.get_errno())\n"
        "print('ptrace', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH to PID 1
    )
    result = run_python(code)
    assert result.status == "ok", result
    assert victim.raw.startswith(b"intact")
    assert "wrote" not in result.stdout
    assert "process_vm_writev -1" in result.stdout and "ptrace -1" in result.stdout


def test_mounting_a_tmpfs_fails_even_after_unsharing():
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for target in [b'/tmp', b'/sandbox', b'/usr', b'/']:\n"
        "    print('mount', target.decode(), libc.mount(b'x', target, b'tmpfs', 0, None), ctypes.get_errno())\n"
        "print('unshare', libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno())\n"  # user + mount ns
        "print('mount-after', libc.mount(b'x', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n"
        "print('umount', libc.umount2(b'/usr', 2), ctypes.get_errno())\n"
        "print('chroot', libc.chroot(b'/tmp'), ctypes.get_errno())\n"
    )
    result = run_python(code)  # the fixture checks the host's mount table afterwards
    assert result.status == "ok", result
    for line in result.stdout.splitlines():
        assert line.split()[-2] == "-1", f"succeeded: {line}"


@pytest.mark.skipif(not HAS_CGROUP, reason="no cgroup here (the fallback is tested by the fork-cap test)")
def test_the_cgroup_cannot_be_left_and_the_process_cap_still_holds():
    code = (
        "import os, posix, time\n"
        "for path in ['/sys/fs/cgroup/pids/cgroup.procs', '/sys/fs/cgroup/cgroup.procs',\n"
        "             '/sys/fs/cgroup/memory/cgroup.procs', '/sys/fs/cgroup/unified/cgroup.procs']:\n"
        "    for value in ('0', str(os.getpid())):\n"
        "        try:\n"
        "            open(path, 'w').write(value)\n"
        "            print('left via', path)\n"
        "        except OSError as exc:\n"
        "            pass\n"
        "n = 0\n"
        "try:\n"
        "    while n < 500:\n"
        "        if posix.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            posix._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print('refused after', n)\n"
    )
    result = run_python(code, timeout=10.0, limits=SandboxLimits(max_processes=24))
    assert result.status == "ok", result
    assert "left via" not in result.stdout
    assert result.stdout.startswith("refused after") and int(result.stdout.split()[2]) < 24
    assert not survivors(result.run_id)


FORK_BOMB = (
    "import posix, time\n"
    "n = 0\n"
    "try:\n"
    "    while n < 500:\n"
    "        if posix.fork() == 0:\n"
    "            time.sleep(30)\n"
    "            posix._exit(0)\n"
    "        n += 1\n"
    "except OSError as exc:\n"
    "    print('refused after', n, type(exc).__name__)\n"
)


@pytest.mark.parametrize("cgroup", [None, False], ids=["cgroup-if-any", "no-cgroup:rlimit-nproc"])
def test_forking_past_the_process_cap_is_refused(cgroup):
    result = run_python(FORK_BOMB, timeout=10.0, limits=SandboxLimits(max_processes=24), cgroup=cgroup)
    assert result.status == "ok", result
    assert result.stdout.startswith("refused after") and int(result.stdout.split()[2]) < 24
    assert not survivors(result.run_id)


# three children, each within the per-process limit, together well over the group's
MEMORY_HOGS = (
    "import os, posix, time\n"
    "ready, told = os.pipe()\n"
    "for _ in range(3):\n"
    "    if posix.fork() == 0:\n"
    "        block = b'x' * (200 << 20)\n"  # 200 MiB, touched
    "        os.write(told, b'1')\n"
    "        time.sleep(2)\n"
    "        posix._exit(0)\n"
    "os.close(told)\n"
    "held, deadline = 0, time.time() + 4\n"
    "while time.time() < deadline and held < 3:\n"
    "    if not os.read(ready, 1):\n"
    "        break\n"
    "    held += 1\n"
    "print('held', held)\n"
)


@pytest.mark.parametrize("cgroup", [None, False], ids=["cgroup-if-any", "no-cgroup:pid1-watchdog"])
def test_forked_children_cannot_exceed_the_group_memory_limit_together(cgroup):
    result = run_python(MEMORY_HOGS, timeout=8.0, memory_mb=320, cgroup=cgroup)
    if result.status == "ok":  # the kernel killed a hog; the code saw fewer than three hold
        assert int(result.stdout.split()[1]) < 3, result
    else:  # the watchdog (or the OOM killer) ended the whole run
        assert result.status == "memory", result
        assert "memory limit" in result.error
    assert not survivors(result.run_id)


def test_disk_quota_holds_and_nothing_outside_the_work_dir_remains():
    name = f"streamrl-quota-{uuid.uuid4().hex[:8]}"
    code = (
        "import errno, os\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(6):\n"
        f"        for folder in ('/tmp', '/dev/shm', '.'):\n"
        f"            with open(f'{{folder}}/{name}-{{i}}', 'wb') as handle:\n"
        "                handle.write(b'0' * (15 << 20))\n"
        "            written += 15\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno], written)\n"
    )
    result = run_python(code, limits=SandboxLimits(disk_mb=64, file_size_mb=16))
    assert result.status == "ok", result
    code_name, written = result.stdout.split()
    assert code_name == "ENOSPC" and int(written) <= 64
    assert not list(Path("/tmp").glob(f"{name}*")) and not list(Path("/dev/shm").glob(f"{name}*"))
    again = run_python(f"import glob\nprint(glob.glob('/tmp/{name}*') + glob.glob('/dev/shm/{name}*'))")
    assert again.stdout.strip() == "[]"  # a fresh run starts from an empty /tmp


def test_killing_the_parent_kills_nothing_outside_the_sandbox():
    me = os.getpid()
    code = (
        "import os, signal\n"
        "for target in (os.getppid(), 1, " + str(me) + ", -1):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL)\n"
        "        print('sent', target)\n"
        "    except OSError as exc:\n"
        "        print('refused', target, type(exc).__name__)\n"
    )
    result = run_python(code)
    assert psutil.pid_exists(me)  # (we are still here)
    # kill(-1) takes down the code itself, nothing else
    assert result.status in ("ok", "crashed"), result
    assert f"sent {me}" not in result.stdout
    assert run_python("print('still fine')").stdout == "still fine\n"


def test_the_code_runs_unprivileged_with_no_capabilities_and_no_new_privs():
    code = (
        "import os\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())\n"
        "print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n"
        "for key in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp'):\n"
        "    print(key, status[key].strip())\n"
        "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    result = run_python(code)
    assert result.status == "ok", result
    lines = result.stdout.splitlines()
    uid, euid, gid, *_ = lines[0].split()
    assert int(uid) != 0 and int(euid) != 0 and int(gid) != 0 and lines[0].endswith("[]")
    fields = dict(line.split(" ", 1) for line in lines[1:])
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[key], 16) == 0, (key, fields[key])
    assert fields["NoNewPrivs"] == "1"
    assert max(json.loads(fields["pids"])) < 10  # a private /proc of its own PID namespace


def test_refuses_to_run_when_no_safe_level_works(monkeypatch):
    """Where the kernel cannot give the default level, the sandbox refuses, it never runs weaker."""
    from streamrl.sandbox import _syscalls
    from streamrl.sandbox import isolation as iso

    monkeypatch.setattr(_syscalls, "SYSCALLS", None)  # e.g. an architecture without a table
    monkeypatch.setattr(iso.shutil, "which", lambda _name: None)  # and no bwrap
    iso.available_isolations.cache_clear()
    try:
        assert iso.isolation_level() == "process"
        with pytest.raises(SandboxUnavailableError, match="allow_weak"):
            run_python("print('ran')")
        weak = run_python("print('ran')", allow_weak=True)
        assert weak.isolation == "process" and weak.stdout == "ran\n"
    finally:
        monkeypatch.undo()
        iso.available_isolations.cache_clear()


def test_the_code_cannot_change_another_process_limits_but_can_set_and_read_its_own():
    code = (
        "import resource\n"
        "try:\n"
        "    resource.prlimit(1, resource.RLIMIT_NOFILE, (8, 8))\n"
        "    print('lowered pid 1')\n"
        "except PermissionError:\n"
        "    print('refused')\n"
        "print('reads', resource.prlimit(1, resource.RLIMIT_NOFILE)[0] > 8)\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))\n"
        "resource.prlimit(0, resource.RLIMIT_NOFILE, (soft - 2, hard))\n"
        "print('own', resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft - 2)\n"
    )
    result = run_python(code)
    assert result.stdout.split("\n")[:3] == ["refused", "reads True", "own True"], result


@pytest.mark.skipif(not HAS_MEMORY_CGROUP, reason="needs a memory cgroup (the kernel then kills one process, not the run)")
def test_a_timeout_after_the_kernel_killed_a_process_for_memory_is_reported_as_memory():
    code = (
        "import os, posix, time\n"
        "for _ in range(2):\n"  # each within the per-process limit, together over the group's
        "    if posix.fork() == 0:\n"
        "        block = b'x' * (200 << 20)\n"
        "        time.sleep(60)\n"
        "time.sleep(60)\n"  # the parent waits on, as code waiting for its workers would
    )
    result = run_python(code, timeout=3.0, memory_mb=320)
    assert result.status == "memory" and "memory limit of 320 MiB" in result.error, result
    assert not survivors(result.run_id)
