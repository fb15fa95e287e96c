"""The persistent session: state across cells, echo, reset after timeout or crash, CPU budget,
and ``close()`` leaving no process behind."""

from __future__ import annotations

import psutil
import pytest

from streamrl.sandbox import PythonSession, SandboxLimits

from .leaks import LEVELS_HERE, survivors


@pytest.mark.parametrize("level", [LEVELS_HERE[0], LEVELS_HERE[-1]])
def test_variables_persist_across_cells_and_the_last_expression_is_echoed(level):
    with PythonSession(timeout=5.0, isolation=level, allow_weak=True) as session:
        first = session.run("import math\nradius = 3\nprint('defined')")
        second = session.run("area = math.pi * radius ** 2\nround(area, 2)")
        third = session.run("area > 28")
        assert session.isolation == level
    assert first.status == "ok" and first.stdout == "defined\n"
    assert second.stdout == "28.27\n" and third.stdout == "True\n"
    assert not any(r.state_reset for r in (first, second, third))


def test_an_error_keeps_the_state():
    with PythonSession() as session:
        session.run("total = 10")
        failed = session.run("total / 0")
        after = session.run("total + 1")
    assert failed.status == "error" and failed.error == "ZeroDivisionError: division by zero"
    assert "Traceback" in failed.stderr
    assert after.stdout == "11\n" and not failed.state_reset


def test_timeout_kills_the_worker_resets_state_and_the_next_cell_works():
    with PythonSession(timeout=1.0) as session:
        session.run("kept = 'no'")
        old_pid = session.worker_pid
        timed_out = session.run("import time\ntime.sleep(30)")
        assert timed_out.status == "timeout" and timed_out.state_reset
        assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
        assert not survivors(timed_out.run_id)
        fresh = session.run("print('kept' in globals())")
    assert fresh.status == "ok" and fresh.stdout == "False\n" and not fresh.state_reset


def test_a_per_call_timeout_overrides_the_session_default():
    with PythonSession(timeout=30.0) as session:
        result = session.run("while True: pass", timeout=1.0)
    assert result.status == "timeout" and result.duration_s < 2.5


@pytest.mark.parametrize(
    "code, status",
    [("import os\nos._exit(0)", "crashed"), ("import ctypes\nctypes.string_at(0)", "crashed")],
    ids=["worker-exits", "segfault"],
)
def test_a_crash_is_reported_and_the_state_reset(code, status):
    with PythonSession() as session:
        session.run("x = 1")
        crashed = session.run(code)
        again = session.run("print('x' in globals())")
    assert crashed.status == status and crashed.state_reset
    assert again.stdout == "False\n"


def test_cpu_budget_covers_the_whole_session():
    with PythonSession(timeout=10.0, cpu_budget_s=1.0) as session:
        spent = session.run("while True: pass")
        refused = session.run("print('more')")
    assert spent.status == "timeout" and "CPU budget" in spent.error and spent.state_reset
    assert spent.duration_s < 5.0
    assert refused.status == "timeout" and "CPU budget" in refused.error


def test_output_is_capped_per_cell_but_the_cell_completes():
    with PythonSession(limits=SandboxLimits(max_output_bytes=1000)) as session:
        result = session.run("print('z' * 100000)\nvalue = 7")
        after = session.run("value")
    assert result.status == "ok" and result.truncated and len(result.stdout) == 1000
    assert after.stdout == "7\n"


def test_memory_error_in_a_cell_keeps_the_session_alive():
    with PythonSession(memory_mb=256) as session:
        session.run("keep = 5")
        result = session.run("blob = bytearray(8 << 30)")
        after = session.run("keep")
    assert result.status == "memory" and "MemoryError" in result.error
    assert after.stdout == "5\n"


def test_close_kills_the_worker_is_idempotent_and_refuses_more_cells():
    session = PythonSession()
    session.run("print(1)")
    worker = psutil.Process(session.worker_pid)
    run_id = session.run("2").run_id
    session.close()
    session.close()
    assert not session.alive
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    assert not survivors(run_id)
    with pytest.raises(RuntimeError, match="closed"):
        session.run("print(2)")


def test_bad_session_arguments():
    with pytest.raises(ValueError, match="cpu_budget_s"):
        PythonSession(cpu_budget_s=0)
    with PythonSession() as session, pytest.raises(ValueError, match="cell timeout"):
        session.run("1", timeout=-1)


def test_a_worker_started_from_a_short_lived_thread_survives_that_thread():
    # bwrap/unshare kill their child when the *thread* that forked them exits (PDEATHSIG)
    import threading

    session = PythonSession()
    first: list = []
    thread = threading.Thread(target=lambda: first.append(session.run("kept = 41")))
    thread.start()
    thread.join()
    try:
        later = session.run("kept + 1")
    finally:
        session.close()
    assert first[0].status == "ok"
    assert later.status == "ok" and later.stdout == "42\n" and not later.state_reset
