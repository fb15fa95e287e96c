"""The parser and prompt builder an environment gets when it names none of its own.

``ReplyParser`` takes the model's whole reply as the action. ``ChatPromptBuilder`` shows the
environment's ``spec.instructions`` as the system prompt and its observations as they are: the first
observation opens the chat, later ones follow as user (text form) or tool (tool form) messages, and
the per-step layout shows the first observation, the last ``history_length`` steps and the current one.
"""

from __future__ import annotations

from typing import Any

from streamrl.envs.base import ActionParser, ParsedAction, PromptBuilder


class ReplyParser(ActionParser):
    """The reply, stripped, is the action; an empty reply is format-invalid."""

    def parse(self, text: str) -> ParsedAction:
        action = text.strip()
        return ParsedAction(action, bool(action), None if action else "empty reply")


class ChatPromptBuilder(PromptBuilder):
    def __init__(self, instructions: str | None = None, history_length: int = 2):
        if history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {history_length}")
        self.instructions = instructions
        self.history_length = history_length

    def system_prompt(self) -> str | None:
        return self.instructions

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        return observation

    def step_messages(self, initial_observation, history, observation, info) -> list[dict[str, str]]:
        lines = [initial_observation]
        results = [obs for obs, _ in history[1:]] + [observation]  # what each action led to
        for k in range(max(0, len(history) - self.history_length), len(history)):
            lines += [f"> {history[k][1]}", results[k]]
        if history and not self.history_length:
            lines.append(observation)
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return [*system, {"role": "user", "content": "\n".join(lines)}]
