"""Reward shaping: penalties for invalid formats and ineffective actions change training rewards only."""

from __future__ import annotations

from streamrl.rollout import DispatchRecord, Trajectory, Turn
from streamrl.training.batch import collate, shaped_turn_rewards
from streamrl.training.config import RewardConfig


def _turn(reward: float, *, valid: bool = True, effective: bool = True) -> Turn:
    return Turn(context_ids=[1, 2], action_ids=[3, 4], logprobs=[-0.1, -0.2], action_text="x", action="x",
                format_valid=valid, action_effective=effective, reward=reward, done=False,
                finish_reason="stop", policy_version=0, observation="o")


def _trajectory() -> Trajectory:
    turns = [_turn(0.0, effective=False), _turn(0.0, valid=False, effective=False), _turn(1.0)]
    return Trajectory(DispatchRecord("r0", "train/0", 0, 0), "per_step", turns, outcome=1.0, won=True)


def test_each_penalty_hits_only_its_own_turns():
    trajectory = _trajectory()
    assert shaped_turn_rewards(trajectory, RewardConfig()) == [0.0, 0.0, 1.0]
    # an invalid format is one fault: the ineffective-action penalty applies to valid actions only
    shaped = shaped_turn_rewards(trajectory, RewardConfig(scale=2.0, invalid_format_penalty=0.5, ineffective_penalty=0.1))
    assert shaped == [-0.1, -0.5, 2.0]


def test_collate_carries_the_shaped_rewards_and_the_outcome_stays_the_environments():
    trajectory = _trajectory()
    batch = collate([trajectory], reward=RewardConfig(ineffective_penalty=0.25))
    assert batch.turns.reward.tolist() == [-0.25, 0.0, 1.0]
    assert trajectory.outcome == 1.0 and trajectory.won


def test_a_malformed_action_cheaper_than_an_ineffective_one_is_warned_about():
    from streamrl.training.config_files import load_config
    from streamrl.training.preflight import preflight

    def warnings(*overrides):
        said = []
        preflight(load_config("configs/smoke.yaml", ["logging.tensorboard=false", *overrides]), warn=said.append)
        return said

    cheap = warnings("reward.ineffective_penalty=0.1")
    assert len(cheap) == 1 and cheap[0].startswith("reward.invalid_format_penalty (0) is below reward.ineffective_penalty")
    assert warnings("reward.ineffective_penalty=0.1", "reward.invalid_format_penalty=0.1") == []
    assert warnings() == []
    default = load_config("configs/default.yaml").reward  # the default run closes that door
    assert default.invalid_format_penalty >= default.ineffective_penalty > 0
