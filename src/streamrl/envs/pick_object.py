"""``pick_object``: a one-turn contextual choice, the smallest task on which learning is visible.

The observation names a target and lists a few objects (``Take the mug. You see: pen, mug,
egg.``); the episode is won by replying with the target. Solving it needs the model to copy a
word from its context, the skill an ALFWorld agent needs for object and receptacle names, in one
turn and a handful of tokens, so a tiny model on a CPU learns it in seconds. The learning test
and ``benchmarks/learning.py --quick`` train on it from a weak warm start.

Task ids: ``train/<n>`` (unbounded) and ``test/<n>`` for n below ``test_tasks``; the listed objects
and the target are a hash of the id. ``expert_action()`` answers the target (for SFT).
"""

from __future__ import annotations

import random
from typing import Any

from streamrl.envs.base import ActionParser, Env, EnvSpec, ParsedAction, PromptBuilder, StepResult
from streamrl.envs.common import tagged_text
from streamrl.envs.registry import register

OBJECTS = ("apple", "mug", "knife", "book", "pen", "cup", "plate", "pan", "egg", "box")
INSTRUCTION = "Reply <action>object</action>."


def task(task_id: str, choices: int) -> tuple[list[str], str]:
    """The listed objects and the target of ``task_id``."""
    split, _, index = task_id.partition("/")
    if split not in ("train", "test") or not index.isdigit():
        raise ValueError(f"pick_object: bad task_id {task_id!r} (expected 'train/<n>' or 'test/<n>')")
    rng = random.Random(f"pick/{task_id}")
    listed = rng.sample(OBJECTS, choices)
    return listed, rng.choice(listed)


class PickObjectEnv(Env):
    def __init__(self, choices: int = 3, test_tasks: int = 200):
        if not 2 <= choices <= len(OBJECTS):
            raise ValueError(f"pick_object: choices must be in 2..{len(OBJECTS)}, got {choices}")
        if test_tasks < 1:
            raise ValueError(f"pick_object: test_tasks must be >= 1, got {test_tasks}")
        self.choices = choices
        self.spec = EnvSpec(name="pick_object", max_steps=1, splits={"train": None, "test": test_tasks}, eval_split="test")
        self.task_id, self.target = "train/0", ""

    def reset(self, seed: int | None = None, task_id: str | None = None, options: dict | None = None):
        self.task_id = task_id or f"train/{seed or 0}"
        listed, self.target = task(self.task_id, self.choices)
        return f"Take the {self.target}. You see: {', '.join(listed)}.", self._info(False, step=0)

    def step(self, action: str) -> StepResult:
        won = action.strip() == self.target
        return StepResult("Done.", float(won), True, False, {**self._info(won, step=1), "reason": "won" if won else "lost"})

    def expert_action(self) -> str:
        return self.target

    def _info(self, won: bool, step: int) -> dict[str, Any]:
        return {"won": won, "score": float(won), "admissible_actions": None, "format_valid": True,
                "action_effective": True, "task_id": self.task_id, "task_type": "pick_object", "step": step}

    def close(self) -> None:
        pass


class PickObjectParser(ActionParser):
    """The text inside the first ``<action>...</action>``; anything else is format-invalid."""

    def parse(self, text: str) -> ParsedAction:
        inner = tagged_text(text, "action")
        return ParsedAction((inner or "").strip(), inner is not None)


class PickObjectPromptBuilder(PromptBuilder):
    """The observation and the reply format, one user message (the episode has one turn)."""

    def system_prompt(self) -> str | None:
        return None

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        return f"{observation}\n{INSTRUCTION}"

    def next_message(self, observation: str, info: dict[str, Any]) -> str:
        return observation

    def step_messages(self, initial_observation: str, history, observation: str, info: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.first_message(observation, info)}]


register("pick_object", PickObjectEnv, PickObjectParser, PickObjectPromptBuilder)
