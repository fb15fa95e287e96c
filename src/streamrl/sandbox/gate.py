"""How many sandboxed interpreters may run at once, across threads and event loops."""

from __future__ import annotations

import asyncio
import os
import threading


class ConcurrencyGate:
    """A counting gate usable from plain threads (``acquire``) and coroutines (``acquire_async``).

    The async side polls instead of parking a thread, so a cancelled waiter never leaks a slot.
    """

    def __init__(self, limit: int):
        self._cond = threading.Condition()
        self._active = 0
        self._limit = 1
        self.limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"sandbox concurrency limit must be a positive int, got {value!r}")
        with self._cond:
            self._limit = value
            self._cond.notify_all()

    @property
    def active(self) -> int:
        return self._active

    def try_acquire(self) -> bool:
        with self._cond:
            if self._active < self._limit:
                self._active += 1
                return True
            return False

    def acquire(self) -> None:
        with self._cond:
            while self._active >= self._limit:
                self._cond.wait()
            self._active += 1

    async def acquire_async(self, poll_s: float = 0.005) -> None:
        while not self.try_acquire():
            await asyncio.sleep(poll_s)

    def release(self) -> None:
        with self._cond:
            if self._active <= 0:
                raise RuntimeError("sandbox gate released more often than acquired")
            self._active -= 1
            self._cond.notify()


#: shared by every run and session cell of this process
GATE = ConcurrencyGate(os.cpu_count() or 1)


def set_max_concurrency(limit: int) -> None:
    """At most ``limit`` sandboxed interpreters execute at once (default: ``os.cpu_count()``)."""
    GATE.limit = limit


def max_concurrency() -> int:
    return GATE.limit
