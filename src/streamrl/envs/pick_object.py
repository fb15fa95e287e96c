"""``pick_object``: a one-turn contextual choice, the smallest task on which learning is visible.

The observation names a target and lists a few objects (``Take the mug. You see: pen, mug,
egg.``); the episode is won by replying with the target. Solving it needs the model to copy a
word from its context, the skill an ALFWorld agent needs for object and receptacle names, in one
turn and a handful of tokens, so a tiny model on a CPU learns it in seconds. The learning test
and ``benchmarks/learning.py --quick`` train on it from a weak warm start.

Task ids: ``train/<n>`` (unbounded) and ``test/<n>`` for n below ``test_tasks``; the listed objects
and the target are a hash of the id. ``expert_action()`` answers the target (for SFT).

Tool form: ``take(object)``; the answer counts only as a call (a reply without one is format-invalid
and, the episode having one turn, lost).
"""

from __future__ import annotations

import random
from typing import Any

from streamrl.envs.base import ActionParser, Env, EnvSpec, ParsedAction, PromptBuilder, Step
from streamrl.envs.common import tagged_text
from streamrl.envs.registry import register
from streamrl.envs.tools import tool

OBJECTS = ("apple", "mug", "knife", "book", "pen", "cup", "plate", "pan", "egg", "box")
INSTRUCTION = "Reply <action>object</action>."
TOOL_INSTRUCTION = "Call take with the object."


def task(task_id: str, choices: int) -> tuple[list[str], str]:
    """The listed objects and the target of ``task_id``."""
    rng = random.Random(f"pick/{task_id}")
    listed = rng.sample(OBJECTS, choices)
    return listed, rng.choice(listed)


class PickObjectEnv(Env):
    def __init__(self, choices: int = 3, test_tasks: int = 200, seed: int | None = None):
        if not 2 <= choices <= len(OBJECTS):
            raise ValueError(f"pick_object: choices must be in 2..{len(OBJECTS)}, got {choices}")
        if test_tasks < 1:
            raise ValueError(f"pick_object: test_tasks must be >= 1, got {test_tasks}")
        super().__init__(seed=seed)
        self.choices = choices
        self.spec = EnvSpec(name="pick_object", max_steps=1, splits={"train": None, "test": test_tasks}, eval_split="test")

    def start(self, task_id: str) -> str:
        listed, self.target = task(task_id, self.choices)
        return f"Take the {self.target}. You see: {', '.join(listed)}."

    def act(self, action: str) -> Step:
        won = action.strip() == self.target
        return Step("Done.", reward=float(won), done=True, won=won)

    @tool
    def take(self, object: str) -> Step:
        """Take one of the objects you see.

        Args:
            object: the object to take
        """
        return self.act(object)

    def expert_action(self) -> str:
        return self.target


class PickObjectParser(ActionParser):
    """The text inside the first ``<action>...</action>``; anything else is format-invalid."""

    def parse(self, text: str) -> ParsedAction:
        inner = tagged_text(text, "action")
        return ParsedAction((inner or "").strip(), inner is not None)


class PickObjectPromptBuilder(PromptBuilder):
    """The observation and the reply format, one user message (the episode has one turn).
    ``tools``: the tool form (ask for a ``take`` call)."""

    def __init__(self, tools: bool = False):
        self.instruction = TOOL_INSTRUCTION if tools else INSTRUCTION

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        return f"{observation}\n{self.instruction}"

    def step_messages(self, initial_observation, history, observation, info) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.first_message(observation, info)}]


register("pick_object", PickObjectEnv, PickObjectParser, PickObjectPromptBuilder)
