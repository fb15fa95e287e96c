"""PPO with a separate critic and turn-level GAE (algorithms.md s3).

The critic is a copy of the policy's decoder (LoRA merged) with a zero-initialised scalar head, so
V starts at 0; it reads one value per turn at the pre-action boundary. Each learner step scores
V_old, computes turn GAE and normalised advantages, updates the actor (the shared PPO loss), then
updates the critic with the clipped value loss over turns, as its own pass with its own optimiser.
"""

from __future__ import annotations

import copy

import torch

from streamrl.algos import advantage_stats, token_measure_whiten, turn_gae_batched, turn_normalize, value_loss
from streamrl.policy.modeling import decoder_and_head, enable_gradient_checkpointing, position_ids_from_mask
from streamrl.rollout import Trajectory
from streamrl.train.batch import Batch, bootstrap_values, position_chunks
from streamrl.train.learner import Learner, Prepared, Probe
from streamrl.train.optim import check_finite_value, clip_and_step


class Critic(torch.nn.Module):
    """``V(context)``: the policy's decoder plus a linear head, read at chosen positions."""

    def __init__(self, policy):
        super().__init__()
        plain = policy.inference_model()  # a detached copy, LoRA merged
        decoder, _ = decoder_and_head(plain)
        self.decoder = copy.deepcopy(decoder).requires_grad_(True)
        hidden = plain.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1, dtype=next(self.decoder.parameters()).dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, rows, cols) -> torch.Tensor:
        """``[B, T]`` ids and mask; returns ``[K]`` values at ``(rows[k], cols[k])``."""
        hidden = self.decoder(
            input_ids=input_ids, attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask), use_cache=False,
        ).last_hidden_state
        return self.head(hidden[rows, cols]).squeeze(-1).float()


class PPOLearner(Learner):
    name = "ppo"

    def __init__(self, config, policy, reference=None, reward_range=(0.0, 1.0)):
        super().__init__(config, policy, reference, reward_range)
        self.critic = Critic(policy)
        if config.model.gradient_checkpointing:
            enable_gradient_checkpointing(self.critic.decoder)
        self.critic_optimizer = torch.optim.AdamW(
            self.critic.parameters(), lr=self.algo.critic_lr, betas=tuple(config.optim.betas),
            weight_decay=config.optim.weight_decay,
        )

    def needs_old_pass(self) -> bool:
        return self.algo.epochs > 1 or self.algo.mini_batches > 1

    @torch.no_grad()
    def critic_values(self, batch: Batch, positions: torch.Tensor) -> torch.Tensor:
        """V at flat ``positions`` ``[K]`` -> ``[K]`` float32."""
        values = torch.zeros(positions.numel(), dtype=torch.float32)
        for tensors, pick, rows, cols in position_chunks(batch, positions, self.config.optim.micro_batch_size):
            values[pick] = self.critic(tensors["input_ids"], tensors["attention_mask"], rows, cols)
        return values

    def prepare(self, batch: Batch, old) -> Prepared:
        self.critic.eval()
        v_old = self.critic_values(batch, batch.pre_action).double()
        padded = batch.padded_turns(v_old, done_on_last=self.algo.truncation == "terminal")
        last_values = None
        if self.algo.truncation == "bootstrap":
            last_values = bootstrap_values(batch, lambda positions: self.critic_values(batch, positions))
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
        self._targets = (v_old.float(), turns.flat(returns).float())
        return Prepared(turn_advantages=adv, metrics=metrics)

    def finish(self, delivered: list[Trajectory], batch: Batch | None, probe: Probe | None) -> dict[str, float]:
        """The critic's own update: clipped value loss over turns, micro-batched, global mean."""
        if batch is None:
            return {}
        v_old, returns = self._targets
        count = float(batch.turns.size)
        self.critic.train()
        losses, norms = [], []
        for _ in range(self.algo.epochs):
            total = 0.0
            for tensors, pick, rows, cols in position_chunks(batch, batch.pre_action, self.config.optim.micro_batch_size):
                values = self.critic(tensors["input_ids"], tensors["attention_mask"], rows, cols)
                loss = value_loss(
                    values, v_old[pick], returns[pick], torch.ones_like(values, dtype=torch.bool),
                    clip=self.algo.value_clip, global_count=count,
                )
                check_finite_value(self.steps_done + 1, "critic loss", float(loss.detach()))
                loss.backward()
                total += float(loss.detach())
            norms.append(clip_and_step(
                self.critic.parameters(), self.critic_optimizer, self.config.optim.grad_clip,
                step=self.steps_done + 1, model=self.critic, what="critic ",
            ))
            losses.append(total)
        self.critic.eval()
        return {"critic_loss": sum(losses) / len(losses), "critic_grad_norm": sum(norms) / len(norms)}

    def tensor_state(self) -> dict:
        return {**super().tensor_state(), "critic": self.critic.state_dict(), "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_tensor_state(self, state: dict) -> None:
        super().load_tensor_state(state)
        self.critic.load_state_dict(state["critic"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
