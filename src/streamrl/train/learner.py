"""The learner base: one optimiser step (or a few PPO epochs) from a batch of trajectories.

An algorithm (``streamrl.train.algorithms``) supplies what differs: where prompts come from,
how turn advantages are computed, and optional extra loss terms (SAPO's value heads). Everything
else is shared here: collation, proximal and reference log-probs, truncated importance weights,
the clipped policy loss with global denominators over micro-batches, gradient clipping, metrics.

Formulas live in ``streamrl.algos``; this module only assembles them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import torch

from streamrl.algos import aggregate, kl_estimate, policy_drift, ppo_policy_loss, tis_weights
from streamrl.policy.modeling import enable_gradient_checkpointing
from streamrl.policy.scoring import ScoreOutput, forward_for_loss, score
from streamrl.rollout import PromptSource, Trajectory, UniformPromptSource
from streamrl.rollout.trajectory import turn_stats
from streamrl.train.batch import Batch, broadcast_to_tokens, collate, micro_batches, shaped_turn_rewards
from streamrl.train.config import Config
from streamrl.train.optim import check_finite_loss, clip_and_step


@dataclass
class Prepared:
    """What an algorithm computes before the update (all detached)."""

    #: per global turn ``[M]``: the advantage broadcast to that turn's action tokens
    turn_advantages: torch.Tensor
    #: turns whose tokens enter the policy loss ``[M]`` bool (default: all)
    policy_turns: torch.Tensor | None = None
    #: algorithm-specific tensors for ``extra_loss``
    extra: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Probe:
    """The first micro-batch of an update and its log-probs before the update (to measure drift)."""

    tensors: dict[str, torch.Tensor]
    logprobs: torch.Tensor


@dataclass
class Counts:
    """Global denominators of one mini-batch (every micro-batch's loss is a share of its mean)."""

    tokens: float  # action tokens in the policy loss
    rows: float
    turns: float
    #: ``[M]`` bool: the turns whose rows are in the mini-batch
    turn_mask: torch.Tensor


@dataclass
class MicroBatch:
    rows: list[int]
    tensors: dict[str, torch.Tensor]
    #: global turn ids whose boundaries fall in these rows, and their (local row, column) positions
    turn_ids: torch.Tensor
    pre_positions: tuple[torch.Tensor, torch.Tensor]
    post_positions: tuple[torch.Tensor, torch.Tensor]


#: ``await play(prompt_ids, request_prefix)``: one episode per prompt id with the current policy
#: and the training episode settings, outside the rollout stream (the loop provides it)
Play = Callable[[list[str], str], Awaitable[list[Trajectory]]]


class Learner:
    """Subclasses set ``name`` and implement ``prepare``; see ``streamrl.train.algorithms``."""

    name = "base"
    #: read values at turn boundaries in the training forward (SAPO)
    reads_values = False
    #: keep the update's first micro-batch and its log-probs before the update (SPO's drift probe)
    measures_drift = False

    def __init__(
        self, config: Config, policy: Any, reference: Any | None = None, reward_range: tuple[float, float] = (0.0, 1.0)
    ):
        self.config = config
        #: the environment's reward range times ``reward.scale``: outcomes live here
        self.reward_range = (reward_range[0] * config.reward.scale, reward_range[1] * config.reward.scale)
        self.algo = config.algo
        self.policy = policy
        self.reference = reference
        self.model = policy.model
        if config.model.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(),
            lr=config.optim.lr,
            betas=tuple(config.optim.betas),
            weight_decay=config.optim.weight_decay,
        )
        self.temperature = config.rollout.temperature
        self.steps_done = 0
        #: the last step's per-turn advantages by request id (trajectories in its loss only)
        self.last_advantages: dict[str, list[float]] = {}

    # -- what algorithms override ---------------------------------------------------------------

    def rollout_mode(self) -> str:
        """``"stream"`` (one trajectory per dispatch) or ``"group"`` (``group_size`` per prompt)."""
        return "stream"

    def group_size(self) -> int:
        return 1

    def make_source(self, prompt_ids: list[str]) -> PromptSource:
        return UniformPromptSource(prompt_ids)

    async def warm_start(self, prompt_ids: list[str], play: Play) -> str | None:
        """Once, before the first step of a fresh run: initialise algorithm state from episodes of
        the initial policy (SPO's offline prior); returns a line for the log, or None."""
        return None

    def prepare(self, batch: Batch, old: ScoreOutput | None) -> Prepared:
        raise NotImplementedError

    def needs_old_pass(self) -> bool:
        """Whether advantages need a no-grad forward before the update (values, multi-epoch)."""
        return self.algo.epochs > 1 or self.algo.mini_batches > 1 or self.reads_values

    def extra_loss(
        self, batch: Batch, prepared: Prepared, micro: MicroBatch, out: ScoreOutput, counts: Counts
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        return None, {}

    def finish(
        self, delivered: list[Trajectory], batch: Batch | None, prepared: Prepared | None, probe: Probe | None
    ) -> dict[str, float]:
        """After the update (or its skip: ``batch`` None): absorb results into trackers, train a critic."""
        return {}

    def observe(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Every delivered trajectory, stale or crashed ones included (before the update)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))

    def tensor_state(self) -> dict[str, Any]:
        """Tensors to checkpoint with ``torch.save`` (the policy weights are saved separately)."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_tensor_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    # -- helpers for algorithms -------------------------------------------------------------------

    @property
    def excluded_ids(self) -> tuple[int, ...]:
        return tuple(self.policy.banned_token_ids)

    def outcome(self, trajectory: Trajectory) -> float:
        """R_i in reward units, shaped by the reward config."""
        return sum(shaped_turn_rewards(trajectory, self.config.reward))

    def score_batch(self, model: Any, batch: Batch, values: bool = False) -> ScoreOutput:
        tensors = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "token_mask": batch.action_mask}
        if values:
            tensors["value_mask"] = batch.value_mask()
        return score(
            model,
            tensors,
            micro_batch_size=self.config.optim.micro_batch_size,
            excluded_ids=self.excluded_ids,
            value_token_ids=self.policy.value_token_ids if values else None,
            temperature=self.temperature,
            with_entropy=False,
        )

    # -- the step ---------------------------------------------------------------------------------

    def step(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One learner step. Metrics include the time of each phase (``time_*_s``): scoring with
        the proximal policy (``score_old``, which also reads SAPO's V/Q), with the reference
        (``score_ref``), advantage preparation (``prepare``: PPO's critic values), the actor update,
        and ``finish`` (tracker updates, PPO's critic update). Afterwards ``last_advantages``
        holds the advantage of every turn of every trajectory in the loss (empty when skipped)."""
        clock = _PhaseClock()
        self.last_advantages = {}
        metrics = self.observe(trajectories)
        usable = [t for t in trajectories if t.outcome is not None and t.turns and not t.excluded_from_loss]
        metrics.update(_delivery_metrics(trajectories, usable))
        if not usable:
            metrics.update(self.finish(trajectories, None, None, None), skipped=1.0)
            self.steps_done += 1
            return {**metrics, **clock.metrics()}
        batch = collate(
            usable,
            reward=self.config.reward,
            pad_id=self.policy.tokenizer.pad_token_id or 0,
        )
        clock.lap("collate")
        old = self.score_batch(self.model, batch, values=self.reads_values) if self.needs_old_pass() else None
        clock.lap("score_old")
        ref = None
        if self.algo.kl_coef > 0:
            if self.reference is None:
                raise RuntimeError("algo.kl_coef > 0 needs a reference model (train.reference_model: true)")
            ref = self.score_batch(self.reference.model, batch).logprobs
        clock.lap("score_ref")
        prepared = self.prepare(batch, old)
        metrics.update(prepared.metrics)
        self.last_advantages = _advantages_by_request(batch, prepared.turn_advantages)
        clock.lap("prepare")
        update_metrics, probe = self._update(batch, prepared, old, ref)
        metrics.update(update_metrics)
        clock.lap("actor_update")
        metrics.update(self.finish(trajectories, batch, prepared, probe))
        clock.lap("finish")
        self.steps_done += 1
        metrics.update(clock.metrics())
        return metrics

    def _update(
        self, batch: Batch, prepared: Prepared, old: ScoreOutput | None, ref: torch.Tensor | None
    ) -> tuple[dict[str, float], Probe | None]:
        algo, optim = self.algo, self.config.optim
        token_adv = broadcast_to_tokens(prepared.turn_advantages, batch.token_turn).float()
        loss_mask = batch.action_mask.clone()
        if prepared.policy_turns is not None:
            loss_mask &= broadcast_to_tokens(prepared.policy_turns, batch.token_turn)
        policy_active = bool((token_adv[loss_mask] != 0).any())
        if not policy_active and not self.reads_values and not algo.kl_coef:
            return {"actor_skipped": 1.0}, None

        self.model.train()
        weighted: dict[str, float] = {}  # token-weighted means (PPO diagnostics)
        shares: dict[str, float] = {}  # global-denominator shares: their sum is the mini-batch value
        ratio_max, grad_norms, probe = 1.0, [], None
        norm_length = algo.norm_length or self._max_response_tokens(batch)
        generator = torch.Generator().manual_seed(self.config.train.seed * 100_003 + self.steps_done)
        for _ in range(algo.epochs):
            order = list(range(batch.num_rows))
            if algo.mini_batches > 1:
                order = torch.randperm(batch.num_rows, generator=generator).tolist()
            for mini in _split(order, algo.mini_batches):
                counts = self._counts(batch, mini, loss_mask)
                for rows in micro_batches(batch, mini, optim.micro_batch_size):
                    micro = self._micro(batch, rows)
                    out = self._forward(micro)
                    logp = out.logprobs
                    mask = _cut(loss_mask, rows, logp).bool()
                    old_logp = logp.detach() if old is None else _cut(old.logprobs, rows, logp)
                    if probe is None and self.measures_drift:
                        probe = Probe(micro.tensors, logp.detach())
                    # how far the trainer's policy has moved from the one that generated the tokens
                    # (staleness plus engine/trainer numerics): KL(pi_rollout || pi_old), k3
                    behaviour_kl = kl_estimate(micro.tensors["rollout_logprobs"], old_logp, "k3")
                    weighted["behaviour_kl"] = weighted.get("behaviour_kl", 0.0) + float(behaviour_kl[mask].sum())
                    tis = None
                    if algo.tis_cap is not None:
                        tis = tis_weights(old_logp, micro.tensors["rollout_logprobs"], algo.tis_cap)
                        weighted["tis_weight"] = weighted.get("tis_weight", 0.0) + float(tis[mask].sum())
                    loss, stats = ppo_policy_loss(
                        logp, old_logp, _cut(token_adv, rows, logp), mask,
                        clip_low=algo.clip_low, clip_high=algo.clip_high, dual_clip=algo.dual_clip,
                        agg=algo.agg, tis_weights=tis, norm_length=norm_length,
                        global_tokens=counts.tokens, global_seqs=counts.rows,
                    )
                    ratio_max = max(ratio_max, stats.pop("ratio_max"))
                    tokens = stats.pop("tokens")
                    for key, value in stats.items():  # per-call means -> token-weighted sums
                        weighted[key] = weighted.get(key, 0.0) + value * tokens
                    share = {"policy_loss": float(loss.detach())}
                    if ref is not None:
                        kl = aggregate(kl_estimate(logp, _cut(ref, rows, logp), algo.kl_estimator), mask, global_tokens=counts.tokens)
                        loss = loss + algo.kl_coef * kl
                        share["kl_ref"] = float(kl.detach())
                    if out.entropy is not None:
                        ent = aggregate(out.entropy, mask, global_tokens=counts.tokens)
                        share["entropy"] = float(ent.detach())
                        if algo.entropy_coef:
                            loss = loss - algo.entropy_coef * ent
                    extra, extra_share = self.extra_loss(batch, prepared, micro, out, counts)
                    if extra is not None:
                        loss = loss + extra
                    share.update(extra_share)
                    share["loss"] = float(loss.detach())
                    check_finite_loss(self.steps_done + 1, share)
                    loss.backward()
                    for key, value in share.items():
                        shares[key] = shares.get(key, 0.0) + value
                grad_norms.append(clip_and_step(
                    self.policy.trainable_parameters(), self.optimizer, optim.grad_clip,
                    step=self.steps_done + 1, model=self.model,
                ))
        self.model.eval()
        total_tokens = max(float(loss_mask.sum()) * algo.epochs, 1.0)
        metrics = {key: value / total_tokens for key, value in weighted.items()}
        metrics.update({key: value / len(grad_norms) for key, value in shares.items()})
        metrics.update(grad_norm=sum(grad_norms) / len(grad_norms), ratio_max=ratio_max, optimizer_steps=float(len(grad_norms)))
        return metrics, probe

    def _max_response_tokens(self, batch: Batch) -> int:
        """Dr.GRPO's constant L_norm: the longest response a row can hold under this config."""
        rollout = self.config.rollout
        if rollout.layout == "per_step":
            return rollout.max_new_tokens
        turns = max(len(t.turns) for t in batch.trajectories)
        return rollout.max_new_tokens * (rollout.max_turns or turns)

    def policy_drift(self, probe: Probe) -> float:
        """Mean |log pi_now - log pi_before| over the probe's action tokens (SPO's drift D)."""
        with torch.no_grad():
            now = self._forward_rows(probe.tensors).logprobs
        mask = probe.tensors["action_mask"]
        return policy_drift(now[mask], probe.logprobs[mask])

    def _counts(self, batch: Batch, rows: list[int], loss_mask: torch.Tensor) -> Counts:
        row_index = torch.tensor(rows, dtype=torch.long)
        in_rows = torch.zeros(batch.num_rows, dtype=torch.bool)
        in_rows[row_index] = True
        turn_mask = in_rows[batch.row_of(batch.pre_action)]
        return Counts(float(loss_mask[row_index].sum()), float(len(rows)), float(turn_mask.sum()), turn_mask)

    def _micro(self, batch: Batch, rows: list[int]) -> MicroBatch:
        turn_ids, turn_rows, pre_cols = batch.locate(rows, batch.pre_action)
        post_cols = batch.post_action[turn_ids] % batch.width  # a turn's boundaries share its row
        return MicroBatch(rows, batch.rows(rows), turn_ids, (turn_rows, pre_cols), (turn_rows, post_cols))

    def _forward_rows(
        self, tensors: dict[str, torch.Tensor], value_mask: torch.Tensor | None = None, with_entropy: bool = False
    ) -> ScoreOutput:
        return forward_for_loss(
            self.model,
            tensors["input_ids"],
            tensors["attention_mask"],
            token_mask=tensors["action_mask"],
            excluded_ids=self.excluded_ids,
            value_token_ids=self.policy.value_token_ids if value_mask is not None else None,
            value_mask=value_mask,
            temperature=self.temperature,
            with_entropy=with_entropy,
        )

    def _forward(self, micro: MicroBatch) -> ScoreOutput:
        value_mask = None
        if self.reads_values:
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


