"""GRPO and Dr.GRPO (docs/algorithms.md §2): synchronous groups, group-relative advantages."""

from __future__ import annotations

from streamrl.algos import grpo_advantages, grpo_group_stats
from streamrl.train.batch import Batch
from streamrl.train.learner import Learner, Prepared


class GRPOLearner(Learner):
    name = "grpo"

    def rollout_mode(self) -> str:
        return "group"

    def group_size(self) -> int:
        return self.algo.group_size

    def prepare(self, batch: Batch, old) -> Prepared:
        rewards = batch.outcomes()
        groups = [t.group_id or t.request_id for t in batch.trajectories]
        adv = grpo_advantages(rewards, groups, scale_by_std=self.algo.scale_by_std)
        metrics = grpo_group_stats(rewards, groups)
        metrics["partial_groups"] = float(sum(t.partial_group for t in batch.trajectories))
        return Prepared(turn_advantages=adv[batch.turns.trajectory], metrics=metrics)
