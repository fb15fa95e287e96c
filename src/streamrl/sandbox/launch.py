"""Everything one sandboxed interpreter needs before it starts, and the clean-up after it.

Shared by the one-shot runner and the persistent session: a fresh temp dir, an optional pids
cgroup, the status pipe of the sandbox's init, the minimal environment and the wrapped command.
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
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from streamrl.sandbox import _child
from streamrl.sandbox.cgroup import PidsCgroup
from streamrl.sandbox.isolation import Isolation
from streamrl.sandbox.limits import SandboxLimits

WORKDIR_PREFIX = "streamrl-sbx-"
Mode = Literal["once", "session"]


@functools.lru_cache(maxsize=1)
def _spawner_thread() -> concurrent.futures.ThreadPoolExecutor:
    """One thread that lives as long as the process, for ``Launch.spawn(outlive_caller=True)``."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamrl-sandbox-spawner")


@functools.lru_cache(maxsize=1)
def _child_source() -> str:
    return Path(_child.__file__).read_text(encoding="utf-8")


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
    cgroup: PidsCgroup | None
    status_read: int
    status_write: int
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

    def cleanup(self) -> None:
        """Close the pipe, delete the cgroup and the temp dir. Call after the process is reaped."""
        if self._closed:
            return
        self._closed = True
        self.spawned()
        os.close(self.status_read)
        if self.cgroup is not None:
            self.cgroup.remove()
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
    cgroup = None
    if use_cgroup is not False:
        cgroup = PidsCgroup.create(run_id, limits.max_processes)
        if cgroup is None and use_cgroup:
            raise RuntimeError("a pids cgroup was required (cgroup=True) but /sys/fs/cgroup does not allow one here")
    workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
    try:
        if code is not None:
            Path(workdir, _child.CODE_FILE_NAME).write_text(code, encoding="utf-8", errors="replace")
        status_read, status_write = os.pipe()
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        if cgroup is not None:
            cgroup.remove()
        raise
    os.set_blocking(status_read, False)
    config = {
        "mode": mode,
        "status_fd": status_write,
        "rlimits": limits.rlimits(cpu_seconds),
        "stub_network": not isolation.network_namespace,
        "echo_last_expr": echo_last_expr,
        "max_output_chars": limits.max_output_bytes,
        # the init's own wall clock, in case the parent dies before enforcing its own
        "watchdog_s": limits.timeout_s + 2.0 if mode == "once" else None,
        "run_id": run_id,  # lets tests and operators find a run's processes by command line
    }
    interpreter = [sys.executable, "-I", "-B", "-c", _child_source(), json.dumps(config)]
    argv = isolation.command(workdir, interpreter)
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
    )
