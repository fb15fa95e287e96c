"""Environment instances leased to concurrent episodes, and the threads their calls run on.

An environment is reused by the next episode unless its episode ended with an environment fault
(it may be broken, or still stuck inside a call); then it is closed in the background, which
also releases a call that ``close`` can interrupt (a sandbox process, a wait on an event).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from streamrl.envs.base import AsyncEnv, Env
from streamrl.rollout.threads import EnvThreadPool
from streamrl.rollout.timeouts import bounded


class EnvPool:
    """At most ``size`` threads for environment calls; environments built by ``factory`` on demand."""

    def __init__(self, factory: Callable[[], Env | AsyncEnv], size: int, *, call_timeout_s: float | None):
        self._factory = factory
        self._call_timeout_s = call_timeout_s
        self._threads = EnvThreadPool(size, stuck_after_s=call_timeout_s)
        self._free: list[AsyncEnv] = []
        self._closing: set[asyncio.Task] = set()
        self._closed = False

    async def acquire(self) -> AsyncEnv:
        """A free environment, or a new one (the factory runs in a pool thread, within the call
        timeout; its exceptions, and ``CallTimedOut``, propagate)."""
        if self._closed:
            raise RuntimeError("EnvPool: acquire after close")
        if self._free:
            return self._free.pop()
        loop = asyncio.get_running_loop()
        env = await bounded(loop.run_in_executor(self._threads, self._factory), self._call_timeout_s)
        return env if isinstance(env, AsyncEnv) else AsyncEnv(env, executor=self._threads)

    def release(self, env: AsyncEnv, *, reusable: bool) -> None:
        if reusable and not self._closed:
            self._free.append(env)
        else:
            self._close_later(env)

    async def close(self, timeout_s: float) -> list[str]:
        """Close every environment and stop the threads; returns the names of threads still
        running after ``timeout_s`` (calls that never returned)."""
        if self._closed:
            return []
        self._closed = True
        deadline = time.monotonic() + timeout_s
        while self._free:
            self._close_later(self._free.pop())
        if self._closing:
            _, late = await asyncio.wait(self._closing, timeout=timeout_s)
            for task in late:
                task.cancel()
        self._threads.shutdown(wait=False)
        while self._threads.threads() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return [thread.name for thread in self._threads.threads()]

    def _close_later(self, env: AsyncEnv) -> None:
        if self._threads.closed:
            return
        task = asyncio.ensure_future(env.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # never "unretrieved"
