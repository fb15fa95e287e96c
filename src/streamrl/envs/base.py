"""The environment contract: one small interface, three separate roles.

* ``Env`` receives an action and returns raw environment text. Its text form takes an already-parsed
  action string; its tool form (``tools.py``) takes the model's ``AssistantMessage`` and answers each
  tool call with a ``tool`` message.
* ``ActionParser`` turns model text into an action plus ``format_valid`` (text form).
* ``PromptBuilder`` turns an episode's observations into the user messages the model sees.

An environment writes three hooks, ``start(task_id)``, ``act(action)`` and its ``@tool`` methods; the
base class owns the bookkeeping every environment shares: task ids and the seed-to-task policy, the
step count, the step cap, why an episode ended, and the standard ``info`` dict. One environment then
serves both training layouts (per-step prompts with the last k steps, or a growing full-history
transcript) and both action forms. Environments are pure Python: no torch, no I/O beyond their own.
"""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streamrl.envs.tools import AssistantMessage, Problem, Toolbox

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

ActionFormat = Literal["command", "code"]
#: earlier (observation, action) pairs of an episode, oldest first
History = list[tuple[str, str]]
#: chat messages (``role``, ``content``)
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class EnvSpec:
    """Static facts about an environment that trainers and rollout code need."""

    name: str
    max_steps: int
    action_format: ActionFormat = "command"
    reward_range: tuple[float, float] = (0.0, 1.0)
    #: split names -> number of tasks (None = unbounded, e.g. a seeded generator)
    splits: dict[str, int | None] = field(default_factory=dict)
    #: the held-out split evaluations use by default
    eval_split: str = "test"
    #: strings that actions copy verbatim from observations (webshop_lite: every product's ASIN, as
    #: written in ``click[...]``); a tokenizer trained from scratch can make each one a single token
    entity_tokens: tuple[str, ...] = ()
    #: tool form: calls run per turn; the ones beyond are answered "not run" and the turn is invalid
    max_tool_calls_per_turn: int = 1
    #: the system prompt of the default prompt builder (``ChatPromptBuilder``)
    instructions: str | None = None


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
    #: tool form: the messages that answer the turn (one ``tool`` message per call, or a ``user``
    #: message); ``observation`` is then their text, joined
    messages: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Step:
    """What an environment's ``act``, ``reply`` or tool returns about one action (a bare string is
    ``Step(observation)``: the episode goes on, no reward, the action worked)."""

    observation: str
    reward: float = 0.0
    #: the episode reached success or failure (``terminated``)
    done: bool = False
    #: the environment's own cap ended the episode (tool calls, budget); the step cap is the base's
    truncated: bool = False
    won: bool = False
    #: the raw score reported in ``info`` (default: 1.0 if won else 0.0)
    score: float | None = None
    #: False for a no-op ("Nothing happens.")
    effective: bool = True
    #: False when the action could not be read
    valid: bool = True
    #: why the episode ended (default: "won" or "lost"; "max_steps" at the step cap)
    reason: str | None = None
    #: environment-specific info keys for this step
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedAction:
    """What an ``ActionParser`` extracts from one model turn."""

    #: the text form's action string, or the tool form's ``AssistantMessage``
    action: str | AssistantMessage
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

    def system_prompt(self) -> str | None:
        """The transcript's system message; None (the default): none."""
        return None

    @abstractmethod
    def first_message(self, observation: str, info: dict[str, Any]) -> str: ...

    def next_message(self, observation: str, info: dict[str, Any]) -> str:
        """A later observation as the transcript gets it; the default: as it is."""
        return observation

    @abstractmethod
    def step_messages(self, initial_observation: str, history: History, observation: str, info: dict[str, Any]) -> Messages:
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
    """A single-episode environment. ``reset`` must be called before ``step``.

    Write ``start`` and ``act`` (and ``@tool`` methods for the tool form); optionally ``describe``
    (extra ``info`` keys), ``admissible_actions``, ``reply`` and ``close``. Call
    ``super().__init__(seed=...)`` from your own ``__init__``. Task ids are ``"<split>/<n>"`` over
    ``spec.splits``; an environment with other ids overrides ``task_ids`` and ``check_task_id``.
    For full control an environment may instead override ``reset`` and ``step`` themselves.
    """

    spec: EnvSpec

    def __init__(self, *, seed: int | None = None):
        #: draws the task of a ``reset()`` given neither a seed nor a task id
        self._draws = random.Random(seed)
        self.task_id: str | None = None
        #: steps taken in the current episode
        self.steps = 0
        self._done = True

    # -- what an environment writes ----------------------------------------------------------------

    def start(self, task_id: str) -> str:
        """Begin ``task_id`` (already checked by ``check_task_id``); return the first observation."""
        raise NotImplementedError(f"{type(self).__name__} must define start(task_id)")

    def act(self, action: str) -> Step | str:
        """Carry out one text action (the text form)."""
        raise NotImplementedError(
            f"{self.spec.name} has no text form (no act()); play it with its tools (env.tools=true)"
        )

    def reply(self, text: str) -> Step | str | None:
        """Tool form: a turn without a tool call. None (the default) means such a turn is not an
        action here: the agent is told to call a tool and the turn is format-invalid."""
        return None

    def describe(self) -> dict[str, Any]:
        """Environment-specific ``info`` keys after reset and every step (``task_type`` among them
        overrides the default, the environment's name)."""
        return {}

    def admissible_actions(self) -> list[str] | None:
        return None

    def close(self) -> None:  # idempotent
        self._done = True

    # -- the contract the rollout uses ---------------------------------------------------------------

    def reset(
        self,
        seed: int | None = None,
        task_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Start ``task_id``; else ``seed`` picks a task of ``options["split"]`` (default train):
        task ``seed mod size`` (an unbounded split takes ``seed`` itself); no seed draws one."""
        if not hasattr(self, "_draws"):
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__()")
        if task_id is None:
            task_id = self.seeded_task_id(seed, options or {})
        elif options:
            raise ValueError(f"{self.spec.name}.reset: options {sorted(options)} are not used with a task_id")
        else:
            self.check_task_id(task_id)
        observation = self.start(task_id)
        self.task_id, self.steps, self._done = task_id, 0, False
        return observation, self._info(Step(observation))

    def step(self, action: str | AssistantMessage) -> StepResult:
        """One action: a string (text form) or the model's ``AssistantMessage`` (tool form)."""
        name = self.spec.name
        if not isinstance(action, (str, AssistantMessage)):
            raise TypeError(f"{name}.step: action must be a str or an AssistantMessage, got {type(action).__name__}")
        if self.task_id is None:
            raise RuntimeError(f"{name}: call reset() before step()")
        if self._done:
            raise RuntimeError(f"{name}: the episode is over; call reset()")
        self.steps += 1
        messages = None
        if isinstance(action, AssistantMessage):
            outcome, messages, problem = self._run_tools(action)
        else:
            outcome, problem = _as_step(self.act(action)), None
        terminated = outcome.done
        truncated = not terminated and (outcome.truncated or self.steps >= self.spec.max_steps)
        self._done = terminated or truncated
        info = self._info(outcome, problem)
        if terminated:
            info["reason"] = outcome.reason or ("won" if outcome.won else "lost")
        elif truncated:
            info["reason"] = outcome.reason if outcome.truncated and outcome.reason else "max_steps"
        return StepResult(outcome.observation, float(outcome.reward), terminated, truncated, info, messages)

    def tools(self) -> list[dict[str, Any]]:
        """The OpenAI function schemas of this environment's ``@tool`` methods ([] without tools)."""
        return self._toolbox().schemas

    def tool_call_for(self, action: str) -> tuple[str, dict[str, Any]] | None:
        """A text-form ``action`` (a demonstrator's) written as a tool call ``(name, arguments)``, or
        None to write it as plain text. Default: the one tool's one parameter takes the action."""
        box = self._toolbox()
        if len(box.functions) == 1:
            parameters = box.schemas[0]["function"]["parameters"].get("properties", {})
            if len(parameters) == 1:
                return box.names[0], {next(iter(parameters)): action}
        raise NotImplementedError(
            f"{self.spec.name}: write tool_call_for(action) to say how a demonstrated action is called with its tools"
        )

    def task_ids(self, split: str, limit: int | None = None) -> list[str]:
        """Deterministic task ids of ``split``, ``"<split>/<i>"`` for ``i`` below the split's size in
        ``spec.splits`` (an unbounded split, size None, needs ``limit``); at most ``limit`` of them."""
        size = self.split_size(split)
        if size is None:
            if limit is None:
                raise ValueError(f"{self.spec.name}: split {split!r} is unbounded; pass a limit")
            count = limit
        else:
            count = size if limit is None else min(size, limit)
        return [f"{split}/{i}" for i in range(count)]

    def check_task_id(self, task_id: str) -> tuple[str, int]:
        """``"test/7"`` -> ``("test", 7)``; a ``ValueError`` naming the problem otherwise."""
        split, _, index = task_id.partition("/") if isinstance(task_id, str) else ("", "", "")
        splits = self.spec.splits
        if split not in splits or not index.isdigit():
            raise ValueError(
                f"{self.spec.name}: bad task_id {task_id!r} (expected '<split>/<n>', splits: {', '.join(splits)})"
            )
        size = self.split_size(split)
        if size is not None and int(index) >= size:
            raise ValueError(f"{self.spec.name}: task_id {task_id!r} out of range ({split} has {size} tasks)")
        return split, int(index)

    def seeded_task_id(self, seed: int | None, options: dict[str, Any]) -> str:
        """The task a ``reset(seed=..., options={"split": ...})`` without a task id plays."""
        name = self.spec.name
        unknown = set(options) - {"split"}
        if unknown:
            raise ValueError(f"{name}.reset: unknown options {sorted(unknown)} (supported: 'split')")
        split = options.get("split", "train" if "train" in self.spec.splits else next(iter(self.spec.splits)))
        size = self.split_size(split)
        if seed is None:
            seed = self._draws.randrange(2**31)
        elif isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"{name}.reset: seed must be a non-negative int, got {seed!r}")
        return f"{split}/{seed if size is None else seed % size}"

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def split_size(self, split: str) -> int | None:
        """How many tasks ``split`` holds (None: unbounded); a ``ValueError`` for an unknown split."""
        if split not in self.spec.splits:
            raise ValueError(f"{self.spec.name}: unknown split {split!r} (known: {', '.join(self.spec.splits)})")
        return self.spec.splits[split]

    # -- internals ---------------------------------------------------------------------------------

    def _toolbox(self) -> Toolbox:
        box = self.__dict__.get("_tools")
        if box is None:
            box = self.__dict__["_tools"] = Toolbox.of(self)
        return box

    def _run_tools(self, message: AssistantMessage) -> tuple[Step, list[dict[str, Any]], Problem | None]:
        """Run the calls of ``message`` in order; every call is answered by a ``tool`` message."""
        box = self._toolbox()
        if not box.functions:
            raise TypeError(f"{self.spec.name} has no tools; its actions are text (env.tools=false)")
        if not message.tool_calls:
            answer = self.reply(message.content)
            if answer is None:
                missing = Problem("no_tool_call", f"no tool call; call one of the tools: {', '.join(box.names)}")
                step = Step(missing.message, effective=False, valid=False)
                return step, [{"role": "user", "content": step.observation}], missing
            step = _as_step(answer)
            return step, [{"role": "user", "content": step.observation}], None
        limit = self.spec.max_tool_calls_per_turn
        results: list[Step] = []
        messages: list[dict[str, Any]] = []
        first_problem: Problem | None = None
        for index, call in enumerate(message.tool_calls):
            problem = box.problem(call)
            if problem is None and index >= limit:
                problem = Problem("too_many_calls", f"not run: at most {limit} tool call(s) per turn")
            if problem is None and any(r.done or r.truncated for r in results):
                result = Step("not run: the episode already ended", effective=False)
            elif problem is not None:
                first_problem = first_problem or problem
                result = Step(f"Error: {problem.message}", effective=False, valid=False)
            else:
                assert call.name is not None  # no problem: a decoded call of a known tool
                result = self._call_tool(box, call.name, call.arguments or {})
            results.append(result)
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name or "", "content": result.observation})
        return _combined(results), messages, first_problem

    @staticmethod
    def _call_tool(box: Toolbox, name: str, arguments: dict[str, Any]) -> Step:
        try:
            return _as_step(box.functions[name](**arguments))
        except Exception as error:  # a tool's failure is the agent's observation, never a crash
            return Step(f"Error: {name} raised {type(error).__name__}: {error}", effective=False)

    def _info(self, step: Step, problem: Problem | None = None) -> dict[str, Any]:
        info: dict[str, Any] = {
            "won": bool(step.won),
            "score": float(step.score) if step.score is not None else (1.0 if step.won else 0.0),
            "admissible_actions": self.admissible_actions(),
            "format_valid": bool(step.valid),
            "action_effective": bool(step.effective),
            "task_id": self.task_id,
            "task_type": self.spec.name,
            "step": self.steps,
        }
        info.update(self.describe())
        info.update(step.info)
        if problem is not None:
            info["format_problem"], info["format_reason"] = problem.kind, problem.message
        return info


