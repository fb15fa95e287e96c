"""``model.gradient_checkpointing`` changes memory, not mathematics: a PPO step (actor and separate
critic) lands on the same weights with and without it."""

from __future__ import annotations

import pytest
import torch

from streamrl.policy.loading import load_policy
from streamrl.training.assemble import make_learner


def _step(config, trajectories):
    torch.manual_seed(0)
    policy = load_policy("tiny", model_overrides=config.model.overrides, seed=0)
    learner = make_learner(config, policy)
    # plain SGD: Adam's first step is lr * sign(grad), so float noise in a near-zero gradient
    # would flip a whole step; SGD keeps a recomputation difference as small as it really is
    learner.optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=config.optim.lr)
    learner.critic.optimizer = torch.optim.SGD(learner.critic.model.parameters(), lr=config.algo.critic_lr)
    metrics = learner.step(trajectories)
    return policy, learner, metrics


def test_checkpointed_step_equals_plain_step(coin_config, coin_rollouts):
    plain = coin_config("ppo", "optim.lr=0.5", "algo.critic_lr=0.5", "train.batch_size=8")
    trajectories = coin_rollouts(plain, load_policy("tiny", model_overrides=plain.model.overrides, seed=0))
    for index, t in enumerate(trajectories):  # half succeed, whatever was sampled: every advantage is non-zero
        t.turns[-1].reward = float(index % 2)
        t.outcome = sum(turn.reward for turn in t.turns)
    policy_a, learner_a, metrics_a = _step(plain, trajectories)
    checkpointed = coin_config("ppo", "optim.lr=0.5", "algo.critic_lr=0.5", "train.batch_size=8",
                                "model.gradient_checkpointing=true")
    policy_b, learner_b, metrics_b = _step(checkpointed, trajectories)
    assert any(getattr(m, "gradient_checkpointing", False) for m in policy_b.model.modules())
    assert any(getattr(m, "gradient_checkpointing", False) for m in learner_b.critic.model.modules())
    for a, b in zip(policy_a.model.parameters(), policy_b.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    for a, b in zip(learner_a.critic.model.parameters(), learner_b.critic.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    moved = load_policy("tiny", model_overrides=plain.model.overrides, seed=0)
    assert any(not torch.equal(a, b) for a, b in zip(moved.model.parameters(), policy_b.model.parameters()))


def test_unsupported_model_is_named():
    from streamrl.policy.modeling import enable_gradient_checkpointing

    with pytest.raises(ValueError, match="model.gradient_checkpointing"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))
