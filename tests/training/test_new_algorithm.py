"""Adding an algorithm is one module plus one ``streamrl.register_algorithm`` call: the test-only RLOO
(``tests/training/rloo.py``) trains end to end through the real loop, config, checkpoint and resume."""

from __future__ import annotations

import asyncio

import pytest
import torch

import streamrl
from streamrl.training.loggers import read_metrics
from streamrl.training.loop import train

from . import rloo


@pytest.fixture
def rloo_row():
    """The one registration, through the public API alone."""
    streamrl.register_algorithm("rloo", rloo.RLOOConfig, rloo.RLOO)


def test_leave_one_out_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5], dtype=torch.float64)
    adv = rloo.leave_one_out(rewards, ["a", "a", "a", "b", "b", "c"])
    assert adv.tolist() == pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0, 0.0])


def test_rloo_trains_checkpoints_and_resumes(rloo_row, coin_config, tmp_path):
    config = coin_config("rloo", "algo.group_size=4", "train.steps=2", "train.checkpoint_every=1")
    assert isinstance(config.algo, rloo.RLOOConfig)
    asyncio.run(train(config, tmp_path))
    more = coin_config("rloo", "algo.group_size=4", "train.steps=3", "train.checkpoint_every=1")
    summary = asyncio.run(train(more, tmp_path, resume=True))
    assert summary["steps"] == 3
    records = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["trajectories_in_loss"] == config.train.batch_size for r in records)
    assert any("adv_abs_mean" in r and not r.get("actor_skipped") for r in records)


def test_register_algorithm_checks_what_it_is_given():
    with pytest.raises(ValueError, match="RLOOConfig.name must default to 'loo'"):
        streamrl.register_algorithm("loo", rloo.RLOOConfig, rloo.RLOO)
    with pytest.raises(TypeError, match="must be a PolicyLossConfig subclass"):
        streamrl.register_algorithm("rloo", dict, rloo.RLOO)
    with pytest.raises(TypeError, match="a class or 'module:Class'"):
        streamrl.register_algorithm("rloo", rloo.RLOOConfig, "not a path")
