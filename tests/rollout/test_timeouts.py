"""``bounded``: timeouts that never swallow a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from streamrl.rollout.timeouts import CallTimedOut, bounded


def test_a_cancellation_racing_with_completion_is_not_swallowed():
    async def main():
        inner = asyncio.get_running_loop().create_future()
        outer = asyncio.ensure_future(bounded(inner, 5.0))
        await asyncio.sleep(0)  # outer is now waiting on inner
        inner.set_result("done")  # the call finishes ...
        outer.cancel()  # ... in the same loop iteration as the caller is cancelled
        with pytest.raises(asyncio.CancelledError):
            await outer

    asyncio.run(main())


def test_timeouts_and_the_calls_own_errors_are_distinct():
    async def main():
        with pytest.raises(CallTimedOut):
            await bounded(asyncio.sleep(5), 0.01)
        with pytest.raises(TimeoutError, match="tool"):
            await bounded(_raise(TimeoutError("tool")), 1.0)
        assert await bounded(_value(3), None) == 3
        assert await bounded(_value(4), 1.0) == 4

    asyncio.run(main())


async def _raise(error: Exception):
    raise error


async def _value(value: int) -> int:
    return value
