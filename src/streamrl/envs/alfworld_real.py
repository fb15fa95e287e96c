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
import random
from pathlib import Path
from typing import Any

from streamrl.envs.alfworld_lite.prompts import AlfworldPromptBuilder, alfworld_action_parser
from streamrl.envs.base import Env, EnvSpec, StepResult
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
        self.spec = EnvSpec(
            name="alfworld_real",
            max_steps=max_steps,
            action_format="command",
            reward_range=(0.0, 1.0),
            has_admissible_actions=True,
            splits=dict(NOMINAL_SIZES),
            eval_split="unseen",
        )
        self._config = _config(self.root, max_steps)
        self._rng = random.Random(seed)
        self._games: dict[str, list[str]] = {}
        self._collectors: dict[str, Any] = {}  # split -> AlfredTWEnv (it scans the data once)
        self._game_env: Any = None
        self._done = True
        self._task_id: str | None = None

    def games(self, split: str) -> list[str]:
        """The split's solvable game files, as ``AlfredTWEnv`` selects them, in sorted order."""
        if split not in SPLITS:
            raise ValueError(f"alfworld_real: unknown split {split!r} (known: {', '.join(SPLITS)})")
        if split not in self._games:
            self._collectors[split] = self._alfred_tw_env(self._config, train_eval=SPLITS[split][0])
            self._games[split] = sorted(self._collectors[split].game_files)
        return self._games[split]

    def task_ids(self, split: str, limit: int | None = None) -> list[str]:
        count = len(self.games(split))
        return [f"{split}/{i}" for i in range(count if limit is None else min(count, limit))]

    def reset(
        self,
        seed: int | None = None,
        task_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        if options:
            raise ValueError(f"alfworld_real.reset: unknown options {sorted(options)} (it takes none)")
        if task_id is None:
            games = self.games("train")
            index = (seed if seed is not None else self._rng.randrange(2**31)) % len(games)
            task_id = f"train/{index}"
        split, _, index_text = task_id.partition("/")
        games = self.games(split)
        if not index_text.isdigit() or int(index_text) >= len(games):
            raise ValueError(f"alfworld_real: bad task_id {task_id!r} (split {split!r} has {len(games)} games)")
        self._close_game()
        collector = self._collectors[split]
        collector.game_files = [games[int(index_text)]]  # register this game alone
        collector.num_games = 1
        self._game_env = collector.init_env(batch_size=1)
        observations, infos = self._game_env.reset()
        self._task_id, self._gamefile = task_id, games[int(index_text)]
        self._steps, self._done = 0, False
        return observations[0], self._info(observations[0], infos, effective=True)

    def step(self, action: str) -> StepResult:
        self.check_step(action, started=self._game_env is not None, done=self._done)
        observations, _scores, dones, infos = self._game_env.step([action])
        self._steps += 1
        observation = observations[0]
        info = self._info(observation, infos, effective=observation.strip() != "Nothing happens.")
        won = info["won"]
        truncated = not won and self._steps >= self.spec.max_steps
        # TextWorld has no losing state, but report one if its game ever says done without a win
        terminated = won or (bool(dones[0]) and not truncated)
        self._done = terminated or truncated
        if won:
            info["reason"] = "won"
        elif truncated:
            info["reason"] = "max_steps"
        elif terminated:
            info["reason"] = "done"
        return StepResult(observation, 1.0 if won else 0.0, terminated, truncated, info)

    def admissible_actions(self) -> list[str] | None:
        return list(self._admissible) if self._game_env is not None else None

    def close(self) -> None:
        self._close_game()
        self._done = True

    def _close_game(self) -> None:
        if self._game_env is not None:
            self._game_env.close()
            self._game_env = None

    def _info(self, observation: str, infos: dict[str, Any], *, effective: bool) -> dict[str, Any]:
        won = bool(infos["won"][0])
        self._admissible = list(infos["admissible_commands"][0])
        actions = list(self._admissible)  # a copy: callers may edit it
        info: dict[str, Any] = {
            "won": won,
            "score": 1.0 if won else 0.0,
            "admissible_actions": actions,
            "format_valid": True,
            "action_effective": effective,
            "task_id": self._task_id,
            "task_type": task_type_of(self._gamefile),
            "step": self._steps,
            "anchor": f"{self._task_id}|{observation}",  # the raw observation, as verl-agent's GiGPO
            "admissible_commands": actions,
            "gamefile": self._gamefile,
        }
        if "extra.expert_plan" in infos:
            info["expert_plan"] = list(infos["extra.expert_plan"][0])
            info["expert_privileged"] = True
        return info


register("alfworld_real", AlfworldRealEnv, alfworld_action_parser, AlfworldPromptBuilder)
