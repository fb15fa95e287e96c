"""The code that runs INSIDE the sandbox: ``python -I -B -c <this file's source> <config json>``.

Standard library only: the sandboxed interpreter cannot see ``streamrl``. The module is also
importable, so the parent reuses its frame codec and tests can exercise the helpers directly.

Process layout inside the sandbox (weak levels and bwrap)::

    init (trusted, this file)  --fork-->  runner: rlimits, guards, then the model's code

and at the ``kernel`` level (``_confine.py`` does the kernel work)::

    outer (root, host namespaces; watchdog, stop signal)
      --unshare(CLONE_NEWPID), fork-->  PID 1 (new mount/net/ipc/uts/cgroup namespaces; builds
                                        the new root, drops to the run's uid; reaps, reports)
        --fork-->  runner: rlimits, Landlock, seccomp, guards, then the model's code

The init keeps only the status pipe. It waits for the runner, reaps orphans (it is PID 1 when a
PID namespace is in force, so its exit takes every leftover process down with it) and writes one
JSON line saying how the runner ended: its exit code or signal, and its CPU seconds. The parent
learns the real cause of a death that way (``unshare`` loses the signal of its child).
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import os
import resource
import signal
import struct
import sys
import time
import traceback
from typing import Any

#: exit code of a runner whose code ended with an uncaught ``MemoryError``
MEMORY_EXIT_CODE = 86
#: exit code of a runner whose own bootstrap failed (a sandbox fault, not the model's)
BOOTSTRAP_FAILURE_EXIT_CODE = 70
#: the file (in the fresh working directory) a one-shot run reads its code from, then deletes
CODE_FILE_NAME = ".sandbox_code.py"

#: sent to the init to stop a run politely (see ``_main``)
STOP_SIGNAL = signal.SIGUSR1
#: the name the bootstrap gives ``_confine.py`` (the sandboxed interpreter cannot import streamrl)
CONFINE_MODULE = "_sbx_confine"

FRAME_HEADER = struct.Struct(">I")  # payload length, big-endian
MAX_FRAME_BYTES = 64 * 1024 * 1024

_PROCESS_FUNCTIONS = (
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
    "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
    "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
)  # fmt: skip


# ----------------------------------------------------------------------------- framing
def encode_frame(message: Any) -> bytes:
    payload = json.dumps(message).encode("utf-8")
    return FRAME_HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> Any:
    return json.loads(payload.decode("utf-8"))


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any | None:
    """Blocking read of one frame; None at end of file or on a malformed header."""
    header = _read_exact(fd, FRAME_HEADER.size)
    if header is None:
        return None
    (size,) = FRAME_HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        return None
    payload = _read_exact(fd, size)
    return None if payload is None else decode_payload(payload)


def write_frame(fd: int, message: Any) -> None:
    data = memoryview(encode_frame(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]


# ----------------------------------------------------------------------------- limits and guards
def apply_limits(rlimits: dict[str, int]) -> None:
    """Hard = soft, so the sandboxed code cannot raise any limit back."""
    for name, value in rlimits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _refuse_processes(*_args: Any, **_kwargs: Any) -> Any:
    raise PermissionError("starting processes is disabled in this sandbox")


class _RefusedPopen:
    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        _refuse_processes()


def _refuse_network(*_args: Any, **_kwargs: Any) -> Any:
    raise PermissionError("network access is disabled in this sandbox")


def _stub_network() -> None:
    """Best-effort block where no network namespace is available (``_socket`` bypasses it)."""
    import socket

    internet = (socket.AF_INET, socket.AF_INET6)

    class GuardedSocket(socket.socket):
        def connect(self, address: Any) -> None:
            if self.family in internet:
                _refuse_network()
            super().connect(address)

        def connect_ex(self, address: Any) -> int:
            if self.family in internet:
                _refuse_network()
            return super().connect_ex(address)

        def bind(self, address: Any) -> None:
            if self.family in internet:
                _refuse_network()
            super().bind(address)

        def sendto(self, *args: Any) -> int:
            if self.family in internet:
                _refuse_network()
            return super().sendto(*args)

    socket.socket = GuardedSocket  # type: ignore[misc]
    for name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        setattr(socket, name, _refuse_network)


def install_guards(stub_network: bool) -> None:
    """Guards against accidental misuse (a determined program can bypass them through ``posix``
    or ``ctypes``; the rlimits, namespaces and cgroup are the real walls)."""
    for name in _PROCESS_FUNCTIONS:
        if hasattr(os, name):
            setattr(os, name, _refuse_processes)
    import subprocess

    subprocess.Popen = _RefusedPopen  # type: ignore[misc, assignment]
    if stub_network:
        _stub_network()


# ----------------------------------------------------------------------------- running code
def compile_cell(source: str, filename: str, echo_last_expr: bool) -> tuple[Any, Any | None]:
    """Compile ``source``; with ``echo_last_expr`` a final bare expression is split off so its
    value can be echoed (as in a notebook)."""
    tree = ast.parse(source, filename, "exec")
    last = None
    if echo_last_expr and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
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


def _confine_module() -> Any:
    module = sys.modules.get(CONFINE_MODULE)
    if module is None:  # imported by the parent, not run as the bootstrap
        from streamrl.sandbox import _confine as module
    return module


def _read_code(config: dict[str, Any]) -> str | None:
    """The one-shot run's code, from the work dir (or the read-only input dir under bwrap)."""
    if config["mode"] != "once":
        return None
    path = os.path.join(config.get("input_dir") or ".", CODE_FILE_NAME)
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    if not config.get("input_dir"):
        os.unlink(path)
    return source