def _advantages_by_request(batch: Batch, turn_advantages: torch.Tensor) -> dict[str, list[float]]:
    values, offsets = turn_advantages.tolist(), batch.turns.offsets.tolist()
    return {t.request_id: values[offsets[i] : offsets[i + 1]] for i, t in enumerate(batch.trajectories)}


def _cut(full: torch.Tensor, rows: list[int], like: torch.Tensor) -> torch.Tensor:
    return full[rows][:, : like.shape[1]].to(like.dtype)


def _split(order: list[int], parts: int) -> list[list[int]]:
    parts = max(1, min(parts, len(order)))
    size = -(-len(order) // parts)
    return [order[i : i + size] for i in range(0, len(order), size)]


def _delivery_metrics(delivered: list[Trajectory], usable: list[Trajectory]) -> dict[str, float]:
    n = max(len(delivered), 1)
    finished = [t for t in delivered if t.outcome is not None]
    lags = [t.lag for t in delivered if t.lag is not None]
    turns_mean, format_invalid_frac = turn_stats(delivered)
    return {
        "trajectories": float(len(delivered)),
        "trajectories_in_loss": float(len(usable)),
        "success": sum(t.won for t in finished) / max(len(finished), 1),
        "outcome_mean": sum(t.outcome for t in finished) / max(len(finished), 1),
        "crashed_frac": (len(delivered) - len(finished)) / n,
        "stale_frac": sum(t.excluded_from_loss for t in delivered) / n,
        "lag_mean": sum(lags) / max(len(lags), 1),
        "turns_mean": turns_mean,
        "action_tokens_mean": sum(t.num_action_tokens for t in delivered) / n,
        "format_invalid_frac": format_invalid_frac,
    }
