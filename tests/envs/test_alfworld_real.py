"""alfworld_real: clear errors without the package or the games, the batch-of-one mapping (against
a scripted stand-in for ``AlfredTWEnv``), and parity with alfworld_lite when real data is present
(alfworld_lite item 11)."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

from streamrl.envs import make
from streamrl.envs.alfworld_lite.rules import parse_command
from streamrl.envs.alfworld_real import AlfworldUnavailableError, data_root, has_games

from .test_alfworld_lite_text import INITIAL_OBS

WELCOME_OBS = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
    "you see a countertop 1, and a fridge 1.\n\nYour task is to: put a cool apple in countertop."
)


class _ScriptedGame:
    """Batch-of-one TextWorld game: ``win`` wins, ``go to fridge 1`` arrives, the rest is a no-op."""

    def __init__(self, gamefile: str, max_steps: int):
        self.gamefile, self.max_steps, self.steps, self.closed = gamefile, max_steps, 0, False

    def _infos(self, won: bool) -> dict:
        return {"won": [won], "admissible_commands": [["go to countertop 1", "go to fridge 1", "help", "look"]],
                "extra.gamefile": [self.gamefile]}

    def reset(self):
        return [WELCOME_OBS], self._infos(False)

    def step(self, commands):
        self.steps += 1
        won = commands[0] == "win"
        observation = {"win": "You win.", "go to fridge 1": "You arrive at fridge 1. The fridge 1 is closed."}
        obs = observation.get(commands[0], "Nothing happens.")
        return [obs], [float(won)], [won or self.steps >= self.max_steps], self._infos(won)

    def close(self):
        self.closed = True


def _fake_alfworld(monkeypatch, created: list) -> None:
    class AlfredTWEnv:
        def __init__(self, config, train_eval="train"):
            folder = {"train": "data_path", "eval_in_distribution": "eval_id_data_path",
                      "eval_out_of_distribution": "eval_ood_data_path"}[train_eval]
            root = Path(config["dataset"][folder])
            self.config = config
            # like alfworld, an unsorted walk; the adapter must sort it
            self.game_files = [str(p) for p in root.rglob("game.tw-pddl")][::-1]

        def init_env(self, batch_size):
            assert batch_size == 1 and len(self.game_files) == 1
            game = _ScriptedGame(self.game_files[0], self.config["dagger"]["training"]["max_nb_steps_per_episode"])
            created.append(game)
            return game

    names = ["alfworld", "alfworld.agents", "alfworld.agents.environment", "alfworld.agents.environment.alfred_tw_env"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[names[-1]].AlfredTWEnv = AlfredTWEnv


def _fake_data(root: Path) -> None:
    for split, games in (("train", 3), ("valid_seen", 2), ("valid_unseen", 2)):
        for i in range(games):
            trial = root / "json_2.1.1" / split / f"pick_cool_then_place_in_recep-Apple-None-CounterTop-{i}" / "trial_1"
            trial.mkdir(parents=True)
            (trial / "game.tw-pddl").write_text("{}")


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "alfworld", None)  # makes `import alfworld...` fail
    with pytest.raises(AlfworldUnavailableError, match=re.escape("pip install streamrl[alfworld]")):
        make("alfworld_real")


def test_missing_games_name_alfworld_data(monkeypatch, tmp_path):
    _fake_alfworld(monkeypatch, [])
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        make("alfworld_real")
    (tmp_path / "json_2.1.1" / "valid_unseen").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        make("alfworld_real")


def test_batch_of_one_results_map_into_step_results(monkeypatch, tmp_path):
    created: list[_ScriptedGame] = []
    _fake_alfworld(monkeypatch, created)
    _fake_data(tmp_path)
    env = make("alfworld_real", data_dir=tmp_path, max_steps=3)
    assert env.task_ids("unseen") == ["unseen/0", "unseen/1"] and len(env.task_ids("train")) == 3
    assert env.games("unseen") == sorted(env.games("unseen"))
    observation, info = env.reset(task_id="unseen/1")
    assert observation == WELCOME_OBS and info["gamefile"] == env.games("unseen")[1]
    assert info["task_type"] == "pick_cool_then_place_in_recep" and info["task_id"] == "unseen/1"
    assert info["admissible_actions"] == ["go to countertop 1", "go to fridge 1", "help", "look"]
    nothing = env.step("jump")
    assert nothing.observation == "Nothing happens." and not nothing.info["action_effective"]
    arrive = env.step("go to fridge 1")
    assert arrive.info["action_effective"] and not (arrive.terminated or arrive.truncated)
    last = env.step("look")
    assert last.truncated and not last.terminated and last.info["reason"] == "max_steps" and last.reward == 0.0

    env.reset(task_id="unseen/0")
    assert created[0].closed  # the previous game was closed on reset
    won = env.step("win")
    assert won.terminated and not won.truncated and won.reward == 1.0 and won.info["reason"] == "won"
    env.close()
    env.close()
    assert created[-1].closed
    with pytest.raises(ValueError, match="out of range"):
        env.reset(task_id="unseen/2")


_REAL = importlib.util.find_spec("alfworld") is not None and has_games(data_root())


@pytest.mark.skipif(not _REAL, reason="needs the alfworld package and games in $ALFWORLD_DATA")
def test_real_alfworld_matches_the_lite_grammar():
    env = make("alfworld_real")
    assert len(env.task_ids("seen")) == 140 and len(env.task_ids("unseen")) == 134
    lite = make("alfworld_lite", expert_plan=False)
    for task_id in env.task_ids("unseen", limit=5):
        observation, info = env.reset(task_id=task_id)
        assert INITIAL_OBS.match(observation)
        for _ in range(5):
            assert all(parse_command(command) is not None for command in info["admissible_actions"])
            goto = next(a for a in info["admissible_actions"] if a.startswith("go to "))
            result = env.step(goto)
            assert result.observation.startswith(f"You arrive at {goto.removeprefix('go to ')}. ")
            info = result.info
    # the lite env's commands use the verbs of the real (>= 0.4) grammar
    _, lite_info = lite.reset(task_id="unseen/0")
    real_verbs = {"go", "open", "close", "take", "move", "heat", "cool", "clean", "use", "examine"}
    real_verbs |= {"inventory", "look", "help"}
    assert {a.split()[0] for a in lite_info["admissible_actions"]} <= real_verbs