def _run_once(config: dict[str, Any], source: str) -> int:
    exc = run_cell(source, _fresh_namespace(), "main.py", config["echo_last_expr"])
    if exc is not None:
        if isinstance(exc, SystemExit) and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        else:
            print_user_traceback(exc, sys.stderr)
    return _exit_code_of(exc)


def _serve_session(config: dict[str, Any]) -> int:
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


def harden() -> None:
    """no_new_privs, then Landlock and seccomp where the kernel has them (the last walls before
    the code: nothing after this can be undone by it)."""
    confine = _confine_module()
    try:  # the kernel's memory killer picks the code's processes first, never the init's
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass
    confine.prctl(confine.PR_SET_NO_NEW_PRIVS, 1)
    writable = [path for path in confine.WRITABLE if os.path.isdir(path)]
    devices = [f"/dev/{name}" for name in confine.DEVICES]
    confine.install_landlock(writable, devices)
    confine.install_seccomp()


def _runner(config: dict[str, Any], source: str | None) -> int:
    apply_limits(config["rlimits"])
    if config.get("harden"):
        harden()
    install_guards(config["stub_network"])
    if config["mode"] == "session":
        return _serve_session(config)
    assert source is not None
    return _run_once(config, source)


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or full stream must not change the exit code
            pass


def _start_watchdog(target: Any, limit_s: float | None) -> None:
    """Every second: kill ``target()`` (a pid) once the parent is gone (this process was
    re-parented) or, for a one-shot run, once ``limit_s`` has passed, even if nobody enforces
    it outside."""
    parent, started = os.getppid(), time.monotonic()

    def check(*_: Any) -> None:
        late = limit_s is not None and time.monotonic() - started > limit_s
        if target() and (late or os.getppid() != parent):
            os.kill(target(), signal.SIGKILL)

    signal.signal(signal.SIGALRM, check)
    signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)  # interval timers are not inherited by fork


def _to_devnull() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


#: how often the fallback memory watchdog sums the namespace's resident memory
MEMORY_POLL_S = 0.02


def _reap_until(runner: int, memory_limit: int | None) -> tuple[int, Any, bool]:
    """Reap every child (orphans included) until ``runner`` ends; (status, rusage, killed for
    memory). With ``memory_limit``, kill everything in the namespace once the resident total of
    its processes passes it (the fallback group limit). That is done only by PID 1 of a private
    PID namespace (``/proc`` and ``kill(-1)`` then reach the run's processes and nothing else);
    anywhere else the limit is ignored."""
    if os.getpid() != 1:
        memory_limit = None
    killed = False
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG if memory_limit and not killed else 0)
        except ChildProcessError:
            return 0, None, killed
        if pid == runner:
            return status, usage, killed
        if pid == 0:
            if _confine_module().resident_bytes_of_namespace() > memory_limit:  # type: ignore[operator]
                killed = True
                try:  # every process of this (private) namespace that PID 1 may signal, but itself
                    os.kill(-1, signal.SIGKILL)
                except OSError:
                    pass
            else:
                time.sleep(MEMORY_POLL_S)


