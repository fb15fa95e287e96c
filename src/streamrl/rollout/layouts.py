"""Training samples from trajectories, in the layout each trajectory was generated under.

* full history: one sample per trajectory, ``prompt | a1 | bridge(o1) | a2 | ...``;
* per step: one sample per turn, ``prompt_t | a_t``.

Only model-generated ids carry mask 1 (the model's own end-of-turn token included); prompt,
bridge, observation and inserted end-of-turn ids carry mask 0 and a rollout log-prob of 0. The ids
are the ones the engine saw and sampled, concatenated; nothing is re-tokenised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrl.rollout.trajectory import Trajectory, Turn


@dataclass
class TrainingSample:
    """One packed sequence of length S (python lists; positions index ``token_ids``).

    ``turn_spans[t] = (start, end)``: the action ids of the t-th turn it holds are
    ``token_ids[start:end]``. ``pre_action_positions[t] = start - 1`` is the last context token
    (where a state value is read); ``post_action_positions[t] = end - 1`` is the last action token
    (where an action value is read; equal to the pre-action position for an empty action).
    """

    token_ids: list[int]  # [S]
    action_mask: list[int]  # [S], 1 on model-generated ids
    rollout_logprobs: list[float]  # [S], behaviour log-probs, 0 where mask is 0
    turn_spans: list[tuple[int, int]]  # [T]
    pre_action_positions: list[int]  # [T]
    post_action_positions: list[int]  # [T]
    #: index of the owning trajectory in the list given to ``to_samples``
    trajectory_index: int
    #: index in ``trajectory.turns`` of each turn held here
    turn_indices: list[int]
    #: full history, cut episode: the last position of the trailing environment ids, i.e. the
    #: pre-action boundary of the turn never taken (for bootstrapping); None otherwise
    bootstrap_position: int | None = None
    #: the engine's inputs of block ``Trajectory.block_inputs_layer`` at the ids it fed, ``[F, H]``
    #: (F: S - 1, the last id never fed, or fewer with trailing context), or None
    block_inputs: Any = None

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)


class _Packer:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.spans: list[tuple[int, int]] = []

    def add_context(self, ids: list[int]) -> None:
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def add_action(self, turn: Turn) -> None:
        if not self.ids:
            raise ValueError("a turn's action cannot start a sample: its context ids are empty")
        start = len(self.ids)
        self.ids.extend(turn.action_ids)
        self.mask.extend([1] * len(turn.action_ids))
        self.logprobs.extend(turn.logprobs)
        self.spans.append((start, len(self.ids)))


def _sample(packer: _Packer, trajectory_index: int, turn_indices: list[int]) -> TrainingSample:
    return TrainingSample(
        token_ids=packer.ids,
        action_mask=packer.mask,
        rollout_logprobs=packer.logprobs,
        turn_spans=packer.spans,
        pre_action_positions=[start - 1 for start, _ in packer.spans],
        post_action_positions=[end - 1 for _, end in packer.spans],
        trajectory_index=trajectory_index,
        turn_indices=turn_indices,
    )


def full_history_sample(trajectory: Trajectory, trajectory_index: int = 0) -> TrainingSample:
    """The whole transcript as one sample (a trajectory generated with layout "full_history")."""
    _check_layout(trajectory, "full_history")
    packer = _Packer()
    for turn in trajectory.turns:
        packer.add_context(turn.context_ids)
        packer.add_action(turn)
    bootstrap = None
    if trajectory.trailing_context_ids:
        packer.add_context(trajectory.trailing_context_ids)
        bootstrap = len(packer.ids) - 1
    sample = _sample(packer, trajectory_index, list(range(len(trajectory.turns))))
    sample.bootstrap_position = bootstrap
    sample.block_inputs = trajectory.block_inputs[0] if trajectory.block_inputs else None
    return sample


def per_step_samples(trajectory: Trajectory, trajectory_index: int = 0) -> list[TrainingSample]:
    """One sample per turn (a trajectory generated with layout "per_step")."""
    _check_layout(trajectory, "per_step")
    samples = []
    for index, turn in enumerate(trajectory.turns):
        packer = _Packer()
        packer.add_context(turn.context_ids)
        packer.add_action(turn)
        samples.append(_sample(packer, trajectory_index, [index]))
        if trajectory.block_inputs:
            samples[-1].block_inputs = trajectory.block_inputs[index]
    return samples


def to_samples(trajectories: list[Trajectory]) -> list[TrainingSample]:
    """Samples of every trajectory in its own layout; trajectories without turns yield none."""
    samples: list[TrainingSample] = []
    for index, trajectory in enumerate(trajectories):
        if not trajectory.turns:
            continue
        if trajectory.layout == "full_history":
            samples.append(full_history_sample(trajectory, index))
        else:
            samples.extend(per_step_samples(trajectory, index))
    return samples


def _check_layout(trajectory: Trajectory, layout: str) -> None:
    if trajectory.layout != layout:
        raise ValueError(
            f"trajectory {trajectory.request_id} was generated with layout {trajectory.layout!r}; "
            f"its samples must use that layout, not {layout!r} (the prompts differ)"
        )
