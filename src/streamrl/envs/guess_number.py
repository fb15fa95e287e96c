"""``guess_number``: a toy environment for fast rollout, mask and async tests.

The environment picks an integer from 1 to 100; each guess is answered with too low / too high /
correct. Binary search wins in at most 7 guesses, the default step cap. Reward is 1 on the
correct guess (``terminated``), 0 otherwise; the episode is ``truncated`` at ``max_steps``.

Invalid text (anything but one integer from 1 to 100) gets ``format_valid=False`` and
``action_effective=False`` from the environment itself, and leaves the game state (the known
bounds) unchanged; the step still counts toward ``max_steps``.

Task ids: ``train/<n>`` for any n >= 0 (unbounded) and ``test/<n>`` for n in 0..999. The secret is
a hash of the id, so ``reset(task_id=...)`` is deterministic; ``reset(seed=s)`` plays ``train/s``.

Tool form: ``guess(number: int)``.

Parser: the text inside the first ``<action>...</action>``, or else a reply that is just an integer.
Prompts are deliberately short (a tiny model plays this in tests).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from streamrl.envs.base import ActionParser, Env, EnvSpec, ParsedAction, PromptBuilder, Step
from streamrl.envs.common import tagged_text
from streamrl.envs.registry import register
from streamrl.envs.tools import tool

LOW, HIGH = 1, 100
TEST_TASKS = 1000
_INTEGER = re.compile(r"[+-]?\d+")
INVALID_FEEDBACK = f"Invalid guess. Reply with one integer from {LOW} to {HIGH}."
REPLY_FORMAT = "Reply with <action>N</action>."
TOOL_REPLY_FORMAT = "Call guess with your number."


def secret_for(task_id: str) -> int:
    digest = hashlib.sha256(f"guess_number/{task_id}".encode()).digest()
    return LOW + int.from_bytes(digest[:8], "big") % (HIGH - LOW + 1)


class GuessNumberEnv(Env):
    def __init__(self, max_steps: int = 7, seed: int | None = None):
        if max_steps < 1:
            raise ValueError(f"guess_number: max_steps must be >= 1, got {max_steps}")
        super().__init__(seed=seed)
        self.spec = EnvSpec(
            name="guess_number",
            max_steps=max_steps,
            splits={"train": None, "test": TEST_TASKS},
            eval_split="test",
        )

    def start(self, task_id: str) -> str:
        self._secret = secret_for(task_id)
        self._low, self._high = LOW, HIGH
        return f"Guess my number from {LOW} to {HIGH}. You have {self.spec.max_steps} guesses."

    def act(self, action: str) -> Step:
        text = action.strip()
        return self._guess(int(text) if _INTEGER.fullmatch(text) else None)

    @tool
    def guess(self, number: int) -> Step:
        """Guess the secret number.

        Args:
            number: an integer from 1 to 100
        """
        return self._guess(number)

    def describe(self) -> dict[str, Any]:
        # what a player can know: the interval the secret lies in
        return {"anchor": f"{self.task_id}|{self._low}-{self._high}"}

    def _guess(self, guess: int | None) -> Step:
        if guess is None or not LOW <= guess <= HIGH:
            return Step(INVALID_FEEDBACK, effective=False, valid=False)
        if guess == self._secret:
            return Step(f"{guess} is correct!", reward=1.0, done=True, won=True)
        if guess < self._secret:
            self._low = max(self._low, guess + 1)
            return Step(f"{guess} is too low.")
        self._high = min(self._high, guess - 1)
        return Step(f"{guess} is too high.")


class GuessNumberParser(ActionParser):
    """``<action>N</action>`` (first tag wins) or a reply that is only an integer."""

    def parse(self, text: str) -> ParsedAction:
        inner = tagged_text(text, "action")
        candidate = (inner if inner is not None else text).strip()
        if _INTEGER.fullmatch(candidate):
            return ParsedAction(candidate, True)
        reason = "no integer inside <action>...</action>" if inner is not None else "no <action> tag or bare integer"
        return ParsedAction(candidate[-30:], False, reason)


class GuessNumberPromptBuilder(PromptBuilder):
    """Short prompts. ``history_length`` (per-step layout) keeps the last k guesses; None = all.
    ``tools``: the tool form (ask for a ``guess`` call instead of an ``<action>`` tag)."""

    def __init__(self, history_length: int | None = None, tools: bool = False):
        if history_length is not None and history_length < 0:
            raise ValueError(f"history_length must be >= 0 or None, got {history_length}")
        self.history_length = history_length
        self.reply_format = TOOL_REPLY_FORMAT if tools else REPLY_FORMAT

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        return f"{observation} {self.reply_format}"

    def step_messages(self, initial_observation, history, observation, info) -> list[dict[str, str]]:
        lines = [initial_observation]
        # the feedback to guess k is the observation of step k + 1 (the current one for the last)
        results = [obs for obs, _ in history[1:]] + [observation]
        keep = len(history) if self.history_length is None else min(self.history_length, len(history))
        start = len(history) - keep
        lines += [f"Guess {history[i][1]}: {results[i]}" for i in range(start, len(history))]
        if history and not keep:
            lines.append(observation)
        lines.append(self.reply_format)
        return [{"role": "user", "content": "\n".join(lines)}]


register("guess_number", GuessNumberEnv, GuessNumberParser, GuessNumberPromptBuilder)
