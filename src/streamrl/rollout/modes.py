"""The dispatcher's two modes: what one dispatch is, and when its trajectories may be delivered.

``StreamMode`` (single-stream): a dispatch is one episode; a trajectory is deliverable the moment
it arrives, and its prompt's in-flight slot is free again. ``GroupMode`` (GRPO): a dispatch is
``group_size`` episodes of one prompt under one group id, sharing an environment seed; the group
is deliverable once all members arrived, or partially when its timer (``group_timeout_s``) fires,
and only then is its prompt's slot free.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from streamrl.rollout.collect import Group, GroupBuffer, StreamBuffer
from streamrl.rollout.trajectory import DispatchRecord, Trajectory

#: ``new_record(prompt_id, group_id)``: the dispatcher's frozen record of one new request
NewRecord = Callable[[str, "str | None"], DispatchRecord]


class StreamMode:
    def __init__(self) -> None:
        self.buffer = StreamBuffer()
        self.seq = 0  # no groups: kept for the checkpoint's group_seq

    def dispatch(self, prompt_id: str, new_record: NewRecord) -> list[DispatchRecord]:
        return [new_record(prompt_id, None)]

    def add(self, trajectory: Trajectory) -> tuple[bool, str | None, Group | None]:
        """(accepted, prompt whose slot is free again, group closed)."""
        self.buffer.add(trajectory)
        return True, trajectory.prompt_id, None

    def reissued_slot(self, record: DispatchRecord) -> str | None:
        """The prompt whose slot a restored in-flight request occupies again."""
        return record.prompt_id

    def resume(self) -> list[str]:
        """After a restore: the prompts of dispatch units still open (timers re-armed)."""
        return []

    def close(self) -> None:
        return None


class GroupMode:
    """Groups behind a barrier; ``on_expire(group)`` is called when a group's timer closes it partially."""

    def __init__(self, group_size: int, timeout_s: float | None, request_prefix: str,
                 on_expire: Callable[[Group], None]):
        self.buffer = GroupBuffer(group_size)
        self.seq = 0
        self._size = group_size
        self._timeout_s = timeout_s
        self._prefix = request_prefix
        self._on_expire = on_expire
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def dispatch(self, prompt_id: str, new_record: NewRecord) -> list[DispatchRecord]:
        group_id = f"{self._prefix}-g{self.seq}"
        self.seq += 1
        records = [new_record(prompt_id, group_id) for _ in range(self._size)]
        self.buffer.open(group_id, prompt_id, [r.request_id for r in records])
        self._arm(group_id)
        return records

    def add(self, trajectory: Trajectory) -> tuple[bool, str | None, Group | None]:
        accepted, closed = self.buffer.add(trajectory)  # not accepted: its group already timed out
        if closed is not None:
            self._disarm(closed.group_id)
        return accepted, closed.prompt_id if closed is not None else None, closed

    def reissued_slot(self, record: DispatchRecord) -> str | None:
        return None  # the open group holds the slot (``resume``)

    def resume(self) -> list[str]:
        prompts = []
        for group in self.buffer.open_groups():
            prompts.append(group.prompt_id)
            self._arm(group.group_id)
        return prompts

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _arm(self, group_id: str) -> None:
        if self._timeout_s is not None:
            loop = asyncio.get_running_loop()
            self._timers[group_id] = loop.call_later(self._timeout_s, self._expire, group_id)

    def _disarm(self, group_id: str) -> None:
        timer = self._timers.pop(group_id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, group_id: str) -> None:
        self._timers.pop(group_id, None)
        group = self.buffer.expire(group_id)
        if group is not None:
            self._on_expire(group)


def make_mode(settings: Any, on_expire: Callable[[Group], None]) -> StreamMode | GroupMode:
    """The mode of ``RolloutSettings`` ``settings``."""
    if settings.mode == "group":
        return GroupMode(settings.group_size, settings.group_timeout_s, settings.request_prefix, on_expire)
    return StreamMode()
