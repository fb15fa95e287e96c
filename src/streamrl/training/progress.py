"""What a user sees while training: a rich progress bar on a terminal, periodic lines otherwise;
and a line every few seconds of a long phase (``TimedLines``: SFT, an evaluation)."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable


class Progress:
    def __init__(self, total: int, start: int = 0, *, enabled: bool = True, echo: Callable[[str], None] = print):
        self.total, self.start, self.echo = total, start, echo
        self.enabled = enabled and total > start
        self.started = time.monotonic()
        self.trajectories = 0.0
        self._bar = None
        if self.enabled and sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            self._bar = RichProgress(
                TextColumn("[bold]RL"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"), transient=False,
            )
            self._task = self._bar.add_task("train", total=total, completed=start, status="")
            self._bar.start()
        self._every = max(1, (total - start) // 10)

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.trajectories += metrics.get("trajectories", 0.0)
        elapsed = max(time.monotonic() - self.started, 1e-9)
        status = (
            f"success {metrics.get('success', 0.0):.2f} | {self.trajectories / elapsed:.1f} traj/s | "
            f"learner {metrics.get('learner_time_s', 0.0):.1f}s/step"
        )
        if metrics.get("crashed_frac"):  # episodes that ended in a fault (their reasons: events.jsonl, the report)
            status += f" | crashed {metrics['crashed_frac']:.0%}"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status)
        elif step == self.total or (step - self.start) % self._every == 0:
            remaining = elapsed / max(step - self.start, 1) * (self.total - step)
            self.echo(f"step {step}/{self.total} | {status} | ETA {_clock(remaining)}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


class StallWatch:
    """Says, once, when ``steps`` learner steps in a row could not teach anything useful: every
    advantage was 0 or the actor update was skipped (the policy did not change), or no episode
    succeeded (RL can only push down what was tried)."""

    FIX = "start from a warm start (model.init_from, sft.demos) or an easier task split"

    def __init__(self, steps: int = 5):
        self.steps = steps
        self.still = 0
        self.failing = 0
        self.warning: str | None = None

    def update(self, step: int, metrics: dict[str, Any]) -> str | None:
        """The warning line the first time either run of steps reaches ``steps``, else None."""
        still = metrics.get("actor_skipped", 0.0) >= 1.0 or metrics.get("frac_zero_adv", 0.0) >= 1.0
        self.still = self.still + 1 if still else 0
        self.failing = self.failing + 1 if metrics.get("success", 1.0) == 0.0 else 0
        if self.warning is not None:
            return None
        span = f"steps {step - self.steps + 1}-{step}"
        if self.still >= self.steps:
            self.warning = f"{span}: every advantage is 0, so the policy is not changing; {self.FIX}"
        elif self.failing >= self.steps:
            self.warning = f"{span}: no episode succeeded, so there is no success to learn from; {self.FIX}"
        return self.warning


class TimedLines:
    """A long phase's progress: at most one line every ``every_s`` seconds, each ending with the
    time left at the pace so far."""

    def __init__(self, total: int, echo: Callable[[str], None], every_s: float = 10.0):
        self.total, self.echo, self.every_s = total, echo, every_s
        self.began = self.told = time.monotonic()

    def tell(self, done: int, what: str) -> None:
        """Say ``what`` (of ``done`` of ``total``) if a line is due."""
        now = time.monotonic()
        if now - self.told < self.every_s:
            return
        self.told = now
        self.echo(f"{what}, about {(now - self.began) / done * (self.total - done):.0f} s left")
