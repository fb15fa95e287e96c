"""The rollout's event log: one JSON object per line, flushed as it is written.

Events: ``dispatch`` (request, prompt, group, version k, z, frozen baseline), ``reissue`` (an
in-flight request restarted after a resume), ``result`` (arrival in first-finished order: end
reason, outcome, per-turn versions), ``discard`` (a straggler cancelled undelivered), ``group``
(group mode: a group closed, complete or partial), ``deliver`` (one learner batch: its request
ids in order, the learner version, each sample's lag and exclusion flag) and ``publish``.

Every event has a ``seq`` that increases by one; after a resume the log continues from the
checkpointed ``seq``, and ``read_events`` drops the events a crash left after that point, so the
log always describes the run the learner actually saw.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

from streamrl.rollout.trajectory import to_jsonable


class EventLog:
    """Appends events to ``path``; ``path=None`` keeps only the sequence counter."""

    def __init__(self, path: str | Path | None, *, next_seq: int = 0):
        self.path = Path(path) if path is not None else None
        self.next_seq = next_seq
        self._file: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> int:
        """Write one event and return its ``seq``."""
        seq = self.next_seq
        self.next_seq += 1
        if self._file is not None:
            event = {"seq": seq, "event": kind, "time": time.time(), **fields}
            self._file.write(json.dumps(to_jsonable(event)) + "\n")
            self._file.flush()
        return seq

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of the run the learner saw, in order.

    A resumed run restarts ``seq`` at its checkpoint; events of the crashed run with a ``seq`` at
    or past that point never reached a checkpoint and are dropped.
    """
    events: list[dict[str, Any]] = []
    with Path(path).open(encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
                seq = int(event["seq"])
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number}: not a rollout event ({error})") from None
            while events and events[-1]["seq"] >= seq:
                events.pop()
            events.append(event)
    return events


def replay(path: str | Path) -> list[list[str]]:
    """The learner's batches, as the request ids it received, in the order it received them."""
    return [list(event["request_ids"]) for event in read_events(path) if event["event"] == "deliver"]
