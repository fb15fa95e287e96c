"""PPO with a separate critic and turn-level GAE (docs/algorithms.md §3).

Each learner step scores V_old with the critic (``training/critic.py``), computes turn GAE and
normalised advantages; the learner updates the actor (the shared PPO loss), then the critic
beside it toward ``Prepared.value_targets``, with its own optimiser.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from streamrl.algos import advantage_stats, token_measure_whiten, turn_gae_batched, turn_normalize
from streamrl.rollout import PromptSource, UniformPromptSource
from streamrl.training.algo_config import PPOConfig
from streamrl.training.algorithms.base import Prepared, Setup, Stateless
from streamrl.training.batch import Batch, bootstrap_values
from streamrl.training.critic import CriticUpdater, ValueTargets


class PPO(Stateless):
    """The critic, not the proximal policy, gives V_old: no old pass of its own."""

    critic: CriticUpdater

    def __init__(self, config: PPOConfig, setup: Setup):
        self.config = config
        optim = setup.optim
        betas = cast("tuple[float, float]", tuple(optim.betas))  # validated as a pair
        self.critic = CriticUpdater(
            setup.policy, lr=config.critic_lr, betas=betas, weight_decay=optim.weight_decay, eps=optim.eps,
            grad_clip=optim.grad_clip, micro_batch_size=optim.micro_batch_size,
            epochs=config.epochs, value_clip=config.value_clip, gradient_checkpointing=setup.gradient_checkpointing,
        )

    def prompt_source(self, prompt_ids: list[str]) -> PromptSource:
        return UniformPromptSource(prompt_ids)

    def advantages(self, batch: Batch, old: Any, step: int) -> Prepared:
        config = self.config
        v_old = self.critic.values(batch, batch.pre_action).double()
        padded = batch.padded_turns(v_old, done_on_last=config.truncation == "terminal")
        last_values = None
        if config.truncation == "bootstrap":
            last_values = bootstrap_values(batch, lambda positions: self.critic.values(batch, positions))
        adv_padded, returns = turn_gae_batched(
            padded["rewards"], padded["values"], padded["dones"], padded["mask"], config.gamma, config.lam, last_values
        )
        turns = batch.turns
        raw = turns.flat(adv_padded)
        if config.norm_measure == "turn":
            adv = turns.flat(turn_normalize(adv_padded, padded["mask"]))
        elif config.norm_measure == "token":
            adv = token_measure_whiten(raw, turns.action_tokens.double())
        else:
            adv = raw
        if step <= config.critic_warmup:
            adv = torch.zeros_like(adv)  # critic warm-up: the actor waits
        metrics = advantage_stats(raw, adv)
        metrics["value_mean"] = float(v_old.mean())
        targets = ValueTargets(v_old=v_old.float(), returns=turns.flat(returns).float())
        return Prepared(turn_advantages=adv, value_targets=targets, metrics=metrics)
