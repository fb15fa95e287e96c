"""What SPO and SPO++ share: a per-prompt tracker that drives dispatch (prioritised sampling,
SPO++'s frozen reads) and may start from an offline prior (their ``warm_start``), and advantages
from outcomes minus a per-trajectory baseline."""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import torch

from streamrl.algos import advantage_stats, spo_advantages, spopp_advantages
from streamrl.rollout import DispatchMeta, Trajectory
from streamrl.training.algorithms.base import Play, Prepared, Setup
from streamrl.training.batch import Batch


class TrackerSource:
    """Samples prompts by the tracker's weights (``w = sqrt(v(1-v)) / N^gamma + eps``).

    With ``freeze=True`` (SPO++'s event-time memory) each dispatch reads and freezes the baseline
    at the serving event ``z``, each arriving result is recorded at its own ``z`` (idempotent per
    request id), and each publish advances the event clock.
    """

    def __init__(
        self,
        prompt_ids: Sequence[str],
        tracker: Any,
        outcome: Callable[[Trajectory], float],
        *,
        freeze: bool,
    ):
        if not prompt_ids:
            raise ValueError("the training prompt pool is empty")
        self._prompt_ids = list(prompt_ids)
        self.tracker = tracker
        self.outcome = outcome
        self.freeze = freeze

    def prompt_ids(self) -> Sequence[str]:
        return self._prompt_ids

    def select(self, candidates: Sequence[str], rng: random.Random) -> str:
        candidates = list(candidates)
        weights = self.tracker.sampling_weights(candidates)
        return rng.choices(candidates, weights=weights, k=1)[0]

    def on_dispatch(self, prompt_id: str) -> DispatchMeta:
        if not self.freeze:
            return DispatchMeta()
        read = self.tracker.dispatch(prompt_id)
        return DispatchMeta(z=read.z, baseline=read.baseline, extra={"v_hat": read.v_hat, "n_eff": read.n_eff})

    def on_result(self, trajectory: Trajectory) -> None:
        if self.freeze and trajectory.outcome is not None and trajectory.dispatch.z is not None:
            self.tracker.record(trajectory.prompt_id, trajectory.dispatch.z, clamp_reward(self.tracker, self.outcome(trajectory)), trajectory.request_id)

    def on_publish(self, version: int) -> None:
        if self.freeze:
            self.tracker.publish()


class OfflinePrior:
    """SPO's offline initialisation, an algorithm's ``warm_start``: ``samples`` (n0) rollouts of the
    initial policy per prompt set each prompt's prior (successes are outcomes above the middle of
    the reward range)."""

    def __init__(self, tracker: Any, setup: Setup, samples: int):
        self.tracker = tracker
        self.setup = setup
        self.samples = samples

    async def __call__(self, prompt_ids: list[str], play: Play) -> str:
        n0 = self.samples
        trajectories = await play([prompt for prompt in prompt_ids for _ in range(n0)], "offline")
        middle = sum(self.setup.reward_range) / 2
        successes = {prompt: 0 for prompt in prompt_ids}
        for trajectory in trajectories:
            if trajectory.outcome is not None and self.setup.outcome(trajectory) > middle:
                successes[trajectory.prompt_id] += 1
        for prompt, count in successes.items():
            self.tracker.init_offline(prompt, count, n0)
        return f"offline prior: {n0} rollouts for each of {len(prompt_ids)} prompts"


def offline_prior(tracker: Any, setup: Setup, samples: int) -> OfflinePrior | None:
    """The warm start of ``offline_samples: samples`` (None for 0: the unseen prior)."""
    return OfflinePrior(tracker, setup, samples) if samples else None


def clamp_reward(tracker: Any, reward: float) -> float:
    """Keep a shaped outcome inside the tracker's reward range (penalties can push it below)."""
    low, high = tracker.reward_range
    return min(max(reward, low), high)


def baseline_advantages(batch: Batch, baselines: list[float], norm_measure: str) -> Prepared:
    """``A_i = R_i - baseline_i``, normalised over the batch by trajectory (``traj``, SPO's N_traj)
    or by action token (``token``, SPO++'s N_tok), broadcast to every turn of the trajectory."""
    rewards = batch.outcomes()
    base = torch.tensor(baselines, dtype=torch.float64)
    lengths = batch.trajectory_lengths()
    token_measure = norm_measure == "token"
    adv = spopp_advantages(rewards, base, lengths) if token_measure else spo_advantages(rewards, base)
    metrics = advantage_stats(rewards - base, adv, lengths if token_measure else None)
    metrics["baseline_mean"] = float(base.mean())
    # mean(baseline - R): each baseline was fixed before its own result was seen, so over a run this
    # estimates the baselines' bias against the success rate of the snapshot that served them
    metrics["baseline_bias"] = float((base - rewards).mean())
    metrics["token_weighted_adv_mean"] = float((lengths * adv).sum() / lengths.sum().clamp(min=1))
    return Prepared(turn_advantages=adv[batch.turns.trajectory], metrics=metrics)
