"""Prompts for WebShop-style environments (``webshop_lite`` and ``webshop_real``), and the parser.

* ``"verl"``: verl-agent's WebShop template. The task is the instruction; the observation is the
  page after the instruction with each ``[SEP]`` part single-quoted; the admissible actions are
  single-quoted, one per line, in brackets; earlier steps appear as
  ``[Observation k: '...', Action k: '...']`` (the last ``history_length``). Above 13,000
  characters the prompt falls back to the template without history, as verl-agent does.
* ``"compact"``: the same information in far fewer tokens for a tiny model: the task, the last
  steps as ``> action`` lines, then the page without the instruction with every clickable part
  written as its action (``click[b0dacz57s9]``, ``click[buy now]``), each result on its own line
  (``click[asin] | title | $price``), and only the admissible actions not on the page (the search
  bar) listed after it. Each action then sits next to what it acts on, and nothing is said twice.
  ``number_results=True`` writes the results as ``click[1]`` .. ``click[10]`` in page order
  instead of their ASINs (the environments read ``click[k]`` on a results page as the k-th
  result): choosing a result is then choosing among ten short, frequent tokens, not copying a
  10-character code, which a small model trained from scratch does not learn (docs/webshop.md).

``tools=True`` (the tool form) asks for a ``search`` or ``click`` call instead of an ``<action>`` tag.

The parser is verl-agent's ``<think>``/``<action>`` projection with WebShop's 20-character fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from streamrl.envs.base import History, Messages
from streamrl.envs.common import InstructedPromptBuilder, ThinkActionParser
from streamrl.envs.webshop_lite.text import shown_results

SEP = " [SEP] "
_ASIN = re.compile(r"^B0[0-9A-Z]{8}$")
EXPERT_SENTENCE = "You are an expert autonomous agent operating in the WebShop e-commerce environment."
THINK_INSTRUCTION = (
    "You should first reason step-by-step about the current situation, then think carefully which admissible "
    "action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> "
    "tags. Once you've finished your reasoning, you should choose an admissible action for current step and "
    "present it within <action> </action> tags."
)
ACTION_INSTRUCTION = "Choose an admissible action for the current step and present it within <action> </action> tags."
MAX_PROMPT_CHARS = 13000


def webshop_action_parser(require_think: bool = True, fallback_chars: int = 20) -> ThinkActionParser:
    """verl-agent's WebShop projection (20-character fallback)."""
    return ThinkActionParser(require_think=require_think, fallback_chars=fallback_chars)


def instruction_of(observation: str) -> str:
    """The instruction: the part after ``Instruction:``."""
    parts = observation.split(SEP)
    if "Instruction:" in parts:
        index = parts.index("Instruction:")
        if index + 1 < len(parts):
            return parts[index + 1]
    return ""


def page_parts(observation: str) -> list[str]:
    """The page's parts after the instruction (the whole page when it has none)."""
    parts = observation.split(SEP)
    if "Instruction:" in parts:
        index = parts.index("Instruction:")
        return parts[index + 2 :]
    return parts


def _task(initial: str, info: dict[str, Any]) -> str:
    return info.get("instruction") or instruction_of(initial)


