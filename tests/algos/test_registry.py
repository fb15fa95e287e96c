"""Estimators and losses registered by name."""

import pytest
import torch

from streamrl.algos import (
    UnknownAlgorithmError,
    get_advantage,
    get_policy_loss,
    grpo_advantages,
    list_advantages,
    list_policy_losses,
    ppo_policy_loss,
    register_advantage,
    registry,
)


def test_builtins_are_registered():
    assert {"grpo", "dr_grpo", "spo", "spo++", "sapo", "gae_turn", "gae_token"} <= set(list_advantages())
    assert get_advantage("grpo") is grpo_advantages
    assert get_policy_loss("ppo") is ppo_policy_loss
    assert list_policy_losses() == ["ppo"]


def test_registered_estimators_are_callable_by_name():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(get_advantage("dr_grpo")(rewards, [0, 0, 1, 1]), torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_unknown_names_suggest_a_close_match():
    with pytest.raises(UnknownAlgorithmError, match="did you mean 'grpo'"):
        get_advantage("gpro")
    with pytest.raises(UnknownAlgorithmError, match="known: ppo"):
        get_policy_loss("cispo")


def test_duplicate_registration_needs_overwrite(monkeypatch):
    monkeypatch.setattr(registry, "_ADVANTAGES", dict(registry._ADVANTAGES))
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda rewards: rewards)

    @register_advantage("grpo", overwrite=True)
    def replacement(rewards):
        return rewards

    assert get_advantage("grpo") is replacement
    with pytest.raises(ValueError, match="non-empty string"):
        register_advantage("")
