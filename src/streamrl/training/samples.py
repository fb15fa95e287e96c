"""Transcripts: episodes as people read them, written to ``samples.jsonl`` in the run folder.

Metrics say how often the policy wins; transcripts show what it actually writes. Training writes a
few episodes of a batch every ``logging.samples_every`` learner steps, with the advantage each turn
was trained with; every evaluation writes all of its episodes. One JSON object a line (``kind``
``train`` or ``eval``); ``write_report`` renders successes and failures of the last evaluation, and
``streamrl show RUN`` the newest ones in the terminal (``read_samples``, ``plain_transcript``, ``rich_transcript``).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from streamrl.rollout import Trajectory
from streamrl.rollout.events import JsonLines, clipped
from streamrl.rollout.trajectory import to_jsonable


def transcript(
    trajectory: Trajectory, *, kind: str, step: int, tag: str | None = None, advantages: list[float] | None = None,
    max_chars: int = 4000,
) -> dict[str, Any]:
    """A JSON-safe record of one episode; ``advantages`` are its per-turn advantages (None when
    the episode was not trained on: evaluation, crashed or stale episodes). Texts longer than
    ``max_chars`` are cut, the cut marked."""
    return to_jsonable({
        "kind": kind,
        "step": step,
        "tag": tag,
        "request_id": trajectory.request_id,
        "task_id": trajectory.prompt_id,
        "task_type": trajectory.task_type,
        "task": clipped(trajectory.initial_observation, max_chars),
        "won": trajectory.won,
        "outcome": trajectory.outcome,
        "end_reason": trajectory.end_reason,
        "error": clipped(trajectory.error, max_chars),
        "policy_version": trajectory.dispatch.policy_version,
        "turns": [
            {
                "action_text": clipped(turn.action_text, max_chars),
                "action": clipped(turn.action, max_chars),
                "observation": clipped(turn.observation, max_chars),
                "reward": turn.reward,
                "format_valid": turn.format_valid,
                "format_reason": turn.format_reason,
                "tool_calls": turn.tool_calls,
                "reply": turn.reply,
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

    def __init__(self, path: Path, max_chars: int = 4000):
        self.path = Path(path)
        self.max_chars = max_chars
        self._file = JsonLines(self.path)

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
        self._file.append(*(transcript(t, kind=kind, step=step, tag=tag, advantages=advantages.get(t.request_id),
                                       max_chars=self.max_chars) for t in trajectories))

    def close(self) -> None:
        self._file.close()


# -- reading them back: ``streamrl show`` --------------------------------------------------------


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The records of ``samples.jsonl`` in file order. A line that does not parse (the last one of a
    run still writing, or a damaged one) is skipped, so a live run can be watched."""
    records = []
    with Path(path).open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("turns"), list):
                records.append(record)
    return records


def select_samples(
    records: list[dict[str, Any]], *, last: int = 5, kind: str | None = None, failures: bool = False
) -> list[dict[str, Any]]:
    """The ``last`` newest records of ``kind`` (None: both), only lost episodes with ``failures``."""
    chosen = [r for r in records if (kind is None or r.get("kind") == kind) and not (failures and r.get("won"))]
    return chosen[-last:] if last > 0 else []


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, (int, float)) else str(value)


def transcript_header(record: dict[str, Any]) -> str:
    """``eval step 40 (eval-v40) task test/3 [pick_and_place]: WON, outcome 1, 4 turns, ended terminated``"""
    tag = f" ({record['tag']})" if record.get("tag") else ""
    task_type = f" [{record['task_type']}]" if record.get("task_type") else ""
    verdict = "WON" if record.get("won") else "lost"
    outcome = "none (crashed)" if record.get("outcome") is None else _number(record["outcome"])
    return (f"{record.get('kind', '?')} step {record.get('step', '?')}{tag} task {record.get('task_id')}{task_type}: "
            f"{verdict}, outcome {outcome}, {len(record['turns'])} turns, ended {record.get('end_reason')}")


def turn_note(turn: dict[str, Any]) -> str:
    """``reward 0, advantage -0.31, invalid format`` (the advantage only for trained episodes)."""
    parts = [f"reward {_number(turn.get('reward'))}"]
    if turn.get("advantage") is not None:
        parts.append(f"advantage {turn['advantage']:+.3f}")
    if not turn.get("format_valid", True):
        parts.append(f"invalid format: {turn['format_reason']}" if turn.get("format_reason") else "invalid format")
    if turn.get("tool_calls") is None and turn.get("action") is not None and turn.get("action") != (turn.get("action_text") or "").strip():
        parts.append(f"parsed action: {turn['action']!r}")
    return ", ".join(parts)


def plain_transcript(record: dict[str, Any]) -> str:
    """One episode as plain text: the task, then each model turn (``>``-quoted) and what came back."""
    lines = ["=" * 80, transcript_header(record), "-" * 80, str(record.get("task") or "").rstrip()]
    for index, turn in enumerate(record["turns"], 1):
        lines += ["", f"[turn {index}] model ({turn_note(turn)}):"]
        lines += [f"> {line}" for line in (turn.get("action_text") or "").splitlines() or [""]]
        lines += answer_lines(turn)
    return "\n".join(lines) + "\n"


def answer_lines(turn: dict[str, Any]) -> list[str]:
    """What came back after a turn: the observation (text form), or each parsed call and the message
    that answered it (tool form: ``call python(code=...)`` then ``tool python: <result>``)."""
    if turn.get("tool_calls") is None or turn.get("reply") is None:
        return [str(turn.get("observation") or "").rstrip()]
    lines = []
    for call in turn["tool_calls"]:
        if call.get("error") is not None:
            lines.append(f"call (unreadable: {call['error']}): {call.get('raw', '')}")
        else:
            arguments = ", ".join(f"{k}={json.dumps(v)}" for k, v in (call.get("arguments") or {}).items())
            lines.append(f"call {call.get('name')}({arguments})")
    for message in turn["reply"]:
        who = f"tool {message.get('name')}" if message.get("role") == "tool" else str(message.get("role"))
        content = str(message.get("content") or "").rstrip().splitlines() or [""]
        lines += [f"{who}: {content[0]}", *content[1:]]
    return lines


def rich_transcript(record: dict[str, Any]) -> Any:
    """One episode as a rich panel (for a terminal)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    colour = "green" if record.get("won") else "red"
    parts: list[Any] = [Text(transcript_header(record), style=f"bold {colour}"), Text(str(record.get("task") or "").rstrip())]
    for index, turn in enumerate(record["turns"], 1):
        style = "bold cyan" if turn.get("format_valid", True) else "bold red"
        parts.append(Text(f"\nturn {index} ({turn_note(turn)})", style="dim"))
        parts.append(Text(turn.get("action_text") or "(empty reply)", style=style))
        parts.append(Text("\n".join(answer_lines(turn))))
    return Panel(Group(*parts), border_style=colour)
