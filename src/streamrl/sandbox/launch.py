"""Everything one sandboxed interpreter needs before it starts, and the clean-up after it.

Shared by the one-shot runner and the persistent session: a fresh temp dir, an optional cgroup
(processes and memory), a dedicated uid (``kernel`` level), the status pipe of the sandbox's
init, the minimal environment and the wrapped command.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from streamrl.sandbox import _child, _confine, _frames, _landlock, _lockdown, _run_code, _seccomp, _syscalls
from streamrl.sandbox.cgroup import RunCgroup
from streamrl.sandbox.levels import Isolation, interpreter_binds
from streamrl.sandbox.limits import SandboxLimits

WORKDIR_PREFIX = "streamrl-sbx-"
Mode = Literal["once", "session"]


@functools.lru_cache(maxsize=1)
def _spawner_thread() -> concurrent.futures.ThreadPoolExecutor:
    """One thread that lives as long as the process, for ``Launch.spawn(outlive_caller=True)``."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamrl-sandbox-spawner")


#: the modules the sandboxed interpreter runs, each after the ones it imports (a relative import
#: finds only those registered before it)
CHILD_MODULES = (_syscalls, _seccomp, _landlock, _confine, _frames, _lockdown, _run_code, _child)
#: the package the bootstrap registers them in: the sandboxed interpreter cannot import
#: ``streamrl``, so the bootstrap carries their source
CHILD_PACKAGE = "_sbx"

_BOOTSTRAP_LOADER = """\
import sys, types


def _load(package_name, sources):
    package = types.ModuleType(package_name)
    package.__path__ = []  # a package whose only submodules are the ones registered here
    sys.modules[package_name] = package
    for name, source in sources:
        module = types.ModuleType(f"{package_name}.{name}")
        module.__package__ = package_name  # so that relative imports resolve here
        sys.modules[module.__name__] = module
        exec(compile(source, f"{name}.py", "exec"), module.__dict__)
        setattr(package, name, module)
"""


@functools.lru_cache(maxsize=1)
def _child_source() -> str:
    """The bootstrap: every module of ``CHILD_MODULES`` as ``_sbx.<name>``, then ``_child.main()``."""
    # the child modules are plain source files of this package: each has a ``__file__``
    sources = tuple(
        (module.__name__.rpartition(".")[2], Path(cast(str, module.__file__)).read_text(encoding="utf-8"))
        for module in CHILD_MODULES
    )
    return (
        _BOOTSTRAP_LOADER
        + f"_load({CHILD_PACKAGE!r}, {sources!r})\n"
        + f"sys.modules[{CHILD_PACKAGE + '._child'!r}].main()\n"
    )


#: the ``kernel`` level's dedicated uids (and gids): one per run, never 0, never a real user's
UID_BASE = 1_000_000_000
_UIDS_PER_PROCESS = 1024


class _UidPool:
    """Hands out a uid no other live run of this process has (and, by the pid-derived block,
    almost surely none of another process): ``RLIMIT_NPROC`` then counts this run alone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()

    def acquire(self) -> int:
        block = UID_BASE + (os.getpid() % 8192) * _UIDS_PER_PROCESS
        with self._lock:
            for slot in range(_UIDS_PER_PROCESS):
                if block + slot not in self._used:
                    self._used.add(block + slot)
                    return block + slot
        raise RuntimeError(f"more than {_UIDS_PER_PROCESS} sandboxes at once in one process")

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


UIDS = _UidPool()


def minimal_env(home: str) -> dict[str, str]:
    """The child's whole environment: never the parent's, which may hold tokens and keys."""
    return {
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


@dataclass
class Launch:
    """One prepared interpreter: pass ``argv``/``env``/``cwd`` and ``pass_fds`` to the spawner."""

    run_id: str
    argv: list[str]
    env: dict[str, str]
    workdir: str
    isolation: Isolation
    cgroup: RunCgroup | None
    status_read: int
    status_write: int
    uid: int | None = None
    _report: bytes = field(default=b"", repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self.status_write,)

    def spawned(self) -> None:
        """Drop the parent's copy of the status pipe's write end (the child has its own)."""
        if self.status_write >= 0:
            os.close(self.status_write)
            self.status_write = -1

    def child_report(self) -> dict[str, Any] | None:
        """The init's one-line report on how the code ended; None if it never wrote one."""
        while True:
            try:
                chunk = os.read(self.status_read, 4096)
            except OSError:  # BlockingIOError: nothing (more) written yet
                break
            if not chunk:
                break
            self._report += chunk
        line = self._report.split(b"\n", 1)[0]
        try:
            report = json.loads(line) if line else None
        except ValueError:
            return None
        return report if isinstance(report, dict) else None

    def spawn(self, stdin: Any, stdout: Any, stderr: Any, *, outlive_caller: bool = False) -> subprocess.Popen:
        """Start the interpreter as the leader of a new session (its pid is the group id).

        ``outlive_caller``: fork from one long-lived thread. ``bwrap --die-with-parent`` relies
        on PR_SET_PDEATHSIG, which fires when the *thread* that forked it exits, so a persistent
        worker started from a short-lived thread would die with that thread.
        """

        def start() -> subprocess.Popen:
            return subprocess.Popen(
                self.argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                cwd=self.workdir,
                env=self.env,
                start_new_session=True,
                pass_fds=self.pass_fds,
            )

        proc = _spawner_thread().submit(start).result() if outlive_caller else start()
        self.spawned()
        return proc

    def interrupt(self, leader_pid: int) -> bool:
        """Ask the sandbox's init to kill and reap the code itself; True if a wait is worth it.

        A code process SIGKILLed together with its init would be an orphaned zombie for a
        while, so its process group would outlive the run. Not for bwrap, whose own init
        reaps everything in its namespace.
        """
        if not self.isolation.init_is_leader:
            return False
        try:
            os.kill(leader_pid, _child.STOP_SIGNAL)
        except ProcessLookupError:
            return False
        return True

    def kill(self, pgid: int | None) -> None:
        """SIGKILL the process group and every member of the cgroup (setsid escapees too)."""
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def oom_killed(self) -> bool:
        """The kernel killed a process of this run for the group's memory limit."""
        return self.cgroup is not None and self.cgroup.has_memory and self.cgroup.oom_kills() > 0

    def cleanup(self) -> None:
        """Close the pipe, delete the cgroup and the temp dir. Call after the process is reaped."""
        if self._closed:
            return
        self._closed = True
        self.spawned()
        os.close(self.status_read)
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.uid is not None:
            UIDS.release(self.uid)
        shutil.rmtree(self.workdir, ignore_errors=True)


