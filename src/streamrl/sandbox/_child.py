"""The sandbox's own processes, INSIDE the sandbox: ``python -I -B -c <bootstrap> <config json>``.

The bootstrap (``launch.py``) carries the source of this module and of the modules it uses
(``_frames``, ``_run_code``, ``_lockdown``, ``_confine`` and its helpers), registers them as one
package and calls ``main``. Standard library only: the sandboxed interpreter cannot see
``streamrl``. The parent imports this module too (tests; the exit codes in ``result.py``).

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

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from ._confine import build_root, drop_privileges, set_parent_death_signal
from ._lockdown import apply_limits, harden, install_guards
from ._run_code import run_once, serve_session
from ._syscalls import CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUTS, unshare

#: exit code of a runner whose own bootstrap failed (a sandbox fault, not the model's)
BOOTSTRAP_FAILURE_EXIT_CODE = 70
#: the file (in the fresh working directory) a one-shot run reads its code from, then deletes
CODE_FILE_NAME = ".sandbox_code.py"

#: sent to the init (or the kernel level's outer) to stop a run politely (see ``_main_plain``)
STOP_SIGNAL = signal.SIGUSR1


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


def _runner(config: dict[str, Any], source: str | None) -> int:
    apply_limits(config["rlimits"])
    if config.get("harden"):
        harden()
    install_guards(config["stub_network"])
    if config["mode"] == "session":
        return serve_session(config)
    assert source is not None
    return run_once(config, source)


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or full stream must not change the exit code
            pass


def _guard(target: Callable[[], int], limit_s: float | None) -> None:
    """Kill ``target()`` (a pid; 0 while there is none yet) on ``STOP_SIGNAL``, and every second
    check whether the parent is gone (this process was re-parented) or, for a one-shot run,
    ``limit_s`` has passed, even if nobody enforces it outside, and kill it then too."""
    parent, started = os.getppid(), time.monotonic()

    def stop(*_: Any) -> None:
        if target():
            os.kill(target(), signal.SIGKILL)

    def check(*_: Any) -> None:
        late = limit_s is not None and time.monotonic() - started > limit_s
        if target() and (late or os.getppid() != parent):
            os.kill(target(), signal.SIGKILL)

    signal.signal(STOP_SIGNAL, stop)
    signal.signal(signal.SIGALRM, check)
    signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)  # interval timers are not inherited by fork


def _to_devnull() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


#: how often the fallback memory watchdog sums the namespace's resident memory
MEMORY_POLL_S = 0.02
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes_of_namespace() -> int:
    """Resident memory of every process this PID namespace's ``/proc`` lists (the fallback
    group total where no memory cgroup is available)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/statm", "rb") as handle:
                total += int(handle.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total


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
            if _resident_bytes_of_namespace() > memory_limit:  # type: ignore[operator]
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


def _reap_and_report(runner: int, config: dict[str, Any], status_fd: int) -> NoReturn:
    """The init's last part: the runner alone holds the pipes (so the parent sees EOF as soon as
    it ends); reap until it ends, report its status, exit (which kills whatever it left behind
    in a private namespace)."""
    _to_devnull()
    status, usage, memory_killed = _reap_until(runner, config.get("memory_poll_bytes"))
    _report(status_fd, status, usage, memory_killed)
    os._exit(0)


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
    _guard(lambda: runner, config.get("watchdog_s"))
    runner = _fork_runner(config, source, status_fd)
    _reap_and_report(runner, config, status_fd)


def _pid1(config: dict[str, Any], source: str | None, status_fd: int) -> None:
    """PID 1 of the run's namespace: build the sandbox, drop privileges, run and reap."""
    settings = config["confine"]
    unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)
    build_root(
        settings["root"], settings["binds"], settings["disk_bytes"], settings["inodes"], settings["uid"], settings["gid"]
    )
    try:
        import socket

        socket.sethostname("sandbox")
    except OSError:
        pass
    drop_privileges(int(settings["uid"]), int(settings["gid"]))
    set_parent_death_signal(signal.SIGKILL)  # after the uid change, which clears it
    _reap_and_report(_fork_runner(config, source, status_fd), config, status_fd)


def _main_kernel(config: dict[str, Any]) -> None:
    """The outer process: stays in the host namespaces (as root) only to start PID 1, stop it
    on request or when the parent dies, and reap it."""
    status_fd = int(config["status_fd"])
    source = _read_code(config)
    pid1 = 0
    _guard(lambda: pid1, config.get("watchdog_s"))
    unshare(CLONE_NEWPID)
    pid1 = os.fork()
    if pid1 == 0:
        for number in (STOP_SIGNAL, signal.SIGALRM):
            signal.signal(number, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            set_parent_death_signal(signal.SIGKILL)
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


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("confine"):
        _main_kernel(config)
    else:
        _main_plain(config)
