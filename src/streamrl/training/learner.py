"""The learner: one optimiser step (or a few PPO epochs) from a batch of trajectories.

The learner is algorithm-blind. An ``Algorithm`` (``training/algorithms/base.py``) supplies what
differs: rollout mode, prompt source, per-turn advantages, optional auxiliary loss and critic,
and its own state. Everything else is here, and only here: collation, proximal and reference
log-probs, truncated importance weights, the clipped policy loss with global denominators over
micro-batches, the optimiser steps of actor and critic, metrics.

Formulas live in ``streamrl.algos``; index arithmetic in ``training/batch.py``; this module only
assembles them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from streamrl.algos import aggregate, kl_estimate, policy_drift, ppo_policy_loss, tis_weights
from streamrl.policy.modeling import enable_gradient_checkpointing, num_blocks
from streamrl.policy.scoring import ScoreOutput, forward_for_loss, score
from streamrl.rollout import Trajectory
from streamrl.rollout.trajectory import format_problem_shares, turn_stats
from streamrl.training.algo_config import PolicyLossConfig
from streamrl.training.algorithms.base import Algorithm, Prepared
from streamrl.training.batch import (
    Batch,
    MicroBatch,
    broadcast_to_tokens,
    collate,
    micro_batch,
    micro_batches,
    mini_batch_counts,
    split_rows,
)
from streamrl.training.config import OptimConfig, RewardConfig
from streamrl.training.errors import NonFiniteError
from streamrl.training.optim import adamw, load_optimizer_state
from streamrl.training.ranks import Ranks

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy


@dataclass(frozen=True)
class UpdateConfig:
    """All the learner reads of the run's configuration."""

    #: the policy-loss switches (the shared fields of the ``algo`` section)
    loss: PolicyLossConfig
    optim: OptimConfig
    #: reward shaping of the collated turn rewards
    reward: RewardConfig
    temperature: float
    #: mini-batch shuffling: seeded by ``seed`` and the step
    seed: int
    gradient_checkpointing: bool
    #: Dr.GRPO's constant L_norm when ``loss.norm_length`` is null: the reply cap
    #: (``Config.reply_token_cap``) times the turns one row can hold (1 per step; None: the batch's
    #: longest trajectory)
    max_new_tokens: int
    turns_per_row: int | None
    #: ``model.train_top_layers``: only the top blocks train (None: all)
    train_top_layers: int | None = None


@dataclass
class _Probe:
    """The first micro-batch of an update and its log-probs before the update (to measure drift)."""

    tensors: dict[str, torch.Tensor]
    logprobs: torch.Tensor


