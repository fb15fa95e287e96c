"""The outcome of one sandboxed execution, and how a child's end is turned into a status."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Literal

from streamrl.sandbox._child import BOOTSTRAP_FAILURE_EXIT_CODE
from streamrl.sandbox._run_code import MEMORY_EXIT_CODE

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "crashed"]
#: why the parent killed a run itself
KillReason = Literal["timeout", "output_limit"]


@dataclass(frozen=True)
class SandboxResult:
    """What one run (or one session cell) did.

    ``error`` is one line fit to show a model: the last traceback line
    (``"NameError: name 'x' is not defined"``) or what stopped the run.
    """

    status: Status
    stdout: str
    stderr: str
    #: the code's exit code, or ``-signal`` when a signal ended it; None when unknown
    returncode: int | None
    duration_s: float
    #: the isolation level in force for this run (see ``isolation.LEVELS``)
    isolation: str
    error: str | None = None
    #: output was cut at the capture limit
    truncated: bool = False
    #: CPU seconds the code used, when the sandbox could measure them
    cpu_s: float | None = None
    #: a persistent session lost its state (killed after a timeout or a crash)
    state_reset: bool = False
    run_id: str = ""
    #: the process group id of the run (its leader's pid in this PID namespace)
    pid: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify(
    *,
    killed_for: KillReason | None,
    child: dict[str, Any] | None,
    stderr: str,
    timeout_s: float,
    cpu_limit_s: float,
    max_output_bytes: int,
    memory_killed: bool = False,
    memory_mb: int | None = None,
) -> tuple[Status, str | None, int | None]:
    """(status, error line, returncode) from how the run ended.

    ``child`` is the init's report (``{"exit": n}`` or ``{"signal": n}``, plus ``cpu_s``); it is
    None when the init itself was killed or never started. ``memory_killed``: the kernel killed
    a process of the run for the group's memory limit (cgroup).
    """
    returncode = None
    if child is not None:
        returncode = -int(child["signal"]) if "signal" in child else int(child["exit"])
    limit = f" of {memory_mb} MiB" if memory_mb else ""
    if killed_for == "timeout" and (memory_killed or (child or {}).get("memory")):
        # a process of the run died for memory and the rest waited on it: memory is the cause
        return "memory", f"MemoryError: a process of the run hit the sandbox's memory limit{limit}, then the run timed out", returncode
    if killed_for == "timeout":
        return "timeout", f"TimeoutError: execution exceeded the {timeout_s:g} s time limit", returncode
    if killed_for == "output_limit":
        return (
            "output_limit",
            f"output limit exceeded (more than {max_output_bytes} bytes); execution stopped",
            returncode,
        )
    if child is None:
        detail = last_line(stderr) or "the sandbox ended without a report"
        return "crashed", f"sandbox failure: {detail}", returncode
    if "signal" in child and int(child["signal"]) == signal.SIGKILL and (memory_killed or child.get("memory")):
        return "memory", f"MemoryError: the sandbox's memory limit{limit} for the whole run was exceeded", returncode
    if "signal" in child:
        number = int(child["signal"])
        used = float(child.get("cpu_s") or 0.0)
        # the CPU limit's signals, when the CPU time says the limit was reached (code can send
        # itself SIGXCPU: that is a crash, not a timeout)
        if number in (signal.SIGXCPU, signal.SIGKILL) and used >= cpu_limit_s - 0.05:
            return "timeout", f"TimeoutError: CPU time limit of {cpu_limit_s:g} s exceeded", returncode
        return "crashed", f"the Python process crashed ({_signal_name(number)})", returncode
    code = int(child["exit"])
    if code == 0:
        return "ok", None, 0
    if code == MEMORY_EXIT_CODE:
        return "memory", last_line(stderr) or "MemoryError", code
    if code == BOOTSTRAP_FAILURE_EXIT_CODE:
        return "crashed", f"sandbox failure: {last_line(stderr) or 'bootstrap error'}", code
    return "error", last_line(stderr) or f"exited with code {code}", code
