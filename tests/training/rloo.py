"""A test-only algorithm, RLOO (REINFORCE leave-one-out): groups of ``group_size`` episodes per
prompt, each trajectory's advantage its outcome minus the mean outcome of the rest of its group.
It exists to show what adding an algorithm costs: this module plus one row of the table."""

from __future__ import annotations

from typing import Any, Literal

import torch

from streamrl.rollout import PromptSource, UniformPromptSource
from streamrl.training.algo_config import GroupConfig
from streamrl.training.algorithms.base import Prepared, Setup, Stateless
from streamrl.training.batch import Batch


class RLOOConfig(GroupConfig):
    name: Literal["rloo"] = "rloo"


def leave_one_out(rewards: torch.Tensor, groups: list[str]) -> torch.Tensor:
    """``[n]`` outcomes -> ``[n]`` ``R_i - mean_{j != i in its group} R_j`` (0 for a lone member)."""
    names = {name: k for k, name in enumerate(dict.fromkeys(groups))}
    index = torch.tensor([names[g] for g in groups])
    sums = torch.zeros(len(names), dtype=rewards.dtype).index_add_(0, index, rewards)
    sizes = torch.zeros(len(names), dtype=rewards.dtype).index_add_(0, index, torch.ones_like(rewards))
    others = (sizes[index] - 1).clamp(min=1)
    return torch.where(sizes[index] > 1, rewards - (sums[index] - rewards) / others, torch.zeros_like(rewards))


class RLOO(Stateless):
    rollout_mode = "group"

    def __init__(self, config: RLOOConfig, setup: Setup):
        self.group_size = config.group_size

    def prompt_source(self, prompt_ids: list[str]) -> PromptSource:
        return UniformPromptSource(prompt_ids)

    def advantages(self, batch: Batch, old: Any, step: int) -> Prepared:
        adv = leave_one_out(batch.outcomes(), [t.group_id or t.request_id for t in batch.trajectories])
        return Prepared(turn_advantages=adv[batch.turns.trajectory], metrics={"adv_abs_mean": float(adv.abs().mean())})
