"""Transcripts: episodes as people read them, written to ``samples.jsonl`` in the run folder.

Metrics say how often the policy wins; transcripts show what it actually writes. Training writes a
few episodes of a batch every ``logging.samples_every`` learner steps, with the advantage each turn
was trained with; every evaluation writes all of its episodes. One JSON object a line (``kind``
``train`` or ``eval``); ``write_report`` renders successes and failures of the last evaluation.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from streamrl.rollout import Trajectory
from streamrl.rollout.trajectory import to_jsonable


def transcript(
    trajectory: Trajectory, *, kind: str, step: int, tag: str | None = None, advantages: list[float] | None = None
) -> dict[str, Any]:
    """A JSON-safe record of one episode; ``advantages`` are its per-turn advantages (None when
    the episode was not trained on: evaluation, crashed or stale episodes)."""
    return to_jsonable({
        "kind": kind,
        "step": step,
        "tag": tag,
        "request_id": trajectory.request_id,
        "task_id": trajectory.prompt_id,
        "task_type": trajectory.task_type,
        "task": trajectory.initial_observation,
        "won": trajectory.won,
        "outcome": trajectory.outcome,
        "end_reason": trajectory.end_reason,
        "policy_version": trajectory.dispatch.policy_version,
        "turns": [
            {
                "action_text": turn.action_text,
                "action": turn.action,
                "observation": turn.observation,
                "reward": turn.reward,
                "format_valid": turn.format_valid,
                "advantage": None if advantages is None else advantages[index],
            }
            for index, turn in enumerate(trajectory.turns)
        ],
    })


def mixed_selection(trajectories: list[Trajectory], count: int) -> list[Trajectory]:
    """Up to ``count`` trajectories, successes and failures alternated in batch order, so even a
    small sample shows both whenever the batch holds both."""
    won = [t for t in trajectories if t.won]
    lost = [t for t in trajectories if not t.won]
    alternated = [t for pair in itertools.zip_longest(won, lost) for t in pair if t is not None]
    return alternated[:count]


class SampleLog:
    """Appends transcripts to ``path``; each write is flushed, so the file's size is a valid
    checkpoint offset."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = self.path.open("a", encoding="utf-8")

    def write(
        self,
        trajectories: list[Trajectory],
        *,
        kind: str,
        step: int,
        tag: str | None = None,
        advantages: dict[str, list[float]] | None = None,
    ) -> None:
        """``advantages`` maps request ids to per-turn advantages (``Learner.last_advantages``)."""
        advantages = advantages or {}
        for trajectory in trajectories:
            record = transcript(trajectory, kind=kind, step=step, tag=tag, advantages=advantages.get(trajectory.request_id))
            self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

