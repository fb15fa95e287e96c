"""What a rollout checkpoint holds: the counters that survive a restart, and the checks that a
saved state fits the rollout it is loaded into."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

STATE_FORMAT = 1
STATE_KEYS = (
    "format", "mode", "group_size", "dispatch_seq", "group_seq", "admitted", "start_version", "learner_version",
    "batches_delivered", "event_seq", "end_reasons", "finished_ids", "rng", "inflight", "buffer",
)


@dataclass
class Counters:
    """The dispatcher's checkpointed counters."""

    start_version: int = 0
    learner_version: int = 0
    dispatch_seq: int = 0
    #: dispatched minus stragglers discarded undelivered
    admitted: int = 0
    batches: int = 0
    end_reasons: Counter[str] = field(default_factory=Counter)
    finished_ids: set[str] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dispatch_seq": self.dispatch_seq, "admitted": self.admitted, "start_version": self.start_version,
            "learner_version": self.learner_version, "batches_delivered": self.batches,
            "end_reasons": dict(self.end_reasons), "finished_ids": sorted(self.finished_ids),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Counters:
        return cls(
            start_version=int(state["start_version"]), learner_version=int(state["learner_version"]),
            dispatch_seq=int(state["dispatch_seq"]), admitted=int(state["admitted"]),
            batches=int(state["batches_delivered"]), end_reasons=Counter(state["end_reasons"]),
            finished_ids=set(state["finished_ids"]),
        )


def check_state(state: dict[str, Any], settings: Any) -> None:
    """Raise ``ValueError`` unless ``state`` is a whole rollout state saved with ``settings``' mode."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"rollout state has format {state.get('format')!r}, expected {STATE_FORMAT}")
    missing = sorted(set(STATE_KEYS) - set(state))
    if missing:
        raise ValueError(f"rollout state lacks {', '.join(missing)}")
    for key in ("mode", "group_size"):
        if state[key] != getattr(settings, key):
            raise ValueError(f"rollout state was saved with {key}={state[key]!r}, settings have {getattr(settings, key)!r}")


def rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: list[Any]) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
