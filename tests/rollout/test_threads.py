"""The environment thread pool: bounded, self-healing after hangs, nothing left behind."""

from __future__ import annotations

import threading
import time

import pytest

from streamrl.rollout.threads import EnvThreadPool


def test_results_exceptions_and_bounded_size():
    pool = EnvThreadPool(2)
    gate = threading.Event()
    futures = [pool.submit(lambda i=i: (gate.wait(5), i)[1]) for i in range(5)]
    time.sleep(0.05)
    assert len(pool.threads()) == 2  # never more than size while calls queue
    gate.set()
    assert [f.result(timeout=5) for f in futures] == list(range(5))
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    assert pool.shutdown(timeout=5) == []
    assert pool.threads() == []
    with pytest.raises(RuntimeError):
        pool.submit(print)


def test_a_stuck_worker_is_replaced_and_exits_when_its_call_returns():
    pool = EnvThreadPool(1, stuck_after_s=0.05)
    release = threading.Event()
    hung = pool.submit(release.wait, 10)
    time.sleep(0.15)
    assert pool.submit(lambda: "fresh").result(timeout=5) == "fresh"  # served by a replacement
    assert len(pool.threads()) == 2
    release.set()
    assert hung.result(timeout=5) is True
    assert pool.shutdown(timeout=5) == []


def test_shutdown_reports_calls_that_never_return_and_cancels_queued_ones():
    pool = EnvThreadPool(1)
    release = threading.Event()
    pool.submit(release.wait, 10)
    queued = pool.submit(print, "never")
    time.sleep(0.05)
    stuck = pool.shutdown(timeout=0.1)
    assert len(stuck) == 1 and stuck[0].startswith("streamrl-env")
    assert queued.cancelled()
    assert all(t.daemon for t in pool.threads())  # cannot block interpreter exit
    release.set()
    assert pool.shutdown(timeout=5) == []


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="size"):
        EnvThreadPool(0)
    with pytest.raises(ValueError, match="stuck_after_s"):
        EnvThreadPool(1, stuck_after_s=0)
