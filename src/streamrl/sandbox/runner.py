"""One-shot execution: a fresh sandboxed interpreter per call (``run_python``/``arun_python``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import os
import subprocess
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from streamrl.sandbox.gate import GATE
from streamrl.sandbox.isolation import resolve_isolation
from streamrl.sandbox.launch import Launch, prepare_launch
from streamrl.sandbox.limits import SandboxLimits
from streamrl.sandbox.result import KillReason, SandboxResult, classify

P = ParamSpec("P")
R = TypeVar("R")

_READ_CHUNK = 64 * 1024
#: how long to wait for the pipes to drain once the process group is dead
_DRAIN_GRACE_S = 1.0
#: how long the init gets to kill and reap the code before everything is SIGKILLed
_INTERRUPT_GRACE_S = 0.5


class _CappedCapture:
    """Keeps the first ``cap`` bytes of a stream; says when more arrived."""

    def __init__(self, cap: int):
        self.cap = cap
        self.data = bytearray()
        self.over = False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > room:
            self.over = True

    def text(self) -> str:
        decoded = bytes(self.data).decode("utf-8", errors="replace")
        if not self.over:
            return decoded
        marker = f"\n[... output truncated: more than {self.cap} bytes ...]"
        keep = bytes(self.data[: max(0, self.cap - len(marker.encode()))]).decode("utf-8", errors="replace")
        return keep + marker


class _PipeReader:
    """Drains one pipe into a capture from the event loop's reader callback."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, capture: _CappedCapture, over_cap: asyncio.Event):
        self._loop, self._fd, self._capture, self._over_cap = loop, fd, capture, over_cap
        self.eof: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return
        self._capture.add(chunk)
        if self._capture.over:
            self._over_cap.set()

    def close(self) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        if not self.eof.done():
            self.eof.set_result(None)


async def _reap(proc: subprocess.Popen, timeout_s: float) -> None:
    """Wait (without blocking the loop) until ``proc`` has exited and been reaped."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


def resolve_limits(timeout: float | None, memory_mb: int | None, limits: SandboxLimits | None) -> SandboxLimits:
    """``limits`` (default ``SandboxLimits()``) with ``timeout``/``memory_mb`` overriding it."""
    overrides: dict[str, Any] = {"timeout_s": timeout, "memory_mb": memory_mb}
    return dataclasses.replace(limits or SandboxLimits(), **{k: v for k, v in overrides.items() if v is not None})


async def arun_python(
    code: str,
    timeout: float | None = None,
    memory_mb: int | None = None,
    *,
    limits: SandboxLimits | None = None,
    isolation: str = "auto",
    cgroup: bool | None = None,
    echo_last_expr: bool = False,
    allow_weak: bool | None = None,
) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed interpreter and return what happened. Never raises for
    anything the code does; raises ``TypeError``/``ValueError`` for bad arguments.

    ``timeout`` (seconds, wall clock) and ``memory_mb`` override those fields of ``limits``
    (default ``SandboxLimits()``: 5 s, 1024 MiB, 64 KiB of output per stream);
    ``isolation`` is ``"auto"`` (the preferred safe level; ``SandboxUnavailableError`` where none
    works) or a level of ``isolation.LEVELS``; ``allow_weak`` opts into levels weaker than the
    safe ones (None: the process-wide setting, see ``isolation.set_allow_weak``);
    ``cgroup`` None uses a cgroup (processes and memory) where possible, True requires one,
    False never uses one;
    ``echo_last_expr`` prints the ``repr`` of a final bare expression, as a notebook does.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    resolved = resolve_limits(timeout, memory_mb, limits)
    chosen = resolve_isolation(isolation, allow_weak=allow_weak)
    await GATE.acquire_async()
    try:
        launch = prepare_launch(
            mode="once",
            limits=resolved,
            isolation=chosen,
            use_cgroup=cgroup,
            cpu_seconds=resolved.one_shot_cpu_seconds(),
            echo_last_expr=echo_last_expr,
            code=code,
        )
        try:
            return await _execute(launch, resolved)
        finally:
            launch.cleanup()
    finally:
        GATE.release()


def _failed_start(launch: Launch, started: float, exc: OSError) -> SandboxResult:
    return SandboxResult(
        status="crashed",
        stdout="",
        stderr=str(exc),
        returncode=None,
        duration_s=time.monotonic() - started,
        isolation=launch.isolation.level,
        error=f"sandbox failure: could not start the interpreter ({exc})",
        run_id=launch.run_id,
    )


async def _execute(launch: Launch, limits: SandboxLimits) -> SandboxResult:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        proc = launch.spawn(stdin=subprocess.DEVNULL, stdout=out_write, stderr=err_write)
    except OSError as exc:
        os.close(out_read)
        os.close(err_read)
        return _failed_start(launch, started, exc)
    finally:
        os.close(out_write)
        os.close(err_write)
    out, err = _CappedCapture(limits.max_output_bytes), _CappedCapture(limits.max_output_bytes)
    over_cap = asyncio.Event()
    readers = [_PipeReader(loop, out_read, out, over_cap), _PipeReader(loop, err_read, err, over_cap)]
    # The code has ended once the init reports, or dies (EOF). Process exit says less: a
    # forked leftover may still hold the output pipes.
    ended: asyncio.Future[None] = loop.create_future()

    def on_status() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(launch.status_read, on_status)
    capped = asyncio.ensure_future(over_cap.wait())
    killed_for: KillReason | None = None
    try:
        waiting: set[asyncio.Future[Any]] = {ended, capped}
        done, _ = await asyncio.wait(waiting, timeout=limits.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if capped in done:
            killed_for = "output_limit"
        elif ended not in done:
            killed_for = "timeout"
    finally:
        loop.remove_reader(launch.status_read)
        capped.cancel()
        if killed_for is not None and launch.interrupt(proc.pid):
            await _reap(proc, timeout_s=_INTERRUPT_GRACE_S)
        # always: leftovers in the group or the cgroup die even when the code itself ended
        launch.kill(proc.pid)
        try:
            await _reap(proc, timeout_s=5.0)
            await asyncio.wait([reader.eof for reader in readers], timeout=_DRAIN_GRACE_S)
        finally:
            for reader in readers:
                reader.close()
    duration = time.monotonic() - started
    report = launch.child_report()
    memory_killed = launch.oom_killed()
    stderr = err.text()
    status, error, returncode = classify(
        killed_for=killed_for,
        child=report,
        stderr=stderr,
        timeout_s=limits.timeout_s,
        cpu_limit_s=limits.one_shot_cpu_seconds(),
        max_output_bytes=limits.max_output_bytes,
        memory_killed=memory_killed,
        memory_mb=limits.memory_mb,
    )
    return SandboxResult(
        status=status,
        stdout=out.text(),
        stderr=stderr,
        returncode=returncode,
        duration_s=duration,
        isolation=launch.isolation.level,
        error=error,
        truncated=out.over or err.over,
        cpu_s=None if report is None else float(report.get("cpu_s", 0.0)),
        run_id=launch.run_id,
        pid=proc.pid,
    )


def _synchronous(coroutine_function: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, R]:
    """``coroutine_function`` as a plain function with the same parameters, safe to call from a
    thread or from inside a running loop (a nested loop is not allowed there: a helper thread runs it)."""

    @functools.wraps(coroutine_function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        coro = coroutine_function(*args, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, coro).result()

    return run


run_python = _synchronous(arun_python)
run_python.__doc__ = "Synchronous ``arun_python`` (same parameters); safe to call from a thread or inside a running loop."
