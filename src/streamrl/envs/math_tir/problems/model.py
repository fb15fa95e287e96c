"""What a generated problem is, the knobs that shape it, and the family interface."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DIGITS_RANGE = (1, 12)
STEPS_RANGE = (1, 12)
MAX_DISTRACTORS = 5


@dataclass(frozen=True)
class Knobs:
    """Difficulty knobs. ``None`` lets each family draw from its default range.

    * ``digits``: size of the main quantities (clamped to what the family supports);
    * ``n_steps``: length of a chain (operations, legs, successive changes) where a family has one;
    * ``distractors``: irrelevant sentences with numbers added to the story.
    """

    digits: int | None = None
    n_steps: int | None = None
    distractors: int = 0

    def __post_init__(self) -> None:
        for name, (low, high) in (("digits", DIGITS_RANGE), ("n_steps", STEPS_RANGE)):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
            ):
                raise ValueError(f"math_tir knob {name} must be an int in [{low}, {high}] or None, got {value!r}")
        if isinstance(self.distractors, bool) or not isinstance(self.distractors, int):
            raise ValueError(f"math_tir knob distractors must be an int, got {self.distractors!r}")
        if not 0 <= self.distractors <= MAX_DISTRACTORS:
            raise ValueError(f"math_tir knob distractors must be in [0, {MAX_DISTRACTORS}], got {self.distractors}")

    def pick_digits(self, rng: random.Random, low: int, high: int) -> int:
        """The family's digit count: the knob clamped to [low, high], else a uniform draw."""
        return min(max(self.digits, low), high) if self.digits is not None else rng.randint(low, high)

    def pick_steps(self, rng: random.Random, low: int, high: int) -> int:
        return min(max(self.n_steps, low), high) if self.n_steps is not None else rng.randint(low, high)


@dataclass(frozen=True)
class Draft:
    """A family's output before distractors: story sentences, the question, the exact answer.

    ``params`` holds every value the story states, so a test can re-derive the answer.
    """

    context: list[str]
    ask: str
    answer: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    """One problem family: its in-distribution templates, its held-out ones, and its builder."""

    name: str
    templates: tuple[str, ...]
    held_out: tuple[str, ...]
    build: Callable[[random.Random, Knobs, str], Draft]


@dataclass(frozen=True)
class MathProblem:
    task_id: str
    family: str
    template: str
    question: str
    answer: str
    params: dict[str, Any]
    held_out: bool = False


def digits_number(rng: random.Random, digits: int) -> int:
    """A uniform integer with exactly ``digits`` digits."""
    return rng.randint(10 ** (digits - 1) if digits > 1 else 1, 10**digits - 1)
