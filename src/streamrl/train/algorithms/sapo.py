"""SAPO (docs/algorithms.md §6): one model is the policy, the state value V and the action value Q.

V is read at each turn's pre-action boundary and Q at its post-action boundary, from the logits of
the two reserved value tokens (``Policy.value_token_ids``), which are never sampled and are
excluded from the action vocabulary. Turn-level GAE on the model's own V_old gives advantages
(lambda-return V targets, SARSA Q targets), normalised over the batch's turns; the policy, V, Q,
KL and entropy terms are summed and trained with one backward pass per micro-batch.
"""

from __future__ import annotations

import torch

from streamrl.algos import advantage_stats, sapo_advantages, sapo_targets, sapo_value_loss, value_readout, value_saturation_frac
from streamrl.policy.scoring import ScoreOutput
from streamrl.train.batch import Batch, bootstrap_values
from streamrl.train.learner import Counts, Learner, MicroBatch, Prepared


class SAPOLearner(Learner):
    name = "sapo"
    reads_values = True

    def __init__(self, config, policy, reference=None, reward_range=(0.0, 1.0)):
        super().__init__(config, policy, reference, reward_range)
        if policy.value_token_ids is None:
            raise ValueError("algo sapo needs value tokens, but the policy was loaded without them")
        self.r_max = max(abs(self.reward_range[0]), abs(self.reward_range[1]))

    def readout(self, value_logits: torch.Tensor) -> torch.Tensor:
        """``[..., 2]`` (z[w+], z[w-]) -> ``[...]`` values in [-r_max, r_max]."""
        return value_readout(value_logits, 0, 1, self.r_max, self.algo.value_tau, self.algo.value_squash)

    def prepare(self, batch: Batch, old: ScoreOutput) -> Prepared:
        flat_logits = old.value_logits.reshape(-1, 2)
        v_old = self.readout(flat_logits[batch.pre_action]).double()
        q_old = self.readout(flat_logits[batch.post_action]).double()
        turns = batch.turns
        padded = batch.padded_turns(v_old, done_on_last=self.algo.truncation == "terminal")
        last_values = None
        if self.algo.truncation == "bootstrap":
            last_values = bootstrap_values(batch, lambda positions: self.readout(flat_logits[positions]))
        q_padded = turns.padded(q_old)[0]
        targets = sapo_targets(
            padded["rewards"], padded["values"], q_padded, padded["dones"], padded["mask"],
            gamma=self.algo.gamma, lam=self.algo.lam, last_values=last_values,
        )
        acting = turns.action_tokens > 0  # an aborted turn (no action tokens) keeps only its V target
        adv_padded = sapo_advantages(
            targets.advantages,
            padded["mask"] & turns.padded(acting)[0],
            invalid=turns.padded(turns.invalid.double())[0],
            kappa=self.algo.invalid_penalty * self.r_max,
            norm_measure=self.algo.norm_measure,
            turn_lengths=turns.padded(turns.action_tokens.double())[0],
        )
        adv = turns.flat(adv_padded)
        metrics = advantage_stats(turns.flat(targets.advantages), adv)
        metrics.update(
            value_mean=float(v_old.mean()),
            q_mean=float(q_old.mean()),
            value_saturation_frac=value_saturation_frac(torch.cat([v_old, q_old]), self.r_max),
        )
        extra = {
            "v_old": v_old,
            "q_old": q_old,
            "v_target": turns.flat(targets.v_targets),
            "q_target": turns.flat(targets.q_targets),
            "q_valid": acting,
        }
        return Prepared(turn_advantages=adv, policy_turns=acting, extra=extra, metrics=metrics)

    def extra_loss(self, batch: Batch, prepared: Prepared, micro: MicroBatch, out: ScoreOutput, counts: Counts):
        ids = micro.turn_ids
        extra = prepared.extra
        values = self.readout(out.value_logits[micro.pre_positions])
        q_values = self.readout(out.value_logits[micro.post_positions])
        all_turns = torch.ones_like(ids, dtype=torch.bool)
        value_loss = sapo_value_loss(
            values, extra["v_old"][ids].to(values.dtype), extra["v_target"][ids].to(values.dtype), all_turns,
            r_max=self.r_max, clip=self.algo.value_clip, global_count=counts.turns,
        )
        q_count = float((extra["q_valid"] & counts.turn_mask).sum())
        q_loss = sapo_value_loss(
            q_values, extra["q_old"][ids].to(q_values.dtype), extra["q_target"][ids].to(q_values.dtype), extra["q_valid"][ids],
            r_max=self.r_max, clip=self.algo.value_clip, global_count=q_count,
        )
        loss = self.algo.value_coef * value_loss + self.algo.q_coef * q_loss
        return loss, {"value_loss": float(value_loss.detach()), "q_loss": float(q_loss.detach())}
