"""The environment contract: one small interface, three separate roles.

* ``Env`` receives an already-parsed action string and returns raw environment text.
* ``ActionParser`` turns model text into an action plus ``format_valid``.
* ``PromptBuilder`` turns an episode's observations into the user messages the model sees.

One environment then serves both training layouts (per-step prompts with the last k steps, or a
growing full-history transcript). Environments are pure Python: no torch, no I/O beyond their own.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

#: ``info`` keys every environment fills on reset and on every step.
STANDARD_INFO_KEYS = (
    "won",  # bool: the task is solved
    "score",  # float: the raw environment score (success 0/1, WebShop score, ...)
    "admissible_actions",  # list[str] | None
    "format_valid",  # bool: set by the parser; environments default it to True
    "action_effective",  # bool: False for "Nothing happens." or another no-op
    "task_id",  # str
    "task_type",  # str
    "step",  # int: number of steps taken so far
)

ActionFormat = Literal["command", "tool_call", "code"]


@dataclass(frozen=True)
class EnvSpec:
    """Static facts about an environment that trainers and rollout code need."""

    name: str
    max_steps: int
    action_format: ActionFormat = "command"
    reward_range: tuple[float, float] = (0.0, 1.0)
    has_admissible_actions: bool = False
    #: split names -> number of tasks (None = unbounded, e.g. a seeded generator)
    splits: dict[str, int | None] = field(default_factory=dict)
    #: the held-out split evaluations use by default
    eval_split: str = "test"
    #: strings that actions copy verbatim from observations (webshop_lite: every product's ASIN, as
    #: written in ``click[...]``); a tokenizer trained from scratch can make each one a single token
    entity_tokens: tuple[str, ...] = ()


@dataclass
class StepResult:
    """Gymnasium semantics: ``terminated`` = success or failure, ``truncated`` = a cap was hit.

    The two are never both true; ``info["reason"]`` says why an episode ended.
    """

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


@dataclass(frozen=True)
class ParsedAction:
    """What an ``ActionParser`` extracts from one model turn."""

    action: str
    format_valid: bool
    reason: str | None = None  # why the format is invalid, for logs


class ActionParser(ABC):
    """Model text -> action for ``Env.step``. Never raises on malformed text."""

    @abstractmethod
    def parse(self, text: str) -> ParsedAction: ...


class PromptBuilder(ABC):
    """Renders what the model sees. Two layouts share one builder.

    * per-step (verl-agent style): ``step_messages`` gives the whole chat for one turn, with the
      task, the last k steps of history and the current observation.
    * full history: ``system_prompt`` + ``first_message`` open the transcript; each later
      observation is appended as ``next_message`` (tokenised alone and appended, never re-templated).
    """

    @abstractmethod
    def system_prompt(self) -> str | None: ...

    @abstractmethod
    def first_message(self, observation: str, info: dict[str, Any]) -> str: ...

    @abstractmethod
    def next_message(self, observation: str, info: dict[str, Any]) -> str: ...

    @abstractmethod
    def step_messages(
        self,
        initial_observation: str,
        history: list[tuple[str, str]],
        observation: str,
        info: dict[str, Any],
    ) -> list[dict[str, str]]:
        """Chat messages for one per-step sample.

        ``history`` holds (observation, action) pairs of all earlier steps, oldest first; the
        builder keeps the last k it was configured with.
        """

    def shown_action(self, action: str, observation: str, info: dict[str, Any]) -> str:
        """``action`` written the way this prompt shows it on the page (``observation``, ``info``):
        a demonstration's action is written so. The same string unless the builder renames what the
        page offers (e.g. numbered results); the environment accepts either."""
        return action


class Env(ABC):
    """A single-episode environment. ``reset`` must be called before ``step``."""

    spec: EnvSpec

    @abstractmethod
    def reset(
        self,
        seed: int | None = None,
        task_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]: ...

    @abstractmethod
    def step(self, action: str) -> StepResult: ...

    def task_ids(self, split: str, limit: int | None = None) -> list[str]:
        """Deterministic task ids of ``split``, ``"<split>/<i>"`` for ``i`` below the split's size in
        ``spec.splits`` (an unbounded split, size None, needs ``limit``); at most ``limit`` of them."""
        name, splits = self.spec.name, self.spec.splits
        if split not in splits:
            raise ValueError(f"{name}: unknown split {split!r} (known: {', '.join(splits)})")
        size = splits[split]
        if size is None and limit is None:
            raise ValueError(f"{name}: split {split!r} is unbounded; pass a limit")
        count = size if limit is None else limit if size is None else min(size, limit)
        return [f"{split}/{i}" for i in range(count)]

    def admissible_actions(self) -> list[str] | None:
        return None

    def check_step(self, action: object, *, started: bool, done: bool) -> None:
        """The preconditions every ``step`` shares, with errors naming the environment."""
        name = self.spec.name
        if not isinstance(action, str):
            raise TypeError(f"{name}.step: action must be a str, got {type(action).__name__}")
        if not started:
            raise RuntimeError(f"{name}: call reset() before step()")
        if done:
            raise RuntimeError(f"{name}: the episode is over; call reset()")

    def close(self) -> None:  # idempotent
        return None

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEnv:
    """Runs a synchronous ``Env`` off the event loop, so many episodes can step concurrently."""

    def __init__(self, env: Env, executor: Any = None):
        self.env = env
        self.spec = env.spec
        self._executor = executor

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def reset(
        self,
        seed: int | None = None,
        task_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        return await self._call(self.env.reset, seed=seed, task_id=task_id, options=options)

    async def step(self, action: str) -> StepResult:
        return await self._call(self.env.step, action)

    async def close(self) -> None:
        await self._call(self.env.close)
