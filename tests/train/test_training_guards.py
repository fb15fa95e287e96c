"""Issue 12: training refuses to silently go wrong. A dead environment, a batch with nothing to
train on and non-finite numbers stop it with one line; the last good checkpoint stays resumable."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from streamrl import cli
from streamrl.envs import register
from streamrl.rollout import DeadEnvironmentError
from streamrl.train.checkpoint import latest_valid, list_checkpoints
from streamrl.train.errors import NonFiniteError, TrainingError
from streamrl.train.learner import Learner
from streamrl.train.loop import require_outcomes, train

from .conftest import AnyText, CoinEnv, CoinPrompt

QUIET = ["logging.progress=false", "logging.tensorboard=false", "logging.samples_every=0"]


class DeadEnv(CoinEnv):
    def reset(self, seed=None, task_id=None, options=None):
        raise RuntimeError("no such task")


register("dead_coin", DeadEnv, AnyText, CoinPrompt, overwrite=True)


def test_a_dead_environment_stops_training_with_one_line(tmp_path, capsys):
    args = ["train", "--config", "configs/smoke.yaml", "--algo", "spo++", "--out", str(tmp_path / "run"),
            "env.name=dead_coin", "env.prompt={}", "env.parser={}", "sft.demos=0", "train.eval_at_start=false",
            "rollout.max_new_tokens=6", "train.steps=3", *QUIET]
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "'dead_coin'" in err and "no such task" in err and "in a row" in err
    assert "never retrieved" not in err
    assert not (tmp_path / "run" / "final_model").exists() and not list_checkpoints(tmp_path / "run" / "checkpoints")


def test_a_batch_in_which_every_episode_crashed_is_never_trained_on():
    class Crashed:
        outcome, end_reason, error = None, "engine_error", "generate raised OSError: gone"

    with pytest.raises(TrainingError, match=r"step 4: all 2 episodes .*\(engine_error: generate raised OSError: gone\)"):
        require_outcomes([Crashed(), Crashed()], 4)
    assert issubclass(DeadEnvironmentError, Exception)