def prepare_launch(
    *,
    mode: Mode,
    limits: SandboxLimits,
    isolation: Isolation,
    use_cgroup: bool | None,
    cpu_seconds: int,
    echo_last_expr: bool,
    code: str | None = None,
) -> Launch:
    """Create the temp dir (with the code file for a one-shot run), the cgroup and the pipe."""
    run_id = uuid.uuid4().hex[:16]
    memory_bytes = int(limits.memory_mb) * 1024 * 1024
    cgroup = None
    if use_cgroup is not False:
        cgroup = RunCgroup.create(run_id, limits.max_processes, memory_bytes)
        if cgroup is None and use_cgroup:
            raise RuntimeError("a cgroup was required (cgroup=True) but /sys/fs/cgroup does not allow one here")
    workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
    uid = UIDS.acquire() if isolation.confine else None
    try:
        if code is not None:
            Path(workdir, _child.CODE_FILE_NAME).write_text(code, encoding="utf-8", errors="replace")
        status_read, status_write = os.pipe()
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        if cgroup is not None:
            cgroup.remove()
        if uid is not None:
            UIDS.release(uid)
        raise
    os.set_blocking(status_read, False)
    disk_bytes = int(limits.disk_mb) * 1024 * 1024
    group_memory = cgroup is not None and cgroup.has_memory
    config: dict[str, Any] = {
        "mode": mode,
        "status_fd": status_write,
        "rlimits": limits.rlimits(cpu_seconds),
        "stub_network": not isolation.network_namespace,
        "echo_last_expr": echo_last_expr,
        "max_output_chars": limits.max_output_bytes,
        # the init's own wall clock, in case the parent dies before enforcing its own
        "watchdog_s": limits.timeout_s + 2.0 if mode == "once" else None,
        "run_id": run_id,  # lets tests and operators find a run's processes by command line
        "harden": isolation.harden,
        "input_dir": isolation.input_dir,
        # the fallback total where no memory cgroup holds the group: only for the ``kernel``
        # level, whose PID 1 sees (and may kill) nothing but the run's own processes
        "memory_poll_bytes": memory_bytes if isolation.confine and not group_memory else None,
    }
    if isolation.confine:
        config["confine"] = {
            "root": workdir,
            "binds": [list(pair) for pair in interpreter_binds()],
            "disk_bytes": disk_bytes,
            "inodes": 16384,
            "uid": uid,
            "gid": uid,
        }
    # -u: what the code printed before a timeout kill reaches the pipe (a buffer would die with it)
    interpreter = [sys.executable, "-I", "-B", "-u", "-c", _child_source(), json.dumps(config)]
    argv = isolation.command(workdir, interpreter, disk_bytes)
    if cgroup is not None:
        argv = cgroup.join_command(argv)
    return Launch(
        run_id=run_id,
        argv=argv,
        env=minimal_env(isolation.workdir_inside(workdir)),
        workdir=workdir,
        isolation=isolation,
        cgroup=cgroup,
        status_read=status_read,
        status_write=status_write,
        uid=uid,
    )


#: what the probe's code prints where the level holds
_PROBE_CODE = "import os\nprint('probe-ok', os.getuid())\n"


def probe_launch(isolation: Isolation, timeout_s: float = 20.0) -> bool:
    """Start one trivial run at ``isolation`` through the real launcher (no cgroup), and check
    that it ran, and, for the ``kernel`` level, as its dedicated uid."""
    launch = prepare_launch(
        mode="once",
        limits=SandboxLimits(timeout_s=timeout_s),
        isolation=isolation,
        use_cgroup=False,
        cpu_seconds=int(timeout_s) + 1,
        echo_last_expr=False,
        code=_PROBE_CODE,
    )
    try:
        done = subprocess.run(
            launch.argv,
            cwd=launch.workdir,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            pass_fds=launch.pass_fds,
            start_new_session=True,
        )
        launch.spawned()
        words = done.stdout.decode(errors="replace").split()
        report = launch.child_report()
        if done.returncode != 0 or report is None or report.get("exit") != 0 or words[:1] != ["probe-ok"]:
            return False
        return not isolation.confine or words[1:2] == [str(launch.uid)]
    finally:
        launch.cleanup()