def _report(status_fd: int, status: int, usage: Any, memory_killed: bool) -> None:
    report: dict[str, Any] = {"cpu_s": 0.0 if usage is None else usage.ru_utime + usage.ru_stime}
    if os.WIFSIGNALED(status):
        report["signal"] = os.WTERMSIG(status)
    else:
        report["exit"] = os.WEXITSTATUS(status)
    if memory_killed:
        report["memory"] = True
    os.write(status_fd, (json.dumps(report) + "\n").encode())


def _fork_runner(config: dict[str, Any], source: str | None, status_fd: int) -> int:
    runner = os.fork()
    if runner == 0:
        for number in (STOP_SIGNAL, signal.SIGALRM):
            signal.signal(number, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.close(status_fd)
        try:
            code = _runner(config, source)
        except BaseException:
            traceback.print_exc()
            code = BOOTSTRAP_FAILURE_EXIT_CODE
        _flush_quietly()
        os._exit(code)
    return runner


def _main_plain(config: dict[str, Any]) -> None:
    status_fd = int(config["status_fd"])
    source = _read_code(config)
    # STOP_SIGNAL asks the init to kill the runner and reap it itself (a runner killed
    # together with its init would linger as an orphaned zombie for a while)
    runner = 0
    signal.signal(STOP_SIGNAL, lambda *_: runner and os.kill(runner, signal.SIGKILL))
    _start_watchdog(lambda: runner, config.get("watchdog_s"))
    runner = _fork_runner(config, source, status_fd)
    # init: the runner alone holds the pipes, so the parent sees EOF as soon as it ends
    _to_devnull()
    status, usage, memory_killed = _reap_until(runner, config.get("memory_poll_bytes"))
    _report(status_fd, status, usage, memory_killed)
    os._exit(0)


def _pid1(config: dict[str, Any], source: str | None, status_fd: int) -> None:
    """PID 1 of the run's namespace: build the sandbox, drop privileges, run and reap."""
    confine = _confine_module()
    settings = config["confine"]
    confine.unshare(
        confine.CLONE_NEWNS | confine.CLONE_NEWNET | confine.CLONE_NEWIPC | confine.CLONE_NEWUTS | confine.CLONE_NEWCGROUP
    )
    confine.build_root(
        settings["root"], settings["binds"], settings["disk_bytes"], settings["inodes"], settings["uid"], settings["gid"]
    )
    try:
        import socket

        socket.sethostname("sandbox")
    except OSError:
        pass
    confine.drop_privileges(int(settings["uid"]), int(settings["gid"]))
    confine.set_parent_death_signal(signal.SIGKILL)  # after the uid change, which clears it
    runner = _fork_runner(config, source, status_fd)
    _to_devnull()
    status, usage, memory_killed = _reap_until(runner, config.get("memory_poll_bytes"))
    _report(status_fd, status, usage, memory_killed)
    os._exit(0)  # the namespace's init: its exit kills whatever the code left behind


def _main_kernel(config: dict[str, Any]) -> None:
    """The outer process: stays in the host namespaces (as root) only to start PID 1, stop it
    on request or when the parent dies, and reap it."""
    confine = _confine_module()
    status_fd = int(config["status_fd"])
    source = _read_code(config)
    pid1 = 0
    signal.signal(STOP_SIGNAL, lambda *_: pid1 and os.kill(pid1, signal.SIGKILL))
    _start_watchdog(lambda: pid1, config.get("watchdog_s"))
    confine.unshare(confine.CLONE_NEWPID)
    pid1 = os.fork()
    if pid1 == 0:
        for number in (STOP_SIGNAL, signal.SIGALRM):
            signal.signal(number, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            confine.set_parent_death_signal(signal.SIGKILL)
            _pid1(config, source, status_fd)
        except BaseException as exc:  # a sandbox fault: say so on stderr, never run the code
            print(f"sandbox setup failed: {exc!r}", file=sys.stderr, flush=True)
        os._exit(BOOTSTRAP_FAILURE_EXIT_CODE)
    os.close(status_fd)
    _to_devnull()
    while True:
        try:
            pid, _ = os.waitpid(pid1, 0)
        except ChildProcessError:
            break
        if pid == pid1:
            break
    os._exit(0)


def _main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("confine"):
        _main_kernel(config)
    else:
        _main_plain(config)


if __name__ == "__main__":
    _main()