class Learner:
    """Trains ``policy`` with ``algorithm``; ``step(trajectories)`` is one learner step."""

    def __init__(self, algorithm: Algorithm, settings: UpdateConfig, policy: Policy, reference: Any | None = None,
                 ranks: Ranks = Ranks()):
        self.algorithm = algorithm
        #: this process among the learner processes (``training/data_parallel.py``; default: alone)
        self.ranks = ranks
        self.settings = settings
        self.policy = policy
        self.reference = reference
        self.model = policy.model
        if settings.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        policy.limit_training(top_layers=settings.train_top_layers, value_rows=algorithm.reads_values)
        #: the lowest trained block, whose inputs the engine may hand over with each trajectory
        #: (every parameter below it frozen, so they are the same at every version); None: the
        #: learner always runs the full forward
        self.reused_block = reused_block(policy.model, settings.train_top_layers, algorithm.reads_values)
        optim = settings.optim
        self.optimizer = adamw(policy.trainable_parameters(), lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay,
                               eps=optim.eps)
        #: trained beside the actor (PPO's), or None
        self.critic = algorithm.critic
        self.steps_done = 0
        #: the last step's per-turn advantages by request id (trajectories in its loss only)
        self.last_advantages: dict[str, list[float]] = {}

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON: the step count and, beside it, the algorithm's own keys."""
        return {"steps_done": self.steps_done, **self.algorithm.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))
        self.algorithm.load_state_dict(state)

    def tensor_state(self) -> dict[str, Any]:
        """Tensors to checkpoint with ``torch.save`` (the policy weights are saved separately)."""
        return {"optimizer": self.optimizer.state_dict(), **(self.critic.state_dict() if self.critic else {})}

    def load_tensor_state(self, state: dict[str, Any]) -> None:
        load_optimizer_state(self.optimizer, state["optimizer"], self.model)
        if self.critic is not None:
            self.critic.load_state_dict(state)

    # -- the step ---------------------------------------------------------------------------------

    def score_batch(self, model: Any, batch: Batch, values: bool = False) -> ScoreOutput:
        """No-grad log-probs of the batch's action tokens under ``model`` (and value logits)."""
        tensors = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "token_mask": batch.action_mask}
        if values:
            tensors["value_mask"] = batch.value_mask()
        with self.policy.autocast():
            return score(
                model,
                tensors,
                micro_batch_size=self.settings.optim.micro_batch_size,
                excluded_ids=tuple(self.policy.banned_token_ids),
                value_token_ids=self.policy.value_token_ids if values else None,
                temperature=self.settings.temperature,
                with_entropy=False,
            )

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One learner step. Metrics include the time of each phase (``time_*_s``): scoring with
        the proximal policy (``score_old``, which also reads SAPO's V/Q), with the reference
        (``score_ref``), the algorithm's advantages (``prepare``: PPO's critic values), the actor
        update, the critic update (PPO) and the algorithm's ``after_update`` (tracker updates).
        Afterwards ``last_advantages`` holds the advantage of every turn of every trajectory in
        the loss (empty when skipped)."""
        clock = _PhaseClock()
        algorithm, loss_config, step = self.algorithm, self.settings.loss, self.steps_done + 1
        self.last_advantages = {}
        usable = [t for t in trajectories if t.outcome is not None and t.turns and not t.excluded_from_loss]
        metrics = _delivery_metrics(trajectories, usable)
        if not usable:
            drift = 0.0 if algorithm.measures_drift else None
            metrics.update(algorithm.after_update(trajectories, drift), skipped=1.0)
            self.steps_done = step
            return {**metrics, **clock.metrics()}
        batch = collate(usable, reward=self.settings.reward, pad_id=self.policy.tokenizer.pad_token_id or 0)
        if self.reused_block is None or batch.block_inputs_layer != self.reused_block:
            batch.block_inputs = None
        metrics["block_inputs_reused"] = float(batch.block_inputs is not None)
        clock.lap("collate")
        several_passes = loss_config.epochs > 1 or loss_config.mini_batches > 1
        old = None
        if algorithm.needs_old_pass or several_passes:
            old = self.score_batch(self.model, batch, values=algorithm.reads_values)
        clock.lap("score_old")
        ref = None
        if loss_config.kl_coef > 0:
            if self.reference is None:
                raise RuntimeError("loss_config.kl_coef > 0 needs a reference model (train.reference_model: true)")
            ref = self.score_batch(self.reference.model, batch).logprobs
        clock.lap("score_ref")
        prepared = algorithm.advantages(batch, old, step)
        metrics.update(prepared.metrics)
        self.last_advantages = _advantages_by_request(batch, prepared.turn_advantages)
        clock.lap("prepare")
        update_metrics, probe = self._actor_update(batch, prepared, old, ref)
        metrics.update(update_metrics)
        clock.lap("actor_update")
        if self.critic is not None:
            assert prepared.value_targets is not None, "an algorithm with a critic gives its value targets"
            metrics.update(self.critic.update(batch, prepared.value_targets, step=step))
            clock.lap("critic_update")
        drift = None
        if algorithm.measures_drift:
            drift = self._policy_drift(probe) if probe is not None else 0.0
        metrics.update(algorithm.after_update(trajectories, drift))
        clock.lap("after_update")
        self.steps_done = step
        metrics.update(clock.metrics())
        return metrics

    def _actor_update(
        self, batch: Batch, prepared: Prepared, old: ScoreOutput | None, ref: torch.Tensor | None
    ) -> tuple[dict[str, float], _Probe | None]:
        """The actor's update: ``epochs`` passes of ``mini_batches`` optimiser steps each, every
        mini-batch accumulated over micro-batches; returns metrics and, for an algorithm that
        measures drift, the first micro-batch with its log-probs before the update."""
        loss_config, optim, auxiliary_loss = self.settings.loss, self.settings.optim, self.algorithm.auxiliary_loss
        token_adv = broadcast_to_tokens(prepared.turn_advantages, batch.token_turn).float()
        loss_mask = batch.action_mask.clone()
        if prepared.policy_turns is not None:
            loss_mask &= broadcast_to_tokens(prepared.policy_turns, batch.token_turn)
        policy_active = bool((token_adv[loss_mask] != 0).any())
        if not policy_active and auxiliary_loss is None and not loss_config.kl_coef:
            return {"actor_skipped": 1.0}, None

        ranks = self.ranks
        weighted: dict[str, float] = {}  # token-weighted means (PPO diagnostics)
        shares: dict[str, float] = {}  # global-denominator shares: their sum is the mini-batch value
        ratio_max, grad_norms = 1.0, []
        norm_length = self._norm_length(batch)
        plan = self._plan(batch)
        probe = None
        if self.algorithm.measures_drift:  # the first micro-batch, scored before the update (on every rank)
            tensors = micro_batch(batch, plan[0][0][1][0]).tensors
            with torch.no_grad():
                probe = _Probe(tensors, self._forward_rows(tensors).logprobs)
        self.model.train()
        for epoch in plan:
            for mini, micro_rows in epoch:
                counts = mini_batch_counts(batch, mini, loss_mask)
                for rows, live in ranks.share(micro_rows):
                    micro = micro_batch(batch, rows)
                    out = self._forward(micro)
                    logp = out.logprobs
                    mask = _cut(loss_mask, rows, logp).bool()
                    old_logp = logp.detach() if old is None else _cut(old.logprobs, rows, logp)
                    # how far the trainer's policy has moved from the one that generated the tokens
                    # (staleness plus engine/trainer numerics): KL(pi_rollout || pi_old), k3
                    behaviour_kl = kl_estimate(micro.tensors["rollout_logprobs"], old_logp, "k3")
                    pass_weighted = {"behaviour_kl": float(behaviour_kl[mask].sum())}
                    tis = None
                    if loss_config.tis_cap is not None:
                        tis = tis_weights(old_logp, micro.tensors["rollout_logprobs"], loss_config.tis_cap)
                        pass_weighted["tis_weight"] = float(tis[mask].sum())
                    loss, stats = ppo_policy_loss(
                        logp, old_logp, _cut(token_adv, rows, logp), mask,
                        clip_low=loss_config.clip_low, clip_high=loss_config.clip_high, dual_clip=loss_config.dual_clip,
                        agg=loss_config.agg, tis_weights=tis, norm_length=norm_length,
                        global_tokens=counts.tokens, global_seqs=counts.rows,
                    )
                    pass_ratio_max = stats.pop("ratio_max")
                    tokens = stats.pop("tokens")
                    for key, value in stats.items():  # per-call means -> token-weighted sums
                        pass_weighted[key] = value * tokens
                    share = {"policy_loss": float(loss.detach())}
                    if ref is not None:
                        kl = aggregate(kl_estimate(logp, _cut(ref, rows, logp), loss_config.kl_estimator), mask, global_tokens=counts.tokens)
                        loss = loss + loss_config.kl_coef * kl
                        share["kl_ref"] = float(kl.detach())
                    if out.entropy is not None:
                        ent = aggregate(out.entropy, mask, global_tokens=counts.tokens)
                        share["entropy"] = float(ent.detach())
                        if loss_config.entropy_coef:
                            loss = loss - loss_config.entropy_coef * ent
                    if auxiliary_loss is not None:
                        auxiliary = auxiliary_loss(prepared, micro, out, counts)
                        loss = loss + auxiliary.loss
                        share.update(auxiliary.terms)
                    share["loss"] = float(loss.detach())
                    bad = ranks.all_finite(share if live else {})
                    if bad:
                        raise NonFiniteError(f"step {self.steps_done + 1}: non-finite loss ({', '.join(bad)}); "
                                             "training stopped before the update")
                    (loss * ranks.loss_weight(live)).backward()
                    if live:
                        ratio_max = max(ratio_max, pass_ratio_max)
                        for key, value in pass_weighted.items():
                            weighted[key] = weighted.get(key, 0.0) + value
                        for key, value in share.items():
                            shares[key] = shares.get(key, 0.0) + value
                grad_norms.append(ranks.clip_and_step(
                    self.policy.trainable_parameters(), self.optimizer, optim.grad_clip,
                    step=self.steps_done + 1, model=self.model,
                ))
        weighted, shares, ratio_max = ranks.sum(weighted), ranks.sum(shares), ranks.max(ratio_max)
        self.model.eval()
        total_tokens = max(float(loss_mask.sum()) * loss_config.epochs, 1.0)
        metrics = {key: value / total_tokens for key, value in weighted.items()}
        metrics.update({key: value / len(grad_norms) for key, value in shares.items()})
        metrics.update(grad_norm=sum(grad_norms) / len(grad_norms), ratio_max=ratio_max, optimizer_steps=float(len(grad_norms)))
        return metrics, probe

    def _plan(self, batch: Batch) -> list[list[tuple[list[int], list[list[int]]]]]:
        """The update's passes: per epoch, its mini-batches (rows, and those rows cut into
        micro-batches), shuffled by a generator seeded with the run's seed and the step."""
        loss_config = self.settings.loss
        generator = torch.Generator().manual_seed(self.settings.seed * 100_003 + self.steps_done)
        plan = []
        for _ in range(loss_config.epochs):
            order = list(range(batch.num_rows))
            if loss_config.mini_batches > 1:
                order = torch.randperm(batch.num_rows, generator=generator).tolist()
            plan.append([(mini, list(micro_batches(batch, mini, self.settings.optim.micro_batch_size)))
                         for mini in split_rows(order, loss_config.mini_batches)])
        return plan

    def _norm_length(self, batch: Batch) -> int:
        """Dr.GRPO's constant L_norm: the configured one, else the longest response a row can hold."""
        settings = self.settings
        turns = settings.turns_per_row or max(len(t.turns) for t in batch.trajectories)
        return settings.loss.norm_length or settings.max_new_tokens * turns

    def _policy_drift(self, probe: _Probe) -> float:
        """Mean |log pi_now - log pi_before| over the probe's action tokens (SPO's drift D)."""
        with torch.no_grad():
            now = self._forward_rows(probe.tensors).logprobs
        mask = probe.tensors["action_mask"]
        return policy_drift(now[mask], probe.logprobs[mask])

    def _forward_rows(
        self, tensors: dict[str, torch.Tensor], value_mask: torch.Tensor | None = None, with_entropy: bool = False
    ) -> ScoreOutput:
        with self.policy.autocast():
            return forward_for_loss(
                self.model,
                tensors["input_ids"],
                tensors["attention_mask"],
                token_mask=tensors["action_mask"],
                excluded_ids=tuple(self.policy.banned_token_ids),
                value_token_ids=self.policy.value_token_ids if value_mask is not None else None,
                value_mask=value_mask,
                temperature=self.settings.temperature,
                with_entropy=with_entropy,
                block_inputs=None if "block_inputs" not in tensors else (cast(int, self.reused_block), tensors["block_inputs"]),
            )

    def _forward(self, micro: MicroBatch) -> ScoreOutput:
        value_mask = None
        if self.algorithm.reads_values:
            value_mask = torch.zeros_like(micro.tensors["action_mask"])
            value_mask[micro.pre_positions] = True
            value_mask[micro.post_positions] = True
        return self._forward_rows(micro.tensors, value_mask, with_entropy=True)


