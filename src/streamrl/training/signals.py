"""SIGTERM and SIGINT (what schedulers, ``docker stop``, Ray and Ctrl-C send) end training cleanly:
the learner step under way finishes, a checkpoint is written, and the process exits 143 / 130 with a
line saying how to resume. A second signal exits at once."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """Within ``async with``: ``requested`` is the first signal received (None until then)."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._installed = False

    def _handle(self, number: int) -> None:
        if self.requested is not None:
            os._exit(128 + number)  # the second signal: no more waiting
        self.requested = number

    async def __aenter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            loop = asyncio.get_running_loop()
            for number in SIGNALS:
                loop.add_signal_handler(number, self._handle, number)
            self._installed = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._installed:
            loop = asyncio.get_running_loop()
            for number in SIGNALS:
                loop.remove_signal_handler(number)
            self._installed = False
