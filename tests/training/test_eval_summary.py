"""Evaluation summaries: success counts wins, score averages the environment's own return."""

from __future__ import annotations

import pytest

from streamrl.rollout import DispatchRecord, Trajectory
from streamrl.training.evaluate import summarise


def _episode(i: int, outcome: float | None, won: bool, task_type: str = "shop") -> Trajectory:
    record = DispatchRecord(request_id=f"r{i}", prompt_id=f"p{i}", seq=i, policy_version=0)
    return Trajectory(dispatch=record, layout="per_step", outcome=outcome, won=won, task_type=task_type)


def test_graded_rewards_give_a_score_beside_success():
    # WebShop-like purchases: one perfect (r = 1), two partial, one crashed episode without an outcome
    episodes = [_episode(0, 1.0, True), _episode(1, 0.5, False), _episode(2, 0.25, False), _episode(3, None, False)]
    result = summarise(episodes, "test", version=3)
    assert result.success == pytest.approx(0.25)
    assert result.score == pytest.approx(1.75 / 4)  # on success's 0-1 scale
    assert result.crashed == 1
    assert result.metrics()["score"] == pytest.approx(0.4375)


def test_a_binary_reward_scores_its_success():
    episodes = [_episode(0, 1.0, True, "a"), _episode(1, 0.0, False, "a"), _episode(2, 1.0, True, "b")]
    result = summarise(episodes, "unseen", version=0)
    assert result.score == pytest.approx(result.success)
    assert result.by_task_type["a"]["success"] == pytest.approx(0.5)
