"""One-shot execution: a fresh sandboxed interpreter per call (``run_python``/``arun_python``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import subprocess
import time

from streamrl.sandbox.gate import GATE
from streamrl.sandbox.isolation import resolve_isolation
from streamrl.sandbox.launch import Launch, prepare_launch
from streamrl.sandbox.limits import SandboxLimits
from streamrl.sandbox.result import KillReason, SandboxResult, classify

_READ_CHUNK = 64 * 1024
#: how long to wait for the pipes to drain once the process group is dead
_DRAIN_GRACE_S = 1.0


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


async def _pump(stream: asyncio.StreamReader, capture: _CappedCapture, over_cap: asyncio.Event) -> None:
    while True:
        chunk = await stream.read(_READ_CHUNK)
        if not chunk:
            return
        capture.add(chunk)
        if capture.over:
            over_cap.set()


def resolve_limits(timeout: float | None, memory_mb: int | None, limits: SandboxLimits | None) -> SandboxLimits:
    """``limits`` (default ``SandboxLimits()``) with ``timeout``/``memory_mb`` overriding it."""
    overrides = {"timeout_s": timeout, "memory_mb": memory_mb}
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
) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed interpreter and return what happened. Never raises for
    anything the code does; raises ``TypeError``/``ValueError`` for bad arguments.

    ``timeout`` (seconds, wall clock) and ``memory_mb`` override those fields of ``limits``
    (default ``SandboxLimits()``: 5 s, 1024 MiB, 64 KiB of output per stream);
    ``isolation`` is ``"auto"`` (the strongest available) or a level of ``isolation.LEVELS``;
    ``cgroup`` None uses a pids cgroup where possible, True requires one, False never uses one;
    ``echo_last_expr`` prints the ``repr`` of a final bare expression, as a notebook does.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    resolved = resolve_limits(timeout, memory_mb, limits)
    chosen = resolve_isolation(isolation)
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


async def _execute(launch: Launch, limits: SandboxLimits) -> SandboxResult:
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *launch.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=launch.workdir,
            env=launch.env,
            start_new_session=True,
            pass_fds=launch.pass_fds,
        )
    except OSError as exc:
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
    launch.spawned()
    out, err = _CappedCapture(limits.max_output_bytes), _CappedCapture(limits.max_output_bytes)
    over_cap = asyncio.Event()
    pumps = [
        asyncio.ensure_future(_pump(proc.stdout, out, over_cap)),  # type: ignore[arg-type]
        asyncio.ensure_future(_pump(proc.stderr, err, over_cap)),  # type: ignore[arg-type]
    ]
    exited = asyncio.ensure_future(proc.wait())
    capped = asyncio.ensure_future(over_cap.wait())
    killed_for: KillReason | None = None
    try:
        done, _ = await asyncio.wait({exited, capped}, timeout=limits.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if capped in done:
            killed_for = "output_limit"
        elif exited not in done:
            killed_for = "timeout"
    finally:
        # always: leftovers in the group or the cgroup die even when the main process ended
        launch.kill(proc.pid)
        capped.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(exited), timeout=5.0)
        except asyncio.TimeoutError:
            pass
        _, pending = await asyncio.wait(pumps, timeout=_DRAIN_GRACE_S)
        for pump in pending:
            pump.cancel()
    duration = time.monotonic() - started
    report = launch.child_report()
    stderr = err.text()
    status, error, returncode = classify(
        killed_for=killed_for,
        child=report,
        stderr=stderr,
        timeout_s=limits.timeout_s,
        cpu_limit_s=limits.one_shot_cpu_seconds(),
        max_output_bytes=limits.max_output_bytes,
    )
    if returncode is None and proc.returncode is not None and killed_for is not None:
        returncode = proc.returncode
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


def run_python(
    code: str,
    timeout: float | None = None,
    memory_mb: int | None = None,
    *,
    limits: SandboxLimits | None = None,
    isolation: str = "auto",
    cgroup: bool | None = None,
    echo_last_expr: bool = False,
) -> SandboxResult:
    """Synchronous ``arun_python``; safe to call from a thread or from inside a running loop."""
    coro = arun_python(
        code, timeout, memory_mb, limits=limits, isolation=isolation, cgroup=cgroup, echo_last_expr=echo_last_expr
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # called from inside an event loop: a nested loop is not allowed, so use a helper thread
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
