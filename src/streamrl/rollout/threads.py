"""A bounded pool of daemon threads for synchronous environment calls.

``concurrent.futures.ThreadPoolExecutor`` is the wrong tool when a call may hang forever: its
workers are joined at interpreter exit, and a hung worker is lost to the pool for good. Here a
worker busy for longer than ``stuck_after_s`` no longer counts towards ``size``: the next submit
starts a replacement, and the stuck thread exits as soon as its call returns. Threads are daemons,
so a call that never returns cannot block the process from exiting.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Callable

_pool_ids = itertools.count()


@dataclass
class _Worker:
    thread: threading.Thread | None = None
    busy_since: float | None = None
    #: declared stuck and replaced: exit after the current call
    retired: bool = False


class EnvThreadPool(Executor):
    """At most ``size`` healthy worker threads, started lazily, named ``{name}-{pool}-{worker}``."""

    def __init__(self, size: int, *, stuck_after_s: float | None = None, name: str = "streamrl-env"):
        if size < 1:
            raise ValueError(f"EnvThreadPool: size must be >= 1, got {size}")
        if stuck_after_s is not None and stuck_after_s <= 0:
            raise ValueError(f"EnvThreadPool: stuck_after_s must be > 0, got {stuck_after_s}")
        self.size = size
        self._stuck_after_s = stuck_after_s
        self._prefix = f"{name}-{next(_pool_ids)}"
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._started = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("EnvThreadPool: submit after shutdown")
            self._queue.put((future, fn, args, kwargs))
            self._add_worker_if_needed()
        return future

    @property
    def closed(self) -> bool:
        return self._shutdown

    def threads(self) -> list[threading.Thread]:
        """Worker threads still alive (including retired ones whose call has not returned)."""
        with self._lock:
            return [w.thread for w in self._workers if w.thread is not None and w.thread.is_alive()]

    # returns what ``Executor.shutdown`` does not (None): the threads still running, for callers to report
    def shutdown(  # type: ignore[override]
        self, wait: bool = True, *, cancel_futures: bool = True, timeout: float | None = None
    ) -> list[str]:
        """Stop accepting work, cancel queued calls, stop idle workers.

        With ``wait``, joins the workers for up to ``timeout`` seconds in total and returns the
        names of threads still running (calls that did not return), so callers can report them.
        """
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for worker in self._workers:
                if not worker.retired:
                    self._queue.put(None)
            workers = list(self._workers)
        if not wait:
            return []
        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in workers:
            assert worker.thread is not None
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            worker.thread.join(remaining)
        return [w.thread.name for w in workers if w.thread is not None and w.thread.is_alive()]

    # -- internals (called with the lock held) ----------------------------------------------

    def _add_worker_if_needed(self) -> None:
        now = time.monotonic()
        idle = healthy = 0
        for worker in self._workers:
            if worker.retired:
                continue
            if worker.busy_since is None:
                idle += 1
                healthy += 1
            elif self._stuck_after_s is not None and now - worker.busy_since > self._stuck_after_s:
                worker.retired = True
            else:
                healthy += 1
        if self._queue.qsize() > idle and healthy < self.size:
            worker = _Worker()
            worker.thread = threading.Thread(
                target=self._work, args=(worker,), name=f"{self._prefix}-{self._started}", daemon=True
            )
            self._started += 1
            self._workers.append(worker)
            worker.thread.start()

    def _work(self, worker: _Worker) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                worker.busy_since = time.monotonic()
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:  # delivered to the awaiting coroutine
                future.set_exception(error)
            else:
                future.set_result(result)
            with self._lock:
                worker.busy_since = None
                if worker.retired:
                    break
        with self._lock:
            self._workers.remove(worker)