def _as_step(answer: Step | str) -> Step:
    if isinstance(answer, Step):
        return answer
    if isinstance(answer, str):
        return Step(answer)
    raise TypeError(f"an environment action must return a str or a Step, got {type(answer).__name__}")


def _combined(results: list[Step]) -> Step:
    """One step from the results of a turn's calls: rewards add up, the last ending call decides how
    the episode ends, and the turn is valid and effective only when every call was."""
    ending = next((r for r in reversed(results) if r.done or r.truncated), None)
    scores = [r.score for r in results if r.score is not None]
    info: dict[str, Any] = {}
    for result in results:
        info.update(result.info)
    return Step(
        "\n".join(r.observation for r in results),
        reward=sum(r.reward for r in results),
        done=ending is not None and ending.done,
        truncated=ending is not None and ending.truncated,
        won=ending is not None and ending.won,
        score=scores[-1] if scores else None,
        effective=all(r.effective for r in results),
        valid=all(r.valid for r in results),
        reason=ending.reason if ending is not None else None,
        info=info,
    )


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

    async def step(self, action: str | AssistantMessage) -> StepResult:
        return await self._call(self.env.step, action)

    def tools(self) -> list[dict[str, Any]]:
        """The environment's tool schemas (built once, in the caller's thread)."""
        return self.env.tools()

    async def close(self) -> None:
        await self._call(self.env.close)
