"""``guess_number``: a toy environment for fast rollout, mask and async tests.

The environment picks an integer from 1 to 100; each guess is answered with too low / too high /
correct. Binary search wins in at most 7 guesses, the default step cap. Reward is 1 on the
correct guess (``terminated``), 0 otherwise; the episode is ``truncated`` at ``max_steps``.

Invalid text (anything but one integer from 1 to 100) gets ``format_valid=False`` and
``action_effective=False`` from the environment itself, and leaves the game state (the known
bounds) unchanged; the step still counts toward ``max_steps``.

Task ids: ``train/<n>`` for any n >= 0 (unbounded) and ``test/<n>`` for n in 0..999. The secret is
a hash of the id, so ``reset(task_id=...)`` is deterministic; ``reset(seed=s)`` plays ``train/s``.

Parser: the text inside the first ``<action>...</action>``, or else a reply that is just an integer.
Prompts are deliberately short (a tiny model plays this in tests).
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from streamrl.envs.base import ActionParser, Env, EnvSpec, ParsedAction, PromptBuilder, StepResult
from streamrl.envs.common import tagged_text
from streamrl.envs.registry import register

LOW, HIGH = 1, 100
TEST_TASKS = 1000
_INTEGER = re.compile(r"[+-]?\d+")
INVALID_FEEDBACK = f"Invalid guess. Reply with one integer from {LOW} to {HIGH}."
REPLY_FORMAT = "Reply with <action>N</action>."


def parse_task_id(task_id: str) -> tuple[str, int]:
    """``"test/7"`` -> ``("test", 7)``; raises ValueError naming the problem."""
    split, _, index = task_id.partition("/")
    if split not in ("train", "test") or not index.isdigit():
        raise ValueError(f"guess_number: bad task_id {task_id!r} (expected 'train/<n>' or 'test/<n>')")
    if split == "test" and int(index) >= TEST_TASKS:
        raise ValueError(f"guess_number: task_id {task_id!r} out of range (test has {TEST_TASKS} tasks)")
    return split, int(index)


def secret_for(task_id: str) -> int:
    parse_task_id(task_id)
    digest = hashlib.sha256(f"guess_number/{task_id}".encode()).digest()
    return LOW + int.from_bytes(digest[:8], "big") % (HIGH - LOW + 1)


class GuessNumberEnv(Env):
    def __init__(self, max_steps: int = 7, seed: int | None = None):
        if max_steps < 1:
            raise ValueError(f"guess_number: max_steps must be >= 1, got {max_steps}")
        self.spec = EnvSpec(
            name="guess_number",
            max_steps=max_steps,
            splits={"train": None, "test": TEST_TASKS},
            eval_split="test",
        )
        self._rng = random.Random(seed)
        self._task_id: str | None = None
        self._done = True

    def reset(
        self,
        seed: int | None = None,
        task_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        if options:
            raise ValueError(f"guess_number.reset: unknown options {sorted(options)} (it takes none)")
        if task_id is None:
            if seed is not None and seed < 0:
                raise ValueError(f"guess_number.reset: seed must be >= 0, got {seed}")
            task_id = f"train/{seed if seed is not None else self._rng.randrange(2**31)}"
        self._secret = secret_for(task_id)
        self._task_id = task_id
        self._low, self._high = LOW, HIGH
        self._steps = 0
        self._done = False
        observation = f"Guess my number from {LOW} to {HIGH}. You have {self.spec.max_steps} guesses."
        return observation, self._info(won=False, valid=True, effective=True)

    def step(self, action: str) -> StepResult:
        self.check_step(action, started=self._task_id is not None, done=self._done)
        self._steps += 1
        text = action.strip()
        guess = int(text) if _INTEGER.fullmatch(text) else None
        valid = guess is not None and LOW <= guess <= HIGH
        won = valid and guess == self._secret
        if not valid:
            observation = INVALID_FEEDBACK
        elif won:
            observation = f"{guess} is correct!"
        elif guess < self._secret:
            observation = f"{guess} is too low."
            self._low = max(self._low, guess + 1)
        else:
            observation = f"{guess} is too high."
            self._high = min(self._high, guess - 1)
        truncated = not won and self._steps >= self.spec.max_steps
        self._done = won or truncated
        info = self._info(won=won, valid=valid, effective=valid)
        if won:
            info["reason"] = "won"
        elif truncated:
            info["reason"] = "max_steps"
        return StepResult(observation, 1.0 if won else 0.0, won, truncated, info)

    def _info(self, *, won: bool, valid: bool, effective: bool) -> dict[str, Any]:
        return {
            "won": won,
            "score": 1.0 if won else 0.0,
            "admissible_actions": None,
            "format_valid": valid,
            "action_effective": effective,
            "task_id": self._task_id,
            "task_type": "guess_number",
            "step": self._steps,
            # what a player can know: the interval the secret lies in
            "anchor": f"{self._task_id}|{self._low}-{self._high}",
        }

    def close(self) -> None:
        self._done = True


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
    """Short prompts. ``history_length`` (per-step layout) keeps the last k guesses; None = all."""

    def __init__(self, history_length: int | None = None):
        if history_length is not None and history_length < 0:
            raise ValueError(f"history_length must be >= 0 or None, got {history_length}")
        self.history_length = history_length

    def system_prompt(self) -> str | None:
        return None

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        return f"{observation} {REPLY_FORMAT}"

    def next_message(self, observation: str, info: dict[str, Any]) -> str:
        return observation

    def step_messages(
        self,
        initial_observation: str,
        history: list[tuple[str, str]],
        observation: str,
        info: dict[str, Any],
    ) -> list[dict[str, str]]:
        lines = [initial_observation]
        # the feedback to guess k is the observation of step k + 1 (the current one for the last)
        results = [obs for obs, _ in history[1:]] + [observation]
        keep = len(history) if self.history_length is None else min(self.history_length, len(history))
        start = len(history) - keep
        lines += [f"Guess {history[i][1]}: {results[i]}" for i in range(start, len(history))]
        if history and not keep:
            lines.append(observation)
        lines.append(REPLY_FORMAT)
        return [{"role": "user", "content": "\n".join(lines)}]


register("guess_number", GuessNumberEnv, GuessNumberParser, GuessNumberPromptBuilder)
