"""``AlfworldLiteEnv``: the embedded ALFWorld-style household simulator behind the ``Env`` contract."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from streamrl.envs.alfworld_lite import text
from streamrl.envs.alfworld_lite.catalog import TASK_TYPES, resolve_task_type
from streamrl.envs.alfworld_lite.expert import SearchingExpert, expert_plan
from streamrl.envs.alfworld_lite.generator import SPLITS, Episode, GeneratorConfig, generate
from streamrl.envs.alfworld_lite.rules import (
    GRAMMARS,
    Command,
    admissible_commands,
    apply_command,
    parse_command,
    render_command,
)
from streamrl.envs.alfworld_lite.task import Task
from streamrl.envs.alfworld_lite.world import World
from streamrl.envs.base import Env, EnvSpec, StepResult
from streamrl.envs.common import seeded_task_id


class AlfworldLiteEnv(Env):
    """An ALFWorld-compatible text household (see ``streamrl.envs.alfworld_lite``).

    Options: ``grammar`` ("v2" = alfworld >= 0.4, or "legacy" = ``put X in/on Y``, ``loc N``),
    ``max_steps`` (50), ``expert_plan`` (put the privileged expert's remaining plan in ``info``,
    as ALFWorld's train mode does; it adds roughly half to a step's cost), ``seed`` (for a
    ``reset()`` with neither seed nor task id), and the train-split difficulty knobs
    ``hidden_prob``, ``distractors``, ``max_receptacles`` and ``task_types`` (names or ALFWorld
    ids 1-6) of ``GeneratorConfig``.

    Task ids are ``train/<n>``, ``seen/<n>`` (n < 140) and ``unseen/<n>`` (n < 134). An eval id
    means the same task under any options; a train id means the same task under the same knobs.
    """

    def __init__(
        self,
        grammar: str = "v2",
        max_steps: int = 50,
        expert_plan: bool = True,
        seed: int | None = None,
        hidden_prob: float = 0.5,
        distractors: int | Sequence[int] = (5, 12),
        max_receptacles: int | None = None,
        task_types: Sequence[str | int] | None = None,
        eval_difficulty: str = "standard",
    ):
        if eval_difficulty not in ("standard", "options"):
            raise ValueError(f"alfworld_lite: eval_difficulty must be 'standard' or 'options', got {eval_difficulty!r}")
        #: "options": the seen/unseen sets are generated under this env's difficulty knobs too
        self.eval_difficulty = eval_difficulty
        if grammar not in GRAMMARS:
            raise ValueError(f"alfworld_lite: grammar must be one of {GRAMMARS}, got {grammar!r}")
        if max_steps < 1:
            raise ValueError(f"alfworld_lite: max_steps must be >= 1, got {max_steps}")
        if isinstance(distractors, int):
            distractors = (distractors, distractors)
        types = tuple(TASK_TYPES) if task_types is None else tuple(resolve_task_type(t).name for t in task_types)
        self.config = GeneratorConfig(hidden_prob, tuple(distractors), max_receptacles, types)
        self.grammar = grammar
        self.include_expert_plan = expert_plan
        self.spec = EnvSpec(
            name="alfworld_lite",
            max_steps=max_steps,
            action_format="command",
            reward_range=(0.0, 1.0),
            has_admissible_actions=True,
            splits=dict(SPLITS),
            eval_split="unseen",
        )
        self._rng = random.Random(seed)
        self._episode: Episode | None = None
        self._done = True

    # -- the Env contract ------------------------------------------------------------------------

    def reset(
        self,
        seed: int | None = None,
        task_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Start ``task_id``; else ``seed`` picks a task of ``options["split"]`` (default train)."""
        if task_id is None:
            task_id = seeded_task_id("alfworld_lite", SPLITS, seed, options or {}, self._rng)
        elif options:
            raise ValueError(f"alfworld_lite.reset: options {sorted(options)} are not used with a task_id")
        self._episode = generate(task_id, self.config, eval_config=self.eval_difficulty == "options")
        self._world = self._episode.world.copy()
        self._steps = 0
        self._done = False
        self._refresh_admissible()
        observation = text.initial_observation(self._world, self.task.goal)
        return observation, self._info(won=False, effective=True)

    def step(self, action: str) -> StepResult:
        self.check_step(action, started=self._episode is not None, done=self._done)
        self._steps += 1
        command = parse_command(action)
        effective = command is not None and command in self._admissible
        if effective:
            observation = apply_command(self._world, command, self.grammar)
            self._refresh_admissible()
        else:
            observation = text.NOTHING_HAPPENS
        won = effective and self.task.satisfied(self._world)
        truncated = not won and self._steps >= self.spec.max_steps
        self._done = won or truncated
        info = self._info(won=won, effective=effective)
        if won:
            info["reason"] = "won"
        elif truncated:
            info["reason"] = "max_steps"
        return StepResult(observation, 1.0 if won else 0.0, won, truncated, info)

    def admissible_actions(self) -> list[str] | None:
        return list(self._admissible_text) if self._episode is not None else None

    def close(self) -> None:
        self._done = True

    # -- extras ----------------------------------------------------------------------------------

    @property
    def task(self) -> Task:
        if self._episode is None:
            raise RuntimeError("alfworld_lite: no task before reset()")
        return self._episode.task

    @property
    def world(self) -> World:
        """The live world state (privileged; for experts, tests and tools, not for agents)."""
        if self._episode is None:
            raise RuntimeError("alfworld_lite: no world before reset()")
        return self._world

    def expert_plan(self) -> list[str]:
        """The privileged expert's plan from the current state ([] once the goal holds)."""
        return expert_plan(self.world, self.task, self.grammar)

    def expert_action(self) -> str | None:
        plan = self.expert_plan()
        return plan[0] if plan else None

    def searching_expert(self) -> Callable[[str, dict[str, Any]], str]:
        """A non-privileged demonstrator for the episode just reset: it learns the room from the
        first observation and searches, knowing only what it has observed (``act(observation, info)``)."""
        expert = SearchingExpert()
        started = False

        def act(observation: str, info: dict[str, Any]) -> str:
            nonlocal started
            if not started:
                expert.reset(observation)
                started = True
            return expert.act(observation, info.get("admissible_actions") or [])

        return act

    def state_hash(self) -> str:
        return self.world.digest()

    # -- internals -------------------------------------------------------------------------------

    def _refresh_admissible(self) -> None:
        commands = admissible_commands(self._world, self.grammar)
        self._admissible: set[Command] = set(commands)
        self._admissible_text = sorted(render_command(command, self.grammar) for command in commands)

    def _info(self, *, won: bool, effective: bool) -> dict[str, Any]:
        episode = self._episode
        actions = list(self._admissible_text)  # a copy: callers may edit it
        info: dict[str, Any] = {
            "won": won,
            "score": 1.0 if won else 0.0,
            "admissible_actions": actions,
            "format_valid": True,
            "action_effective": effective,
            "task_id": episode.task_id,
            "task_type": self.task.type.name,
            "step": self._steps,
            "anchor": f"{episode.task_id}|{self._world.digest()}",
            "admissible_commands": actions,  # ALFWorld's name for the same list
            "gamefile": episode.gamefile,
            "goal": self.task.goal,
        }
        if self.include_expert_plan:
            info["expert_plan"] = self.expert_plan()
            info["expert_privileged"] = True
        return info
