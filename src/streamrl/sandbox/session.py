"""A persistent sandboxed interpreter per trajectory (a notebook-like session).

One worker process (same isolation, rlimits and cgroup as a one-shot run) executes cells in one
namespace and answers each with a length-prefixed JSON frame over its pipes. A final bare
expression is echoed with ``repr``. ``RLIMIT_CPU`` counts over the worker's whole life, so it
is the session's CPU budget; each cell also has a wall timeout. After a timeout or a crash the
worker is killed, the next cell starts a fresh one, and the result says ``state_reset=True``.
"""

from __future__ import annotations

import math
import os
import select
import subprocess
import threading
import time
from typing import Any

from streamrl.sandbox._frames import FRAME_HEADER, MAX_FRAME_BYTES, decode_payload, encode_frame
from streamrl.sandbox.gate import GATE
from streamrl.sandbox.isolation import resolve_isolation
from streamrl.sandbox.launch import Launch, prepare_launch
from streamrl.sandbox.limits import SandboxLimits
from streamrl.sandbox.result import SandboxResult, classify
from streamrl.sandbox.runner import resolve_limits

#: how long the init of a worker that died on its own gets to report why, before SIGKILL
_EXIT_GRACE_S = 3.0
#: how long the init gets to kill and reap the worker when asked to
_INTERRUPT_GRACE_S = 0.5


def _wait_ready(fd: int, events: int, deadline: float) -> None:
    poller = select.poll()
    poller.register(fd, events)
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not poller.poll(remaining * 1000):
        raise TimeoutError


