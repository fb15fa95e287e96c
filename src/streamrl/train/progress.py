"""What a user sees while training: a rich progress bar on a terminal, periodic lines otherwise."""

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
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._bar = RichProgress(
                TextColumn("[bold]RL"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
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
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status)
        elif step == self.total or (step - self.start) % self._every == 0:
            self.echo(f"step {step}/{self.total} | {status}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
