"""Where finished trajectories wait for the learner, one buffer per mode.

* ``StreamBuffer``: first-finished; a batch is the next ``batch_size`` arrivals.
* ``GroupBuffer``: the barrier of group-synchronous RL; a group is deliverable once every member
  finished (or its timeout made it partial), and a batch is ``batch_size / group_size`` groups.

Both expose ``add``/``ready``/``pop`` and a JSON state, so the dispatcher runs one code path.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from streamrl.rollout.trajectory import Trajectory


class StreamBuffer:
    def __init__(self) -> None:
        self._items: deque[Trajectory] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, trajectory: Trajectory) -> None:
        self._items.append(trajectory)

    def ready(self, batch_size: int) -> bool:
        return len(self._items) >= batch_size

    def pop(self, batch_size: int) -> list[Trajectory]:
        return [self._items.popleft() for _ in range(min(batch_size, len(self._items)))]

    def state_dict(self) -> dict[str, Any]:
        return {"trajectories": [t.to_dict() for t in self._items]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._items = deque(Trajectory.from_dict(t) for t in state["trajectories"])


@dataclass
class Group:
    """``group_size`` rollouts of one prompt sharing a group id."""

    group_id: str
    prompt_id: str
    request_ids: list[str]
    members: list[Trajectory] = field(default_factory=list)
    partial: bool = False

    @property
    def pending(self) -> list[str]:
        """Request ids of members that have not finished."""
        done = {member.request_id for member in self.members}
        return [rid for rid in self.request_ids if rid not in done]

    def to_dict(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "prompt_id": self.prompt_id,
            "request_ids": list(self.request_ids),
            "members": [member.to_dict() for member in self.members],
            "partial": self.partial,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Group:
        return cls(
            group_id=data["group_id"],
            prompt_id=data["prompt_id"],
            request_ids=list(data["request_ids"]),
            members=[Trajectory.from_dict(m) for m in data["members"]],
            partial=bool(data["partial"]),
        )


class GroupBuffer:
    def __init__(self, group_size: int):
        self.group_size = group_size
        self._open: dict[str, Group] = {}
        self._closed: deque[Group] = deque()

    def __len__(self) -> int:
        """Finished trajectories held, in open and closed groups."""
        return sum(len(g.members) for g in self._open.values()) + sum(len(g.members) for g in self._closed)

    def open(self, group_id: str, prompt_id: str, request_ids: list[str]) -> None:
        self._open[group_id] = Group(group_id, prompt_id, list(request_ids))

    def open_groups(self) -> list[Group]:
        return list(self._open.values())

    def add(self, trajectory: Trajectory) -> tuple[bool, Group | None]:
        """Add a member. Returns (accepted, the group if this member closed it).

        A member of a group that is unknown or already closed (a late straggler) is not accepted.
        """
        group = self._open.get(trajectory.group_id or "")
        if group is None or trajectory.request_id not in group.pending:
            return False, None
        group.members.append(trajectory)
        if group.pending:
            return True, None
        return True, self._close(group)

    def expire(self, group_id: str) -> Group | None:
        """Close an open group as partial (its pending members will never be delivered)."""
        group = self._open.get(group_id)
        if group is None:
            return None
        group.partial = True
        for member in group.members:
            member.partial_group = True
        return self._close(group)

    def ready(self, batch_size: int) -> bool:
        return len(self._closed) >= batch_size // self.group_size

    def pop(self, batch_size: int) -> list[Trajectory]:
        count = min(batch_size // self.group_size, len(self._closed))
        return [member for _ in range(count) for member in self._closed.popleft().members]

    def _close(self, group: Group) -> Group:
        del self._open[group.group_id]
        self._closed.append(group)
        return group

    def state_dict(self) -> dict[str, Any]:
        return {
            "open": [g.to_dict() for g in self._open.values()],
            "closed": [g.to_dict() for g in self._closed],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._open = {g["group_id"]: Group.from_dict(g) for g in state["open"]}
        self._closed = deque(Group.from_dict(g) for g in state["closed"])
