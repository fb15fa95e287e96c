"""SAPO (docs/algorithms.md §6): one model is the policy, the state value V and the action value Q.

V is read at each turn's pre-action boundary and Q at its post-action boundary, from the logits of
the two reserved value tokens (``Policy.value_token_ids``), which are never sampled and are
excluded from the action vocabulary. Turn-level GAE on the model's own V_old gives advantages
(lambda-return V targets, SARSA Q targets), normalised over the batch's turns; the policy, V, Q,
KL and entropy terms are summed and trained with one backward pass per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from streamrl.algos import (
    advantage_stats,
    sapo_advantages,
    sapo_targets,
    sapo_value_loss,
    value_readout,
    value_saturation_frac,
)
from streamrl.policy.scoring import ScoreOutput
from streamrl.rollout import PromptSource, UniformPromptSource
from streamrl.training.algo_config import SAPOConfig
from streamrl.training.algorithms.base import Auxiliary, Prepared, Setup, Stateless
from streamrl.training.batch import Batch, Counts, MicroBatch, bootstrap_values


@dataclass
class SAPOTargets:
    """Per global turn ``[M]``: V and Q before the update and their targets."""

    v_old: torch.Tensor
    q_old: torch.Tensor
    v_target: torch.Tensor
    q_target: torch.Tensor
    #: bool: turns with action tokens (an aborted turn has no Q)
    q_valid: torch.Tensor


class SAPO(Stateless):
    # advantages come from the model's own V_old and Q_old, read in the proximal pass
    needs_old_pass = reads_values = True

    def __init__(self, config: SAPOConfig, setup: Setup):
        if setup.policy.value_token_ids is None:
            raise ValueError("algo sapo needs value tokens, but the policy was loaded without them")
        self.config = config
        self.r_max = max(abs(setup.reward_range[0]), abs(setup.reward_range[1]))

    def prompt_source(self, prompt_ids: list[str]) -> PromptSource:
        return UniformPromptSource(prompt_ids)

    def readout(self, value_logits: torch.Tensor) -> torch.Tensor:
        """``[..., 2]`` (z[w+], z[w-]) -> ``[...]`` values in [-r_max, r_max]."""
        return value_readout(value_logits, 0, 1, self.r_max, self.config.value_tau, self.config.value_squash)

    def advantages(self, batch: Batch, old: ScoreOutput, step: int) -> Prepared[SAPOTargets]:
        config = self.config
        assert old.value_logits is not None  # reads_values: the proximal pass reads the value tokens
        flat_logits = old.value_logits.reshape(-1, 2)
        v_old = self.readout(flat_logits[batch.pre_action]).double()
        q_old = self.readout(flat_logits[batch.post_action]).double()
        turns = batch.turns
        padded = batch.padded_turns(v_old, done_on_last=config.truncation == "terminal")
        last_values = None
        if config.truncation == "bootstrap":
            last_values = bootstrap_values(batch, lambda positions: self.readout(flat_logits[positions]))
        q_padded = turns.padded(q_old)[0]
        targets = sapo_targets(
            padded["rewards"], padded["values"], q_padded, padded["dones"], padded["mask"],
            gamma=config.gamma, lam=config.lam, last_values=last_values,
        )
        acting = turns.action_tokens > 0  # an aborted turn (no action tokens) keeps only its V target
        adv_padded = sapo_advantages(
            targets.advantages,
            padded["mask"] & turns.padded(acting)[0],
            invalid=turns.padded(turns.invalid.double())[0],
            kappa=config.invalid_penalty * self.r_max,
            norm_measure=config.norm_measure,
            turn_lengths=turns.padded(turns.action_tokens.double())[0],
        )
        adv = turns.flat(adv_padded)
        metrics = advantage_stats(turns.flat(targets.advantages), adv)
        metrics.update(
            value_mean=float(v_old.mean()),
            q_mean=float(q_old.mean()),
            value_saturation_frac=value_saturation_frac(torch.cat([v_old, q_old]), self.r_max),
        )
        own = SAPOTargets(
            v_old=v_old, q_old=q_old, v_target=turns.flat(targets.v_targets), q_target=turns.flat(targets.q_targets),
            q_valid=acting,
        )
        return Prepared(turn_advantages=adv, policy_turns=acting, targets=own, metrics=metrics)

    def auxiliary_loss(self, prepared: Prepared[SAPOTargets], micro: MicroBatch, out: ScoreOutput, counts: Counts) -> Auxiliary:
        """The V and Q losses of the micro-batch's turns, averaged over the mini-batch's turns."""
        config, targets, ids = self.config, prepared.targets, micro.turn_ids
        # ``advantages`` set the targets, and reads_values makes the training forward read the value tokens
        assert targets is not None and out.value_logits is not None
        values = self.readout(out.value_logits[micro.pre_positions])
        q_values = self.readout(out.value_logits[micro.post_positions])
        all_turns = torch.ones_like(ids, dtype=torch.bool)
        value_loss = sapo_value_loss(
            values, targets.v_old[ids].to(values.dtype), targets.v_target[ids].to(values.dtype), all_turns,
            r_max=self.r_max, clip=config.value_clip, global_count=counts.turns,
        )
        q_count = float((targets.q_valid & counts.turn_mask).sum())
        q_loss = sapo_value_loss(
            q_values, targets.q_old[ids].to(q_values.dtype), targets.q_target[ids].to(q_values.dtype), targets.q_valid[ids],
            r_max=self.r_max, clip=config.value_clip, global_count=q_count,
        )
        loss = config.value_coef * value_loss + config.q_coef * q_loss
        return Auxiliary(loss, {"value_loss": float(value_loss.detach()), "q_loss": float(q_loss.detach())})
