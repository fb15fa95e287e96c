"""Prompts for ALFWorld-style environments (``alfworld_lite`` and ``alfworld_real``), and the parser.

Two styles:

* ``"verl"``: verl-agent's layout. First step: the expert-agent sentence, the observation and the
  admissible list; later steps add the task, ``Prior to this step, you have already taken N
  step(s).``, the last ``history_length`` steps as ``[Observation k: '...', Action k: '...']``
  (k counts from 1 over the whole episode), and ``You are now at step N+1 and your current
  observation is: ...``. Admissible actions are single-quoted, joined by a newline and a space,
  without ``help``. Then the ``<think>``/``<action>`` instruction.
* ``"compact"``: the same information with far fewer tokens, for a tiny model on a CPU: the task,
  the last steps as a ``> action`` / result transcript, and the admissible actions with the
  ``go to`` targets grouped on one line.

``tools=True`` (the tool form) asks for an ``execute`` call instead of an ``<action>`` tag.
``require_think=False`` drops the reasoning request from the instruction (pair it with
``alfworld_action_parser(require_think=False)``); ``instruction`` replaces the instruction text.
``admissible="first"`` (compact full-history transcripts) lists the admissible actions only in
the first message: later observations are appended bare, which keeps a long episode short.
``visited=True`` (compact per-step prompts) adds a one-line memory of the receptacles already
visited, in order, like verl-agent's memory module: a short history window then still shows
where the agent has searched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrl.envs.alfworld_lite.text import TASK_PREFIX, WELCOME
from streamrl.envs.base import History, Messages
from streamrl.envs.common import InstructedPromptBuilder, ThinkActionParser

EXPERT_SENTENCE = "You are an expert agent operating in the ALFRED Embodied Environment."
THINK_INSTRUCTION = (
    "You should first reason step by step about the current situation. This reasoning MUST be "
    "enclosed within <think> </think> tags. Then choose one admissible action for the current step "
    "and present it within <action> </action> tags."
)
ACTION_INSTRUCTION = "Choose one admissible action for the current step and present it within <action> </action> tags."


def alfworld_action_parser(require_think: bool = True, fallback_chars: int = 30) -> ThinkActionParser:
    """verl-agent's ALFWorld projection (30-character fallback)."""
    return ThinkActionParser(require_think=require_think, fallback_chars=fallback_chars)


def task_of(initial_observation: str) -> str:
    """The goal as verl-agent extracts it: everything after ``Your task is to: ``."""
    start = initial_observation.find(TASK_PREFIX)
    return initial_observation[start + len(TASK_PREFIX) :].strip() if start >= 0 else ""


def without_banner(observation: str) -> str:
    """The initial observation's room sentence alone (no welcome banner, no task)."""
    body = observation.removeprefix(WELCOME).strip()
    start = body.find(TASK_PREFIX)
    return body[:start].strip() if start >= 0 else body


def _visited(history: History) -> list[str]:
    """Receptacles the agent went to, first visit order, each once."""
    places: list[str] = []
    for _, action in history:
        if action.startswith("go to ") and action[6:] not in places:
            places.append(action[6:])
    return places


def _admissible(info: dict[str, Any]) -> list[str]:
    return [action for action in info.get("admissible_actions") or [] if action != "help"]


@dataclass(eq=False)
class AlfworldPromptBuilder(InstructedPromptBuilder):
    admissible: str = "every"
    visited: bool = False

    def __post_init__(self) -> None:
        if self.admissible not in ("every", "first"):
            raise ValueError(f"alfworld prompt builder: admissible must be 'every' or 'first', got {self.admissible!r}")
        self._instruct("alfworld", (THINK_INSTRUCTION, ACTION_INSTRUCTION), "call execute with one admissible command")

    # -- full-history transcripts ----------------------------------------------------------------

    def system_prompt(self) -> str | None:
        if self.style == "verl":
            return f"{EXPERT_SENTENCE}\n{self.instruction_text}"
        return None

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        if self.style == "verl":
            return f"Your current observation is: {observation}\n{self._verl_admissible(info)}"
        return f"Task: {task_of(observation)}\n{self._compact_admissible(info)}\n{self.instruction_text}"

    def next_message(self, observation: str, info: dict[str, Any]) -> str:
        if self.style == "verl":
            return f"Your current observation is: {observation}\n{self._verl_admissible(info)}"
        if self.admissible == "first":
            return observation
        return f"{observation}\n{self._compact_admissible(info)}"

    # -- per-step prompts ------------------------------------------------------------------------

    def step_messages(self, initial_observation: str, history: History, observation: str, info: dict[str, Any]) -> Messages:
        if self.style == "verl":
            content = self._verl_step(initial_observation, history, observation, info)
        else:
            content = self._compact_step(initial_observation, history, observation, info)
        return [{"role": "user", "content": content}]

    def _verl_step(
        self, initial: str, history: History, observation: str, info: dict[str, Any]
    ) -> str:
        admissible = self._verl_admissible(info)
        if not history:
            return (
                f"{EXPERT_SENTENCE}\nYour current observation is: {observation}\n{admissible}\n\n"
                f"Now it's your turn to take an action.\n{self.instruction_text}"
            )
        taken = len(history)
        shown = min(self.history_length, taken)
        lines = [
            f"[Observation {k + 1}: '{history[k][0]}', Action {k + 1}: '{history[k][1]}']"
            for k in range(taken - shown, taken)
        ]
        recent = f" Below are the most recent {shown} observations and the actions you took:\n" if shown else ""
        return (
            f"{EXPERT_SENTENCE} Your task is to: {task_of(initial)}\n"
            f"Prior to this step, you have already taken {taken} step(s).{recent}" + "\n".join(lines) + "\n"
            f"You are now at step {taken + 1} and your current observation is: {observation}\n{admissible}\n\n"
            f"Now it's your turn to take an action.\n{self.instruction_text}"
        )

    def _compact_step(
        self, initial: str, history: History, observation: str, info: dict[str, Any]
    ) -> str:
        lines = [f"Task: {task_of(initial)}"]
        if not history:
            lines.append(without_banner(observation))
        else:
            # the result of action k is the observation of step k + 1 (the current one for the last)
            results = [obs for obs, _ in history[1:]] + [observation]
            for k in range(max(0, len(history) - self.history_length), len(history)):
                lines += [f"> {history[k][1]}", results[k]]
            if self.history_length == 0:
                lines.append(observation)
        if self.visited and history:
            lines.append("Visited: " + (", ".join(_visited(history)) or "nothing"))
        lines += [self._compact_admissible(info), self.instruction_text]
        return "\n".join(lines)

    @staticmethod
    def _verl_admissible(info: dict[str, Any]) -> str:
        quoted = "\n ".join(f"'{action}'" for action in _admissible(info))
        return f"Your admissible actions of the current situation are: [{quoted}]."

    @staticmethod
    def _compact_admissible(info: dict[str, Any]) -> str:
        actions = _admissible(info)
        places = [action.removeprefix("go to ") for action in actions if action.startswith("go to ")]
        others = [action for action in actions if not action.startswith("go to ")]
        return f"Go to: {', '.join(places)}\nOr: {', '.join(others)}"
