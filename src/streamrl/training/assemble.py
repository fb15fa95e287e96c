"""From a run's ``Config`` to a ``Learner``: the algorithm from the table, and the narrow
``UpdateConfig`` of what the learner reads (the rollout layout is turned into Dr.GRPO's response
budget here, so the learner never sees it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrl.training.algorithms import make_algorithm
from streamrl.training.algorithms.base import Setup
from streamrl.training.config import Config
from streamrl.training.learner import Learner, UpdateConfig

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy


def update_config(config: Config) -> UpdateConfig:
    rollout = config.rollout
    return UpdateConfig(
        loss=config.algo,
        optim=config.optim,
        reward=config.reward,
        temperature=rollout.temperature,
        seed=config.train.seed,
        gradient_checkpointing=config.model.gradient_checkpointing,
        max_new_tokens=config.reply_token_cap(),
        # a per-step row holds one response; a full-history row all of an episode's turns
        turns_per_row=1 if rollout.layout == "per_step" else rollout.max_turns,
        train_top_layers=config.model.train_top_layers,
    )


def algorithm_setup(config: Config, policy: Policy, reward_range: tuple[float, float] = (0.0, 1.0)) -> Setup:
    """What an algorithm is built from; ``reward_range``: the environment's, before ``reward.scale``."""
    scale = config.reward.scale
    return Setup(
        policy=policy,
        reward=config.reward,
        reward_range=(reward_range[0] * scale, reward_range[1] * scale),
        optim=config.optim,
        gradient_checkpointing=config.model.gradient_checkpointing,
    )


def make_learner(
    config: Config, policy: Policy, reference: Any | None = None, reward_range: tuple[float, float] = (0.0, 1.0)
) -> Learner:
    """``reward_range``: the environment's, before ``reward.scale``."""
    algorithm = make_algorithm(config.algo, algorithm_setup(config, policy, reward_range))
    return Learner(algorithm, update_config(config), policy, reference)