class _PhaseClock:
    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - self.last
        self.last = now

    def metrics(self) -> dict[str, float]:
        return {**{f"time_{k}_s": v for k, v in self.phases.items()}, "learner_time_s": self.last - self.started}


def reused_block(model: Any, top_layers: int | None, reads_values: bool) -> int | None:
    """The block whose inputs the learner can take from the engine instead of computing them: the
    lowest trained one when only the top ``top_layers`` train and nothing below them does (an
    algorithm that reads values trains the embedding's value rows); None otherwise."""
    layers = num_blocks(model)
    if top_layers is None or reads_values or layers is None or top_layers >= layers:
        return None
    return layers - top_layers


def _advantages_by_request(batch: Batch, turn_advantages: torch.Tensor) -> dict[str, list[float]]:
    values, offsets = turn_advantages.tolist(), batch.turns.offsets.tolist()
    return {t.request_id: values[offsets[i] : offsets[i + 1]] for i, t in enumerate(batch.trajectories)}


def _cut(full: torch.Tensor, rows: list[int], like: torch.Tensor) -> torch.Tensor:
    return full[rows][:, : like.shape[1]].to(like.dtype)


def _delivery_metrics(delivered: list[Trajectory], usable: list[Trajectory]) -> dict[str, float]:
    n = max(len(delivered), 1)
    finished = [t for t in delivered if t.outcome is not None]
    outcomes = [t.outcome for t in delivered if t.outcome is not None]
    lags = [t.lag for t in delivered if t.lag is not None]
    turns_mean, format_invalid_frac = turn_stats(delivered)
    return {
        "trajectories": float(len(delivered)),
        "trajectories_in_loss": float(len(usable)),
        "success": sum(t.won for t in finished) / max(len(finished), 1),
        "outcome_mean": sum(outcomes) / max(len(finished), 1),
        "crashed_frac": (len(delivered) - len(finished)) / n,
        "stale_frac": sum(t.excluded_from_loss for t in delivered) / n,
        "lag_mean": sum(lags) / max(len(lags), 1),
        "turns_mean": turns_mean,
        "action_tokens_mean": sum(t.num_action_tokens for t in delivered) / n,
        "format_invalid_frac": format_invalid_frac,
        **format_problem_shares(delivered),
    }