@dataclass(eq=False)
class WebshopPromptBuilder(InstructedPromptBuilder):
    number_results: bool = False

    def __post_init__(self) -> None:
        self._instruct("webshop", (THINK_INSTRUCTION, ACTION_INSTRUCTION), "call search or click with one admissible action")
        if self.number_results and self.style != "compact":
            raise ValueError("webshop prompt builder: number_results needs style 'compact' (verl-agent's lists ASINs)")

    def shown_action(self, action: str, observation: str, info: dict[str, Any]) -> str:
        return self._result_numbers(info).get(action, action)

    def _result_numbers(self, info: dict[str, Any]) -> dict[str, str]:
        """``click[<asin>]`` -> ``click[k]`` for the page's results (empty unless ``number_results``)."""
        if not self.number_results:
            return {}
        return {a: f"click[{k}]" for k, a in enumerate(shown_results(info.get("admissible_actions") or []), 1)}

    # -- full-history transcripts ----------------------------------------------------------------

    def system_prompt(self) -> str | None:
        return f"{EXPERT_SENTENCE}\n{self.instruction_text}" if self.style == "verl" else None

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        if self.style == "verl":
            return (f"Your task is to: {_task(observation, info)}.\n"
                    f"Your current observation is: {self._quoted(observation)}.\n{self._verl_actions(info)}")
        return f"Task: {_task(observation, info)}\n{self._compact_page(observation, info)}\n{self.instruction_text}"

    def next_message(self, observation: str, info: dict[str, Any]) -> str:
        if self.style == "verl":
            return f"Your current observation is: {self._quoted(observation)}.\n{self._verl_actions(info)}"
        return self._compact_page(observation, info)

    # -- per-step prompts ------------------------------------------------------------------------

    def step_messages(self, initial_observation: str, history: History, observation: str, info: dict[str, Any]) -> Messages:
        task = _task(initial_observation, info)
        if self.style == "verl":
            content = self._verl_step(task, history, observation, info)
        else:
            content = self._compact_step(task, history, observation, info)
        return [{"role": "user", "content": content}]

    def _verl_no_history(self, task: str, observation: str, info: dict[str, Any]) -> str:
        return (
            f"{EXPERT_SENTENCE}\nYour task is to: {task}.\nYour current observation is: {self._quoted(observation)}.\n"
            f"{self._verl_actions(info)}\n\nNow it's your turn to take one action for the current step.\n{self.instruction_text}"
        )

    def _verl_step(self, task: str, history: History, observation: str, info: dict[str, Any]) -> str:
        if not history or self.history_length == 0:
            return self._verl_no_history(task, observation, info)
        taken = len(history)
        shown = min(self.history_length, taken)
        lines = [
            f"[Observation {k + 1}: '{self._quoted(history[k][0])}', Action {k + 1}: '{history[k][1]}']"
            for k in range(taken - shown, taken)
        ]
        prompt = (
            f"{EXPERT_SENTENCE}\nYour task is to: {task}.\nPrior to this step, you have already taken {taken} step(s). "
            f"Below are the most recent {shown} observations and the corresponding actions you took: " + " ".join(lines)
            + f"\nYou are now at step {taken + 1} and your current observation is: {self._quoted(observation)}.\n"
            f"{self._verl_actions(info)}\n\nNow it's your turn to take one action for the current step.\n{self.instruction_text}"
        )
        return prompt if len(prompt) <= MAX_PROMPT_CHARS else self._verl_no_history(task, observation, info)

    def _compact_step(self, task: str, history: History, observation: str, info: dict[str, Any]) -> str:
        lines = [f"Task: {task}"]
        lines += [f"> {action}" for _, action in history[max(0, len(history) - self.history_length):]]
        lines += [self._compact_page(observation, info), self.instruction_text]
        return "\n".join(lines)

    @staticmethod
    def _quoted(observation: str) -> str:
        return SEP.join(f"'{part}'" for part in page_parts(observation))

    def _compact_page(self, observation: str, info: dict[str, Any]) -> str:
        admissible = list(info.get("admissible_actions") or [])
        numbers = self._result_numbers(info)
        shown: set[str] = set()
        text = ""
        for part in page_parts(observation):
            click = f"click[{part.lower()}]"
            if click in admissible and click not in shown:
                shown.add(click)
                # a result starts a line: its ASIN is the first part the item shows
                text += ("\n" if text and _ASIN.match(part) else " | " if text else "") + numbers.get(click, click)
            else:
                text += (" | " if text else "") + part
        rest = [action for action in admissible if action not in shown]
        return f"{text}\nActions: {', '.join(rest)}" if rest else text

    @staticmethod
    def _verl_actions(info: dict[str, Any]) -> str:
        actions = ",\n".join(f"'{a}'" for a in info.get("admissible_actions") or [])
        return f"Your admissible actions of the current situation are: \n[\n{actions}\n]."
