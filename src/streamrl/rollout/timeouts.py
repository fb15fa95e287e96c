"""A timeout that neither swallows cancellation nor hides the awaited call's own ``TimeoutError``.

``asyncio.wait_for`` on Python < 3.12 can return a result although the caller was cancelled (when
the awaited call completes at the same moment), which would let a cancelled episode run on; and it
raises ``TimeoutError`` both for its own timeout and for one raised inside the call.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

T = TypeVar("T")


class CallTimedOut(Exception):
    """The awaited call did not finish within the timeout (it has been cancelled)."""


async def bounded(awaitable: Awaitable[T], timeout: float | None) -> T:
    """Await ``awaitable`` for at most ``timeout`` seconds (None: no limit)."""
    if timeout is None:
        return await awaitable
    task = asyncio.ensure_future(awaitable)
    # a call that fails just as the caller is cancelled is never awaited again: mark its
    # exception retrieved so asyncio does not log "Task exception was never retrieved"
    task.add_done_callback(_retrieve)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
    if not done:
        raise CallTimedOut
    return task.result()


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
