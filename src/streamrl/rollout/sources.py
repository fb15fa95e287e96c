"""Where the dispatcher gets prompts: a small protocol the trainer implements.

The trainer's prompt source owns the pool and the sampling weights (SPO's tracker, SPO++'s event
memory); the rollout only asks it which prompt to run next, what to freeze at dispatch, and tells
it about results and published versions. ``UniformPromptSource`` is the default.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from streamrl.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class DispatchMeta:
    """Values frozen at dispatch and carried by the trajectory (``DispatchRecord``)."""

    #: the event coordinate z of the serving snapshot (SPO++ section 5.1)
    z: float | None = None
    #: the baseline read at dispatch, v-hat_q (SPO++ section 5.2)
    baseline: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class PromptSource(Protocol):
    """Called from the rollout's event loop; keep each call quick."""

    def prompt_ids(self) -> Sequence[str]:
        """The current pool of task ids (it may grow between calls)."""
        ...

    def select(self, candidates: Sequence[str], rng: random.Random) -> str:
        """Pick one of ``candidates`` (the pool minus prompts at their in-flight cap)."""
        ...

    def on_dispatch(self, prompt_id: str) -> DispatchMeta:
        """Freeze what this request must carry (baseline, z) at the moment it is dispatched."""
        ...

    def on_result(self, trajectory: Trajectory) -> None:
        """A trajectory arrived (first-finished): record its evidence."""
        ...

    def on_publish(self, version: int) -> None:
        """The learner published weights ``version``."""
        ...


class UniformPromptSource:
    """Uniform sampling over a fixed pool; freezes nothing."""

    def __init__(self, prompt_ids: Sequence[str]):
        if not prompt_ids:
            raise ValueError("UniformPromptSource: the prompt pool is empty")
        self._prompt_ids = list(prompt_ids)

    def prompt_ids(self) -> Sequence[str]:
        return self._prompt_ids

    def select(self, candidates: Sequence[str], rng: random.Random) -> str:
        return rng.choice(list(candidates))

    def on_dispatch(self, prompt_id: str) -> DispatchMeta:
        return DispatchMeta()

    def on_result(self, trajectory: Trajectory) -> None:
        return None

    def on_publish(self, version: int) -> None:
        return None
