"""``alfworld_real``: the real ALFWorld (TextWorld side) behind the ``Env`` contract.

Needs the optional ``alfworld`` package (``pip install streamrl[alfworld]``) and the games that
``alfworld-download`` puts in ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``): nothing is
downloaded here. Task ids are ``train/<n>``, ``seen/<n>`` (valid_seen, 140 games) and
``unseen/<n>`` (valid_unseen, 134 games), indexing the split's game files in sorted path order.

Each reset registers the chosen game alone with ``AlfredTWEnv.init_env(batch_size=1)`` (so a
task id always means the same game) and maps the batch-of-one results into ``StepResult``:
``obs[0]``, ``infos["won"][0]``, ``infos["admissible_commands"][0]``. It uses the same prompt
builder and parser as ``alfworld_lite``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from streamrl.envs.alfworld_lite.env import AlfworldLiteEnv, alfworld_spec
from streamrl.envs.alfworld_lite.prompts import AlfworldPromptBuilder, alfworld_action_parser
from streamrl.envs.base import Env, Step
from streamrl.envs.registry import register

#: our split names -> AlfredTWEnv's ``train_eval`` values and data folders
SPLITS = {
    "train": ("train", "train"),
    "seen": ("eval_in_distribution", "valid_seen"),
    "unseen": ("eval_out_of_distribution", "valid_unseen"),
}
#: game counts reported by ALFWorld (the actual lists come from the data on disk)
NOMINAL_SIZES = {"train": 3553, "seen": 140, "unseen": 134}
TASK_TYPE_NAMES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
INSTALL_HINT = "pip install streamrl[alfworld]"


class AlfworldUnavailableError(ImportError):
    """The optional ``alfworld`` package is not installed."""


def _import_alfred_tw_env() -> Any:
    try:
        from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv
    except ImportError as error:
        raise AlfworldUnavailableError(
            f"alfworld_real needs the optional 'alfworld' package ({error}); install it with "
            f"`{INSTALL_HINT}` and fetch the games with `alfworld-download` (into $ALFWORLD_DATA)"
        ) from error
    return AlfredTWEnv


def data_root(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """``data_dir``, else ``$ALFWORLD_DATA``, else ``~/.cache/alfworld`` (alfworld's default)."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    return Path(os.environ.get("ALFWORLD_DATA") or "~/.cache/alfworld").expanduser()


def has_games(root: Path) -> bool:
    """Whether ``root/json_2.1.1`` holds at least one ``game.tw-pddl``."""
    games = root / "json_2.1.1"
    if not games.is_dir():
        return False
    return any("game.tw-pddl" in files for _, _, files in os.walk(games))


def _config(root: Path, max_steps: int) -> dict[str, Any]:
    """The parts of alfworld's ``base_config.yaml`` that ``AlfredTWEnv`` reads for text games."""
    games = root / "json_2.1.1"
    return {
        "dataset": {
            "data_path": str(games / "train"),
            "eval_id_data_path": str(games / "valid_seen"),
            "eval_ood_data_path": str(games / "valid_unseen"),
            "num_train_games": -1,
            "num_eval_games": -1,
        },
        "logic": {"domain": str(root / "logic" / "alfred.pddl"), "grammar": str(root / "logic" / "alfred.twl2")},
        "env": {
            "type": "AlfredTWEnv",
            "regen_game_files": False,
            "domain_randomization": False,
            "task_types": [1, 2, 3, 4, 5, 6],
            "expert_timeout_steps": 150,
            "expert_type": "handcoded",
            "goal_desc_human_anns_prob": 0.0,
        },
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": max_steps}},
        "rl": {"training": {"max_nb_steps_per_episode": max_steps}},
    }


def task_type_of(gamefile: str) -> str:
    """The task type from an ALFWorld game path (``.../pick_heat_then_place_in_recep-Apple-...``)."""
    for part in reversed(Path(gamefile).parts):
        name = part.split("-", 1)[0]
        if name in TASK_TYPE_NAMES:
            return name
    return "unknown"


class AlfworldRealEnv(Env):
    """Real ALFWorld games, one at a time (batch size 1)."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, max_steps: int = 50, seed: int | None = None):
        if max_steps < 1:
            raise ValueError(f"alfworld_real: max_steps must be >= 1, got {max_steps}")
        self._alfred_tw_env = _import_alfred_tw_env()
        self.root = data_root(data_dir)
        if not has_games(self.root):
            raise FileNotFoundError(
                f"alfworld_real: no ALFWorld games under {self.root / 'json_2.1.1'}; set ALFWORLD_DATA "
                f"to the folder `alfworld-download` filled (it holds json_2.1.1/ and logic/)"
            )
        super().__init__(seed=seed)
        self.spec = alfworld_spec("alfworld_real", max_steps, dict(NOMINAL_SIZES))
        self._config = _config(self.root, max_steps)
        self._games: dict[str, list[str]] = {}
        self._collectors: dict[str, Any] = {}  # split -> AlfredTWEnv (it scans the data once)
        self._game_env: Any = None

    def games(self, split: str) -> list[str]:
        """The split's solvable game files, as ``AlfredTWEnv`` selects them, in sorted order."""
        if split not in SPLITS:
            raise ValueError(f"alfworld_real: unknown split {split!r} (known: {', '.join(SPLITS)})")
        if split not in self._games:
            self._collectors[split] = self._alfred_tw_env(self._config, train_eval=SPLITS[split][0])
            self._games[split] = sorted(self._collectors[split].game_files)
        return self._games[split]

    def split_size(self, split: str) -> int | None:
        return len(self.games(split))

    def start(self, task_id: str) -> str:
        split, index = self.check_task_id(task_id)
        self._close_game()
        collector = self._collectors[split]
        collector.game_files = [self.games(split)[index]]  # register this game alone
        collector.num_games = 1
        self._game_env = collector.init_env(batch_size=1)
        observations, infos = self._game_env.reset()
        self._gamefile = self.games(split)[index]
        self._observe(observations[0], infos)
        return observations[0]

    def act(self, action: str) -> Step:
        observations, _scores, dones, infos = self._game_env.step([action])
        observation = observations[0]
        self._observe(observation, infos)
        won = bool(infos["won"][0])
        # TextWorld has no losing state, but report one if its game ever says done without a win
        # (before the step cap, which TextWorld also reports as done)
        done = won or (bool(dones[0]) and self.steps < self.spec.max_steps)
        return Step(observation, reward=1.0 if won else 0.0, done=done, won=won,
                    effective=observation.strip() != "Nothing happens.", reason=None if won or not done else "done")

    execute = AlfworldLiteEnv.execute  # the same tool form: execute(command)

    def admissible_actions(self) -> list[str] | None:
        return list(self._admissible) if self._game_env is not None else None

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "task_type": task_type_of(self._gamefile),
            "anchor": f"{self.task_id}|{self._observation}",  # the raw observation, as verl-agent's GiGPO
            "admissible_commands": self.admissible_actions(),
            "gamefile": self._gamefile,
        }
        if self._expert_plan is not None:
            info["expert_plan"] = list(self._expert_plan)
            info["expert_privileged"] = True
        return info

    def close(self) -> None:
        self._close_game()
        super().close()

    def _observe(self, observation: str, infos: dict[str, Any]) -> None:
        self._observation = observation
        self._admissible = list(infos["admissible_commands"][0])
        self._expert_plan = infos["extra.expert_plan"][0] if "extra.expert_plan" in infos else None

    def _close_game(self) -> None:
        if self._game_env is not None:
            self._game_env.close()
            self._game_env = None


register("alfworld_real", AlfworldRealEnv, alfworld_action_parser, AlfworldPromptBuilder)
