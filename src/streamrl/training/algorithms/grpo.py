"""GRPO and Dr.GRPO (docs/algorithms.md §2): synchronous groups, group-relative advantages."""

from __future__ import annotations

from typing import Any

from streamrl.algos import grpo_advantages, grpo_group_stats
from streamrl.rollout import PromptSource, UniformPromptSource
from streamrl.training.algo_config import GRPOConfig
from streamrl.training.algorithms.base import Prepared, Setup, Stateless
from streamrl.training.batch import Batch


class GRPO(Stateless):
    rollout_mode = "group"

    def __init__(self, config: GRPOConfig, setup: Setup):
        self.config = config
        self.group_size = config.group_size

    def prompt_source(self, prompt_ids: list[str]) -> PromptSource:
        return UniformPromptSource(prompt_ids)

    def advantages(self, batch: Batch, old: Any, step: int) -> Prepared:
        rewards = batch.outcomes()
        groups = [t.group_id or t.request_id for t in batch.trajectories]
        adv = grpo_advantages(rewards, groups, scale_by_std=self.config.scale_by_std)
        metrics = grpo_group_stats(rewards, groups)
        metrics["partial_groups"] = float(sum(t.partial_group for t in batch.trajectories))
        return Prepared(turn_advantages=adv[batch.turns.trajectory], metrics=metrics)
