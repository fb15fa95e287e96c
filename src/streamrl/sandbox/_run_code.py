"""How the runner runs the model's code: a one-shot program, or a session's cells one frame at a
time, with the output captured and the error reported as a traceback and one line.

Runs inside the sandbox (``launch.py`` embeds it in the bootstrap): standard library only. The
parent imports it too (tests exercise ``compile_cell``).
"""

from __future__ import annotations

import ast
import builtins
import io
import os
import sys
import time
import traceback
from typing import Any

from ._frames import read_frame, write_frame

#: exit code of a runner whose code ended with an uncaught ``MemoryError``
MEMORY_EXIT_CODE = 86


def compile_cell(source: str, filename: str, echo_last_expr: bool) -> tuple[Any, Any | None]:
    """Compile ``source``; with ``echo_last_expr`` a final bare expression is split off so its
    value can be echoed (as in a notebook)."""
    tree = ast.parse(source, filename, "exec")
    last = None
    final = tree.body[-1] if tree.body else None
    if echo_last_expr and isinstance(final, ast.Expr):
        tree.body.pop()
        last = ast.Expression(final.value)
    body = compile(tree, filename, "exec")
    return body, (compile(last, filename, "eval") if last is not None else None)


def run_cell(source: str, namespace: dict[str, Any], filename: str, echo_last_expr: bool) -> BaseException | None:
    """Execute one cell in ``namespace``; return the exception that ended it (None: success).

    ``SystemExit`` with code 0/None counts as success.
    """
    try:
        body, last = compile_cell(source, filename, echo_last_expr)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as exc:
        return None if exc.code in (None, 0) else exc
    except BaseException as exc:  # the model's code may raise anything, KeyboardInterrupt included
        return exc
    return None


def error_line(exc: BaseException) -> str:
    """The last traceback line: ``"ExceptionType: message"``."""
    lines = traceback.format_exception_only(type(exc), exc)
    return lines[-1].strip() if lines else type(exc).__name__


#: frames of a traceback that are printed (the innermost ones); a runaway recursion has a
#: million, and formatting all of them takes longer than any timeout
TRACEBACK_FRAMES = 30


def print_user_traceback(exc: BaseException, file: Any) -> None:
    """Print the innermost frames of the traceback, without this module's own frames."""
    tb = exc.__traceback__
    own = run_cell.__code__.co_filename
    while tb is not None and tb.tb_frame.f_code.co_filename == own:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, limit=-TRACEBACK_FRAMES, file=file)


class CappedWriter(io.TextIOBase):
    """A text stream that keeps the first ``cap`` characters and drops the rest."""

    def __init__(self, cap: int):
        super().__init__()
        self._cap = cap
        self._parts: list[str] = []
        self._size = 0
        self.overflow = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self._cap - self._size
        if room > 0:
            kept = text[:room]
            self._parts.append(kept)
            self._size += len(kept)
        if len(text) > max(room, 0):
            self.overflow = True
        return len(text)

    def getvalue(self) -> str:
        return "".join(self._parts)


def _fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins}


def _exit_code_of(exc: BaseException | None) -> int:
    if exc is None:
        return 0
    if isinstance(exc, MemoryError):
        return MEMORY_EXIT_CODE
    if isinstance(exc, SystemExit) and isinstance(exc.code, int):
        return exc.code & 0xFF or 1
    return 1


def run_once(config: dict[str, Any], source: str) -> int:
    exc = run_cell(source, _fresh_namespace(), "main.py", config["echo_last_expr"])
    if exc is not None:
        if isinstance(exc, SystemExit) and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        else:
            print_user_traceback(exc, sys.stderr)
    return _exit_code_of(exc)


def serve_session(config: dict[str, Any]) -> int:
    """Answer one frame per cell, on private copies of the pipes; the cell's own fd 0-2 point
    at /dev/null (Python-level output is captured per cell)."""
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    namespace = _fresh_namespace()
    cap = int(config["max_output_chars"])
    cell_number = 0
    while True:
        request = read_frame(requests)
        if request is None:
            return 0  # the parent closed the session
        cell_number += 1
        out, err = CappedWriter(cap), CappedWriter(cap)
        sys.stdout, sys.stderr = out, err
        try:
            exc = run_cell(request["code"], namespace, f"<cell {cell_number}>", bool(request.get("echo", True)))
            if exc is not None:
                print_user_traceback(exc, err)
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        write_frame(
            replies,
            {
                "stdout": out.getvalue(),
                "stderr": err.getvalue(),
                "truncated": out.overflow or err.overflow,
                "error": None if exc is None else error_line(exc),
                "memory": isinstance(exc, MemoryError),
                "cpu_s": time.process_time(),
            },
        )
