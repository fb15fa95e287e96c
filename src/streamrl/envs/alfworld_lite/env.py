"""``AlfworldLiteEnv``: the embedded ALFWorld-style household simulator behind the ``Env`` contract."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

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
from streamrl.envs.base import Env, EnvSpec, Step
from streamrl.envs.tools import tool


def alfworld_spec(name: str, max_steps: int, splits: dict[str, int | None]) -> EnvSpec:
    """What the ALFWorld household environments (this one and ``alfworld_real``) say of themselves."""
    return EnvSpec(name=name, max_steps=max_steps, action_format="command", reward_range=(0.0, 1.0), splits=splits,
                   eval_split="unseen")

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

    Tool form: one ``execute(command)`` tool taking any command of the text form. One tool rather
    than one per verb: the agent reads the admissible commands as text each turn and copies one, as
    in the text form, and thirteen verb schemas would cost several hundred prompt tokens a turn.
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
        # GeneratorConfig checks that it is a (min, max) pair
        pair = cast("tuple[int, int]", tuple(distractors))
        self.config = GeneratorConfig(hidden_prob, pair, max_receptacles, types)
        self.grammar = grammar
        self.include_expert_plan = expert_plan
        super().__init__(seed=seed)
        self.spec = alfworld_spec("alfworld_lite", max_steps, dict(SPLITS))
        self._episode: Episode | None = None

    # -- the Env hooks ---------------------------------------------------------------------------

    def start(self, task_id: str) -> str:
        self._episode = generate(task_id, self.config, eval_config=self.eval_difficulty == "options")
        self._world = self._episode.world.copy()
        self._refresh_admissible()
        return text.initial_observation(self._world, self.task.goal)

    def act(self, action: str) -> Step:
        command = parse_command(action)
        if command is None or command not in self._admissible:
            return Step(text.NOTHING_HAPPENS, effective=False)
        observation = apply_command(self._world, command, self.grammar)
        self._refresh_admissible()
        won = self.task.satisfied(self._world)
        return Step(observation, reward=1.0 if won else 0.0, done=won, won=won)

    @tool
    def execute(self, command: str) -> Step:
        """Carry out one admissible command in the room.

        Args:
            command: one admissible command, e.g. "go to desk 1" or "take mug 1 from desk 1"
        """
        return self.act(command)

    def admissible_actions(self) -> list[str] | None:
        return list(self._admissible_text) if self._episode is not None else None

    def describe(self) -> dict[str, Any]:
        episode = self._episode
        if episode is None:
            raise RuntimeError("alfworld_lite: no task before reset()")
        info: dict[str, Any] = {
            "task_type": self.task.type.name,
            "anchor": f"{episode.task_id}|{self._world.digest()}",
            "admissible_commands": self.admissible_actions(),  # ALFWorld's name for the list
            "gamefile": episode.gamefile,
            "goal": self.task.goal,
        }
        if self.include_expert_plan:
            info["expert_plan"] = self.expert_plan()
            info["expert_privileged"] = True
        return info

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
