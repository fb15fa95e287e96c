"""PPO's critic as its own updater, beside the actor (docs/algorithms.md §3).

The critic is a copy of the policy's decoder (LoRA merged) with a zero-initialised scalar head, so
V starts at 0; it reads one value per turn at the pre-action boundary. ``CriticUpdater`` owns the
critic model and its optimiser: ``values`` scores V at flat batch positions (no gradient), and
``update`` trains the clipped value loss over turns, micro-batched, with the global mean, through
the same ``clip_and_step`` as the actor. With several learner processes its blocks are sharded like
the policy's (``data_parallel.shard_critic``) and ``ranks`` spreads the update's micro-batches.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from streamrl.algos import value_loss
from streamrl.policy.modeling import decoder_and_head, enable_gradient_checkpointing, position_ids_from_mask
from streamrl.training.batch import Batch, position_chunks
from streamrl.training.errors import NonFiniteError
from streamrl.training.optim import adamw, load_optimizer_state
from streamrl.training.ranks import Ranks

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy


@dataclass
class ValueTargets:
    """What the critic trains toward, per global turn ``[M]`` float32."""

    #: V before the update (the centre of the value clip)
    v_old: torch.Tensor
    returns: torch.Tensor


class Critic(torch.nn.Module):
    """``V(context)``: the policy's decoder plus a linear head, read at chosen positions."""

    def __init__(self, policy: Policy):
        super().__init__()
        plain = policy.inference_model(dtype=policy.dtype)  # a detached copy, LoRA merged, trainable precision
        decoder, _ = decoder_and_head(plain)
        self.decoder = copy.deepcopy(decoder).requires_grad_(True)
        hidden = plain.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1, dtype=next(self.decoder.parameters()).dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.autocast = policy.autocast  # the policy's mixed precision, if any

    def forward(self, input_ids, attention_mask, rows, cols) -> torch.Tensor:
        """``[B, T]`` ids and mask; returns ``[K]`` values at ``(rows[k], cols[k])``."""
        with self.autocast():
            hidden = self.decoder(
                input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False,
            ).last_hidden_state
            return self.head(hidden[rows, cols]).squeeze(-1).float()


class CriticUpdater:
    """The critic model, its optimiser, and its two verbs: ``values`` and ``update``."""

    def __init__(
        self,
        policy: Policy,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        eps: float = 1e-8,
        grad_clip: float = 1.0,
        micro_batch_size: int = 8,
        epochs: int = 1,
        value_clip: float = 0.5,
        gradient_checkpointing: bool = False,
    ):
        self.model = Critic(policy)
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.model.decoder)
        self.optimizer = adamw(self.model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay, eps=eps)
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size
        self.epochs = epochs
        self.value_clip = value_clip
        #: this process among the learner processes (set when the critic is sharded)
        self.ranks = Ranks()

    @torch.no_grad()
    def values(self, batch: Batch, positions: torch.Tensor) -> torch.Tensor:
        """V at flat ``positions`` ``[K]`` -> ``[K]`` float32."""
        self.model.eval()
        values = torch.zeros(positions.numel(), dtype=torch.float32)
        for tensors, pick, rows, cols in position_chunks(batch, positions, self.micro_batch_size):
            values[pick] = self.model(tensors["input_ids"], tensors["attention_mask"], rows, cols)
        return values

    def update(self, batch: Batch, targets: ValueTargets, *, step: int) -> dict[str, float]:
        """``epochs`` optimiser steps of the clipped value loss toward ``targets.returns`` at every
        turn's pre-action boundary; ``step`` is the learner step, for the non-finite guard."""
        count, ranks = float(batch.turns.size), self.ranks
        self.model.train()
        losses, norms = [], []
        for _ in range(self.epochs):
            total = 0.0
            for (tensors, pick, rows, cols), live in ranks.share(list(position_chunks(batch, batch.pre_action, self.micro_batch_size))):
                values = self.model(tensors["input_ids"], tensors["attention_mask"], rows, cols)
                loss = value_loss(
                    values, targets.v_old[pick], targets.returns[pick], torch.ones_like(values, dtype=torch.bool),
                    clip=self.value_clip, global_count=count,
                )
                bad = ranks.all_finite({"critic loss": float(loss.detach())} if live else {})
                if bad:
                    raise NonFiniteError(f"step {step}: non-finite {', '.join(bad)}; training stopped before the update")
                (loss * ranks.loss_weight(live)).backward()
                total += float(loss.detach()) if live else 0.0
            norms.append(ranks.clip_and_step(
                list(self.model.parameters()), self.optimizer, self.grad_clip, step=step, model=self.model, what="critic ",
            ))
            losses.append(ranks.sum({"critic_loss": total})["critic_loss"])
        self.model.eval()
        return {"critic_loss": sum(losses) / len(losses), "critic_grad_norm": sum(norms) / len(norms)}

    def state_dict(self) -> dict[str, Any]:
        """Weights and optimiser state; sharded, whole weights and the state by parameter name (a
        collective: every learner process calls it, rank 0's copy is complete)."""
        if self.ranks.world == 1:  # (torch's getter would initialise an empty state by taking a step)
            return {"critic": self.model.state_dict(), "critic_optimizer": self.optimizer.state_dict()}
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {"critic": get_model_state_dict(self.model, options=options),
                "critic_optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=options)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["critic"])
        load_optimizer_state(self.optimizer, state["critic_optimizer"], self.model)
