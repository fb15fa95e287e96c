"""PPO with a separate critic and turn-level GAE (docs/algorithms.md §3).

Each learner step scores V_old with the critic (``streamrl.train.critic``), computes turn GAE and
normalised advantages, updates the actor (the shared PPO loss), then updates the critic beside it
with the clipped value loss over turns, as its own pass with its own optimiser.
"""

from __future__ import annotations

import torch

from streamrl.algos import advantage_stats, token_measure_whiten, turn_gae_batched, turn_normalize
from streamrl.rollout import Trajectory
from streamrl.train.batch import Batch, bootstrap_values
from streamrl.train.critic import Critic, CriticUpdater
from streamrl.train.learner import Learner, Prepared, Probe


class PPOLearner(Learner):
    name = "ppo"

    def __init__(self, config, policy, reference=None, reward_range=(0.0, 1.0)):
        super().__init__(config, policy, reference, reward_range)
        self.critic_updater = CriticUpdater(
            policy, lr=self.algo.critic_lr, betas=tuple(config.optim.betas), weight_decay=config.optim.weight_decay,
            grad_clip=config.optim.grad_clip, micro_batch_size=config.optim.micro_batch_size,
            gradient_checkpointing=config.model.gradient_checkpointing,
        )

    @property
    def critic(self) -> Critic:
        return self.critic_updater.model

    def needs_old_pass(self) -> bool:
        return self.algo.epochs > 1 or self.algo.mini_batches > 1

    def prepare(self, batch: Batch, old) -> Prepared:
        v_old = self.critic_updater.values(batch, batch.pre_action).double()
        padded = batch.padded_turns(v_old, done_on_last=self.algo.truncation == "terminal")
        last_values = None
        if self.algo.truncation == "bootstrap":
            last_values = bootstrap_values(batch, lambda positions: self.critic_updater.values(batch, positions))
        adv_padded, returns = turn_gae_batched(
            padded["rewards"], padded["values"], padded["dones"], padded["mask"], self.algo.gamma, self.algo.lam, last_values
        )
        turns = batch.turns
        raw = turns.flat(adv_padded)
        if self.algo.norm_measure == "turn":
            adv = turns.flat(turn_normalize(adv_padded, padded["mask"]))
        elif self.algo.norm_measure == "token":
            adv = token_measure_whiten(raw, turns.action_tokens.double())
        else:
            adv = raw
        if self.steps_done < self.algo.critic_warmup:
            adv = torch.zeros_like(adv)  # critic warm-up: the actor waits
        metrics = advantage_stats(raw, adv)
        metrics["value_mean"] = float(v_old.mean())
        extra = {"v_old": v_old.float(), "returns": turns.flat(returns).float()}
        return Prepared(turn_advantages=adv, extra=extra, metrics=metrics)

    def finish(
        self, delivered: list[Trajectory], batch: Batch | None, prepared: Prepared | None, probe: Probe | None
    ) -> dict[str, float]:
        """The critic's own update, beside the actor's."""
        if batch is None:
            return {}
        return self.critic_updater.update(
            batch, prepared.extra["v_old"], prepared.extra["returns"],
            epochs=self.algo.epochs, value_clip=self.algo.value_clip, step=self.steps_done + 1,
        )

    def tensor_state(self) -> dict:
        return {**super().tensor_state(), **self.critic_updater.state_dict()}

    def load_tensor_state(self, state: dict) -> None:
        super().load_tensor_state(state)
        self.critic_updater.load_state_dict(state)
