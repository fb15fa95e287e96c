"""The rollout's event log: one JSON object per line, flushed as it is written.

Events: ``dispatch`` (request, prompt, group, version k, z, frozen baseline), ``reissue`` (an
in-flight request restarted after a resume), ``result`` (arrival in first-finished order: end
reason, outcome, per-turn versions, the worker that played it), ``worker`` (a Ray rollout worker
started), ``worker_lost`` (a worker died or hung with this request in flight; ``replayed`` says
whether it is played again under the same request id) and ``worker_back`` (Ray restarted it),
``discard`` (a straggler cancelled undelivered), ``group``
(group mode: a group closed, complete or partial), ``deliver`` (one learner batch: its request
ids in order, the learner version, each sample's lag and exclusion flag) and ``publish``.

Every event has a ``seq`` that increases by one; after a resume the log continues from the
checkpointed ``seq``, and ``read_events`` drops the events a crash left after that point, so the
log always describes the run the learner actually saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from streamrl.rollout.trajectory import DispatchRecord, Trajectory, to_jsonable


class JsonLines:
    """An append-only JSON-lines file written a whole batch of records or nothing: records a full
    disk (or any write error) cuts short are cut back before the error is raised, so no reader
    meets a torn line of this process. The ``OSError`` names the file and the space left."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, *records: Any) -> None:
        assert self._fd is not None, "append after close"
        data = memoryview("".join(json.dumps(record) + "\n" for record in records).encode("utf-8"))
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            free = shutil.disk_usage(self.path.parent).free
            raise OSError(error.errno, f"{self.path}: {error.strerror} ({free:,} bytes free); nothing of this "
                                       "record was kept") from None

    def sync(self) -> None:
        """On disk, not only in the page cache (a checkpoint's offsets point into it)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class EventLog:
    """Appends events to ``path``; ``path=None`` keeps only the sequence counter."""

    def __init__(self, path: str | Path | None, *, next_seq: int = 0):
        self.path = Path(path) if path is not None else None
        self.next_seq = next_seq
        self._file: JsonLines | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = JsonLines(self.path)

    def write(self, kind: str, **fields: Any) -> int:
        """Write one event and return its ``seq``."""
        seq = self.next_seq
        self.next_seq += 1
        if self._file is not None:
            event = {"seq": seq, "event": kind, "time": time.time(), **fields}
            self._file.append(to_jsonable(event))
        return seq

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def dispatch_fields(record: DispatchRecord) -> dict[str, Any]:
    """What a ``dispatch`` event records of the request (the dispatcher adds its counters)."""
    return {"request_id": record.request_id, "prompt_id": record.prompt_id, "group_id": record.group_id,
            "dispatch_seq": record.seq, "policy_version": record.policy_version, "z": record.z,
            "baseline": record.baseline}


def result_fields(trajectory: Trajectory) -> dict[str, Any]:
    """What a ``result`` event records of an arrived trajectory."""
    return {"request_id": trajectory.request_id, "prompt_id": trajectory.prompt_id, "group_id": trajectory.group_id,
            "end_reason": trajectory.end_reason, "outcome": trajectory.outcome, "turns": len(trajectory.turns),
            "num_action_tokens": trajectory.num_action_tokens, "dispatch_version": trajectory.dispatch.policy_version,
            "turn_versions": trajectory.turn_versions, "duration_s": trajectory.duration_s,
            "injected_delay_s": trajectory.injected_delay_s,
            "error": clipped(trajectory.error, ERROR_CHARS)}


#: the longest error text an event keeps (a traceback's last line is what matters)
ERROR_CHARS = 500


def clipped(text: str | None, limit: int) -> str | None:
    """``text`` cut to ``limit`` characters, the cut marked with how much was dropped."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of the run the learner saw, in order.

    A resumed run restarts ``seq`` at its checkpoint; events of the crashed run with a ``seq`` at
    or past that point never reached a checkpoint and are dropped. A line that is not an event (torn
    by a kill or a full disk, invalid UTF-8, foreign) is skipped with one warning for the file.
    """
    events: list[dict[str, Any]] = []
    skipped: list[int] = []
    with Path(path).open(encoding="utf-8", errors="replace") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
                seq = int(event["seq"])
                event["event"]  # noqa: B018 (a line without it is no event)
            except (ValueError, KeyError, TypeError):
                skipped.append(number)  # torn by a kill or a full disk, or foreign
                continue
            while events and events[-1]["seq"] >= seq:
                events.pop()
            events.append(event)
    if skipped:
        warnings.warn(f"{path}: skipped {len(skipped)} line(s) that are not rollout events (first: line {skipped[0]})",
                      stacklevel=2)
    return events


def replay(path: str | Path) -> list[list[str]]:
    """The learner's batches, as the request ids it received, in the order it received them."""
    return [list(event["request_ids"]) for event in read_events(path) if event["event"] == "deliver"]