class _Worker:
    """One live worker process and its pipes."""

    def __init__(self, launch: Launch, proc: subprocess.Popen, cpu_limit_s: int):
        self.launch = launch
        self.proc = proc
        self.cpu_limit_s = cpu_limit_s
        self.cpu_reported = 0.0
        self.oom_killed = False
        assert proc.stdin is not None and proc.stdout is not None
        self._requests = proc.stdin.fileno()
        self._replies = proc.stdout.fileno()

    def _write_all(self, data: bytes, deadline: float) -> bool:
        view = memoryview(data)
        while view:
            _wait_ready(self._requests, select.POLLOUT, deadline)
            try:
                written = os.write(self._requests, view)
            except (BrokenPipeError, OSError):
                return False
            view = view[written:]
        return True

    def _read_exact(self, size: int, deadline: float) -> bytes | None:
        chunks, remaining = [], size
        while remaining:
            _wait_ready(self._replies, select.POLLIN, deadline)
            chunk = os.read(self._replies, min(remaining, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def request(self, message: dict[str, Any], deadline: float) -> dict[str, Any] | None:
        """Send one cell and wait for its reply; None if the worker died or spoke garbage.

        Raises ``TimeoutError`` at ``deadline``.
        """
        if not self._write_all(encode_frame(message), deadline):
            return None
        header = self._read_exact(FRAME_HEADER.size, deadline)
        if header is None:
            return None
        (size,) = FRAME_HEADER.unpack(header)
        payload = self._read_exact(size, deadline) if size <= MAX_FRAME_BYTES else None
        if payload is None:
            return None
        try:
            reply = decode_payload(payload)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    def stop(self, grace_s: float = 0.0) -> dict[str, Any] | None:
        """End the worker, reap it, clean up; the init's report when it wrote one. ``grace_s``
        is how long to wait for that report first (after the code died on its own)."""
        if grace_s > 0:
            try:
                _wait_ready(self.launch.status_read, select.POLLIN, time.monotonic() + grace_s)
            except TimeoutError:
                pass
        if self.proc.poll() is None and self.launch.interrupt(self.proc.pid):
            try:
                self.proc.wait(timeout=_INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self.launch.kill(self.proc.pid)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was already sent
            pass
        report = self.launch.child_report()
        self.oom_killed = self.launch.oom_killed()
        self.launch.cleanup()
        return report


class PythonSession:
    """A persistent sandboxed Python for one trajectory. Not shared between threads at once
    (calls are serialised by a lock). ``close()`` kills the worker; use it as a context manager.

    ``timeout``/``memory_mb``/``limits``/``isolation``/``cgroup`` mean what they mean for
    ``run_python``, and so does ``allow_weak``; ``timeout`` is per cell. ``cpu_budget_s`` is the CPU time of the whole
    session, over every worker it starts.
    """

    def __init__(
        self,
        timeout: float | None = None,
        memory_mb: int | None = None,
        *,
        cpu_budget_s: float = 60.0,
        limits: SandboxLimits | None = None,
        isolation: str = "auto",
        cgroup: bool | None = None,
        echo_last_expr: bool = True,
        allow_weak: bool | None = None,
    ):
        if isinstance(cpu_budget_s, bool) or not isinstance(cpu_budget_s, (int, float)) or not cpu_budget_s > 0:
            raise ValueError(f"PythonSession cpu_budget_s must be a positive number, got {cpu_budget_s!r}")
        self.limits = resolve_limits(timeout, memory_mb, limits)
        self.cpu_budget_s = float(cpu_budget_s)
        self._isolation = resolve_isolation(isolation, allow_weak=allow_weak)
        self._cgroup = cgroup
        self._echo = echo_last_expr
        self._worker: _Worker | None = None
        self._cpu_spent_s = 0.0  # by workers already gone
        self._closed = False
        self._lock = threading.Lock()

    @property
    def isolation(self) -> str:
        return self._isolation.level

    @property
    def alive(self) -> bool:
        return self._worker is not None and self._worker.proc.poll() is None

    @property
    def worker_pid(self) -> int | None:
        return None if self._worker is None else self._worker.proc.pid

    @property
    def cpu_used_s(self) -> float:
        current = 0.0 if self._worker is None else self._worker.cpu_reported
        return self._cpu_spent_s + current

    def _result(self, started: float, **fields: Any) -> SandboxResult:
        fields.setdefault("stdout", "")
        fields.setdefault("stderr", "")
        fields.setdefault("returncode", None)
        return SandboxResult(duration_s=time.monotonic() - started, isolation=self.isolation, **fields)

    def _spawn(self, cpu_limit_s: int) -> _Worker:
        launch = prepare_launch(
            mode="session",
            limits=self.limits,
            isolation=self._isolation,
            use_cgroup=self._cgroup,
            cpu_seconds=cpu_limit_s,
            echo_last_expr=self._echo,
        )
        try:
            proc = launch.spawn(
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, outlive_caller=True
            )
        except BaseException:
            launch.cleanup()
            raise
        return _Worker(launch, proc, cpu_limit_s)

    def _discard_worker(self, grace_s: float, extra_cpu_s: float) -> dict[str, Any] | None:
        worker, self._worker = self._worker, None
        if worker is None:
            return None
        report = worker.stop(grace_s)
        if report is not None and "cpu_s" in report:
            self._cpu_spent_s += float(report["cpu_s"])
        else:
            self._cpu_spent_s += worker.cpu_reported + extra_cpu_s
        return report

    def run(self, code: str, timeout: float | None = None) -> SandboxResult:
        """Execute one cell; never raises for anything the code does."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        cell_timeout = self.limits.timeout_s if timeout is None else float(timeout)
        if not cell_timeout > 0:
            raise ValueError(f"cell timeout must be positive, got {timeout!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError("this PythonSession is closed")
            started = time.monotonic()
            remaining = self.cpu_budget_s - self.cpu_used_s
            if remaining <= 0:
                return self._result(
                    started,
                    status="timeout",
                    error=f"TimeoutError: the session's CPU budget of {self.cpu_budget_s:g} s is used up",
                )
            GATE.acquire()
            try:
                return self._run_cell(code, cell_timeout, math.ceil(remaining), started)
            finally:
                GATE.release()

    def _run_cell(self, code: str, cell_timeout: float, cpu_limit_s: int, started: float) -> SandboxResult:
        if self._worker is None:
            try:
                self._worker = self._spawn(cpu_limit_s)
            except OSError as exc:
                return self._result(started, status="crashed", error=f"sandbox failure: could not start ({exc})")
        worker = self._worker
        try:
            reply = worker.request({"code": code, "echo": self._echo}, deadline=started + cell_timeout)
        except TimeoutError:
            self._discard_worker(grace_s=0.0, extra_cpu_s=cell_timeout)
            return self._result(
                started,
                status="timeout",
                error=f"TimeoutError: execution exceeded the {cell_timeout:g} s time limit",
                state_reset=True,
                run_id=worker.launch.run_id,
                pid=worker.proc.pid,
            )
        if reply is None:
            report = self._discard_worker(grace_s=_EXIT_GRACE_S, extra_cpu_s=0.0)
            status, error, returncode = classify(
                killed_for=None,
                child=report,
                stderr="",
                timeout_s=cell_timeout,
                cpu_limit_s=worker.cpu_limit_s,
                max_output_bytes=self.limits.max_output_bytes,
                memory_killed=worker.oom_killed,
                memory_mb=self.limits.memory_mb,
            )
            if status == "timeout":
                error = f"TimeoutError: the session's CPU budget of {self.cpu_budget_s:g} s is used up"
                self._cpu_spent_s = max(self._cpu_spent_s, self.cpu_budget_s)
            elif status in ("ok", "error"):  # the worker itself exited (os._exit, a closed pipe)
                status, error = "crashed", f"the Python worker exited (code {returncode})"
            return self._result(
                started,
                status=status,
                error=error,
                returncode=returncode,
                state_reset=True,
                run_id=worker.launch.run_id,
                pid=worker.proc.pid,
            )
        worker.cpu_reported = float(reply.get("cpu_s", worker.cpu_reported))
        error = reply.get("error")
        status = "memory" if reply.get("memory") else ("error" if error else "ok")
        return self._result(
            started,
            status=status,
            stdout=str(reply.get("stdout", "")),
            stderr=str(reply.get("stderr", "")),
            error=error,
            truncated=bool(reply.get("truncated")),
            cpu_s=worker.cpu_reported,
            run_id=worker.launch.run_id,
            pid=worker.proc.pid,
        )

    def reset(self) -> None:
        """Forget all state: kill the worker; the next cell starts a fresh one."""
        with self._lock:
            self._discard_worker(grace_s=0.0, extra_cpu_s=0.0)

    def close(self) -> None:
        """Kill the worker and clean up. Idempotent."""
        with self._lock:
            self._closed = True
            self._discard_worker(grace_s=0.0, extra_cpu_s=0.0)

    def __enter__(self) -> PythonSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the worker exits on its own at EOF
            pass
