"""What an algorithm is to the learner: the ``Algorithm`` protocol and the values it exchanges.

An algorithm maps delivered trajectories to per-turn advantages (and, optionally, targets for a
critic or for its own auxiliary loss); the learner (``training/learner.py``) owns everything else:
collation, the proximal and reference passes, the policy loss and the optimiser steps. State
crosses between the two only through the arguments and return values below; what an algorithm
keeps across steps (trackers) it checkpoints through ``state_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generic, Literal, Protocol, TypeVar

import torch

from streamrl.policy.scoring import ScoreOutput
from streamrl.rollout import PromptSource, Trajectory
from streamrl.training.batch import Batch, Counts, MicroBatch, shaped_turn_rewards
from streamrl.training.config import OptimConfig, RewardConfig
from streamrl.training.critic import CriticUpdater, ValueTargets

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy

Targets = TypeVar("Targets")

#: ``await play(prompt_ids, request_prefix)``: one episode per prompt id with the current policy
#: and the training episode settings, outside the rollout stream (the loop provides it)
Play = Callable[[list[str], str], Awaitable[list[Trajectory]]]


@dataclass(frozen=True)
class Setup:
    """What an algorithm may know of the run besides its own config section."""

    policy: Policy
    reward: RewardConfig
    #: the environment's reward range times ``reward.scale``: outcomes live here
    reward_range: tuple[float, float]
    #: optimiser settings (PPO's critic uses them with its own learning rate)
    optim: OptimConfig
    gradient_checkpointing: bool = False

    def outcome(self, trajectory: Trajectory) -> float:
        """R_i in reward units, shaped by the reward config."""
        return sum(shaped_turn_rewards(trajectory, self.reward))


@dataclass
class Prepared(Generic[Targets]):
    """What an algorithm computes from a batch before the update (all detached)."""

    #: ``[M]`` per global turn: the advantage broadcast to that turn's action tokens
    turn_advantages: torch.Tensor
    #: ``[M]`` bool: turns whose tokens enter the policy loss (None: all)
    policy_turns: torch.Tensor | None = None
    #: what the algorithm's ``auxiliary_loss`` reads (SAPO's V/Q targets)
    targets: Targets | None = None
    #: what the algorithm's ``critic`` is trained toward beside the actor (PPO)
    value_targets: ValueTargets | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Auxiliary:
    """A loss term added to one micro-batch's policy loss (already a share of the global mean)."""

    loss: torch.Tensor
    #: the terms' values for the metrics (summed over micro-batches like the policy loss)
    terms: dict[str, float]


#: ``auxiliary_loss(prepared, micro, out, counts)``: ``out`` is the micro-batch's training forward
AuxiliaryLoss = Callable[[Prepared[Any], MicroBatch, ScoreOutput, Counts], Auxiliary]
#: ``await warm_start(prompt_ids, play)``: a line for the log, or None
WarmStart = Callable[[list[str], Play], Awaitable[str | None]]


class Algorithm(Protocol):
    """One RL algorithm, as the loop and the learner see it (one module in this package and one
    row of ``training/algo_config.py``'s ``ALGORITHM_TABLE``; constructed as ``Class(section, setup)``)."""

    #: ``"stream"`` (one trajectory per dispatch) or ``"group"`` (``group_size`` per prompt)
    rollout_mode: Literal["stream", "group"]
    group_size: int
    #: ``advantages`` reads the proximal policy's scores (the learner runs a no-grad pass first)
    needs_old_pass: bool
    #: the forwards read the value tokens at turn boundaries (``ScoreOutput.value_logits``)
    reads_values: bool
    #: the learner measures the update's policy drift and passes it to ``after_update`` (SPO)
    measures_drift: bool
    #: a separate critic the learner trains beside the actor on ``Prepared.value_targets`` and
    #: checkpoints (PPO), or None
    critic: CriticUpdater | None
    #: once, before the first step of a fresh run (SPO's offline prior), or None
    warm_start: WarmStart | None
    #: added to every micro-batch's policy loss (SAPO's V and Q losses), or None
    auxiliary_loss: AuxiliaryLoss | None

    def prompt_source(self, prompt_ids: list[str]) -> PromptSource:
        """Where the rollout draws prompts from (SPO's tracker weights, or uniform)."""
        ...

    def advantages(self, batch: Batch, old: ScoreOutput | None, step: int) -> Prepared[Any]:
        """Advantages of the batch's turns before learner step ``step`` (1-based); ``old`` is the
        proximal pass (None unless ``needs_old_pass`` or the update runs several passes)."""
        ...

    def after_update(self, delivered: list[Trajectory], drift: float | None) -> dict[str, float]:
        """After every step, also a skipped one: ``delivered`` is every trajectory of the step
        (stale and crashed ones included, in receipt order); ``drift`` is the update's policy
        drift when ``measures_drift`` (0 without an actor update), else None. Returns metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What the algorithm keeps across steps, as JSON (kept beside the learner's step count)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Defaults:
    """``Algorithm``'s attributes at their usual values: one trajectory per dispatch, no proximal
    pass of its own, no value tokens, no drift, and no critic, warm start or auxiliary loss. An
    algorithm class derives from this (or ``Stateless``) and states only where it differs."""

    rollout_mode: Literal["stream", "group"] = "stream"
    group_size: int = 1
    needs_old_pass: bool = False
    reads_values: bool = False
    measures_drift: bool = False
    critic: CriticUpdater | None = None
    warm_start: WarmStart | None = None
    auxiliary_loss: AuxiliaryLoss | None = None


class Stateless(Defaults):
    """``after_update``, ``state_dict`` and ``load_state_dict`` of an algorithm that keeps nothing
    across steps (its advantages depend on the batch alone, or on a critic the learner keeps)."""

    def after_update(self, delivered: list[Trajectory], drift: float | None) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
