"""From trajectories to padded tensors a learner can run, and per-turn bookkeeping.

Each trajectory contributes one sample (full history) or one per turn (per-step). Every turn of the
batch gets a global index ``0..M-1`` (trajectory-major), so per-turn quantities (rewards, values,
advantages) live in flat ``[M]`` tensors, and ``token_turn`` sends them to action tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from streamrl.rollout import Trajectory, to_samples
from streamrl.training.config import RewardConfig


@dataclass
class TurnTable:
    """Flat per-turn facts of a batch, ``[M]`` each (M = turns of all usable trajectories)."""

    trajectory: torch.Tensor  # long, owning trajectory index
    index: torch.Tensor  # long, turn index within its trajectory
    reward: torch.Tensor  # float64, shaped turn reward
    done: torch.Tensor  # bool, the environment terminated on this turn
    invalid: torch.Tensor  # bool, the action's format was invalid
    action_tokens: torch.Tensor  # long, M_t
    last: torch.Tensor  # bool, last turn of its trajectory
    #: a trajectory's first turn sits at ``offsets[i]``; shape [n + 1]
    offsets: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.trajectory.numel())

    def padded(self, values: torch.Tensor, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``[M]`` -> ``[n, T_max]`` by trajectory, plus the validity mask ``[n, T_max]``."""
        lengths = self.offsets[1:] - self.offsets[:-1]
        n, width = lengths.numel(), int(lengths.max()) if lengths.numel() else 0
        out = values.new_full((n, width), fill)
        mask = torch.zeros((n, width), dtype=torch.bool)
        out[self.trajectory, self.index] = values
        mask[self.trajectory, self.index] = True
        return out, mask

    def flat(self, padded: torch.Tensor) -> torch.Tensor:
        """``[n, T_max]`` -> ``[M]`` (inverse of ``padded``)."""
        return padded[self.trajectory, self.index]


@dataclass
class Batch:
    """Right-padded rows ``[N, S]`` plus turn bookkeeping; N = number of samples."""

    input_ids: torch.Tensor  # long
    attention_mask: torch.Tensor  # long
    action_mask: torch.Tensor  # bool, model-generated ids
    rollout_logprobs: torch.Tensor  # float32, 0 off-action
    token_turn: torch.Tensor  # long, global turn index of each action token, -1 elsewhere
    pre_action: torch.Tensor  # long [M], flat position (row * S + col) of each turn's pre-action boundary
    post_action: torch.Tensor  # long [M], flat position of each turn's last action token
    sample_trajectory: torch.Tensor  # long [N], owning trajectory of each row
    #: long [n], flat position of the context after a cut episode's last turn (full history), else -1
    bootstrap: torch.Tensor
    turns: TurnTable
    trajectories: list[Trajectory]
    #: per row, the engine's inputs of block ``block_inputs_layer`` ``[F, H]`` (``TrainingSample``),
    #: when every row has them from the same block; else None (the learner runs the full forward)
    block_inputs: list[torch.Tensor] | None = None
    block_inputs_layer: int | None = None

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    @property
    def width(self) -> int:
        """S: the padded row length (a flat position is ``row * S + column``)."""
        return int(self.input_ids.shape[1])

    def row_of(self, positions: torch.Tensor) -> torch.Tensor:
        """The row of each flat position."""
        return positions // self.width

    def locate(self, rows: list[int], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Which of the flat ``positions`` ``[K]`` fall in ``rows`` (a micro-batch): their indices
        into ``positions``, and their (row within ``rows``, column)."""
        local = torch.full((self.num_rows,), -1, dtype=torch.long)
        local[torch.tensor(rows, dtype=torch.long)] = torch.arange(len(rows))
        owner = local[self.row_of(positions)]
        pick = (owner >= 0).nonzero(as_tuple=True)[0]
        return pick, owner[pick], positions[pick] % self.width

    def value_mask(self) -> torch.Tensor:
        """``[N, S]`` bool: where value readouts are read (turn boundaries and bootstrap positions)."""
        mask = torch.zeros_like(self.action_mask)
        mask.view(-1)[self.pre_action] = True
        mask.view(-1)[self.post_action] = True
        mask.view(-1)[self.bootstrap[self.bootstrap >= 0]] = True
        return mask

    def trajectory_lengths(self) -> torch.Tensor:
        """L_i: action tokens per trajectory, ``[n]`` float64."""
        return torch.tensor([t.num_action_tokens for t in self.trajectories], dtype=torch.float64)

    def padded_turns(self, values: torch.Tensor, done_on_last: bool) -> dict[str, torch.Tensor]:
        """Per-trajectory ``[n, T_max]`` tensors for turn-level GAE: rewards, dones, mask, values.

        ``done_on_last`` (``truncation="terminal"``) marks every trajectory's last turn done.
        """
        turns = self.turns
        dones = turns.done | turns.last if done_on_last else turns.done
        rewards, mask = turns.padded(turns.reward)
        return {
            "rewards": rewards,
            "dones": turns.padded(dones.to(torch.float64))[0],
            "mask": mask,
            "values": turns.padded(values.to(torch.float64))[0],
        }

    def outcomes(self) -> torch.Tensor:
        """R_i: the sum of shaped turn rewards, ``[n]`` float64."""
        sums = torch.zeros(len(self.trajectories), dtype=torch.float64)
        return sums.index_add_(0, self.turns.trajectory, self.turns.reward)

    def rows(self, rows: torch.Tensor | list[int]) -> dict[str, torch.Tensor]:
        """Tensors of a subset of rows, cut to their longest row (for a micro-batch)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        length = int(self.attention_mask[rows].sum(dim=1).max())
        tensors = {
            "input_ids": self.input_ids[rows, :length],
            "attention_mask": self.attention_mask[rows, :length],
            "action_mask": self.action_mask[rows, :length],
            "rollout_logprobs": self.rollout_logprobs[rows, :length],
            "token_turn": self.token_turn[rows, :length],
        }
        if self.block_inputs is not None:
            # positions past what the engine fed (a row's last id, trailing context) stay 0: with
            # causal attention they change only their own outputs, which no action token reads
            parts = [self.block_inputs[int(row)][:length] for row in rows]
            padded = parts[0].new_zeros((len(parts), length, parts[0].shape[-1]))
            for i, part in enumerate(parts):
                padded[i, : part.shape[0]] = part
            tensors["block_inputs"] = padded
        return tensors


def shaped_turn_rewards(trajectory: Trajectory, reward: RewardConfig) -> list[float]:
    """Environment rewards times ``reward.scale``, minus ``invalid_format_penalty`` on
    format-invalid turns and ``ineffective_penalty`` on valid actions the environment could not
    carry out ("Nothing happens."). Shaping only: reported success stays the environment's own."""
    return [
        turn.reward * reward.scale
        - (reward.invalid_format_penalty if not turn.format_valid else 0.0)
        - (reward.ineffective_penalty if turn.format_valid and not turn.action_effective else 0.0)
        for turn in trajectory.turns
    ]


def collate(
    trajectories: list[Trajectory],
    *,
    reward: RewardConfig = RewardConfig(),
    pad_id: int = 0,
) -> Batch:
    """Pad the samples of ``trajectories`` (all with at least one turn) into a ``Batch``; turn
    rewards are shaped by ``reward``."""
    if not trajectories:
        raise ValueError("collate: no trajectories")
    empty = [t.request_id for t in trajectories if not t.turns]
    if empty:
        raise ValueError(f"collate: trajectories without turns: {empty[:3]}")
    samples = to_samples(trajectories)
    width = max(len(s.token_ids) for s in samples)
    n_rows = len(samples)

    offsets = [0]
    for trajectory in trajectories:
        offsets.append(offsets[-1] + len(trajectory.turns))
    n_turns = offsets[-1]

    input_ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n_rows, width), dtype=torch.long)
    action = torch.zeros((n_rows, width), dtype=torch.bool)
    rollout_logp = torch.zeros((n_rows, width), dtype=torch.float32)
    token_turn = torch.full((n_rows, width), -1, dtype=torch.long)
    pre = torch.zeros(n_turns, dtype=torch.long)
    post = torch.zeros(n_turns, dtype=torch.long)
    sample_traj = torch.zeros(n_rows, dtype=torch.long)
    bootstrap = torch.full((len(trajectories),), -1, dtype=torch.long)
    for row, sample in enumerate(samples):
        length = len(sample.token_ids)
        input_ids[row, :length] = torch.tensor(sample.token_ids)
        attention[row, :length] = 1
        action[row, :length] = torch.tensor(sample.action_mask, dtype=torch.bool)
        rollout_logp[row, :length] = torch.tensor(sample.rollout_logprobs)
        sample_traj[row] = sample.trajectory_index
        if sample.bootstrap_position is not None:
            bootstrap[sample.trajectory_index] = row * width + sample.bootstrap_position
        base = offsets[sample.trajectory_index]
        for k, turn_index in enumerate(sample.turn_indices):
            start, end = sample.turn_spans[k]
            global_turn = base + turn_index
            token_turn[row, start:end] = global_turn
            pre[global_turn] = row * width + sample.pre_action_positions[k]
            post[global_turn] = row * width + sample.post_action_positions[k]

    owners, indices, rewards, dones, invalid, lengths, last = [], [], [], [], [], [], []
    for i, trajectory in enumerate(trajectories):
        shaped = shaped_turn_rewards(trajectory, reward)
        for t, turn in enumerate(trajectory.turns):
            owners.append(i)
            indices.append(t)
            rewards.append(shaped[t])
            dones.append(turn.done)
            invalid.append(not turn.format_valid)
            lengths.append(len(turn.action_ids))
            last.append(t == len(trajectory.turns) - 1)
    turns = TurnTable(
        trajectory=torch.tensor(owners, dtype=torch.long),
        index=torch.tensor(indices, dtype=torch.long),
        reward=torch.tensor(rewards, dtype=torch.float64),
        done=torch.tensor(dones, dtype=torch.bool),
        invalid=torch.tensor(invalid, dtype=torch.bool),
        action_tokens=torch.tensor(lengths, dtype=torch.long),
        last=torch.tensor(last, dtype=torch.bool),
        offsets=torch.tensor(offsets, dtype=torch.long),
    )
    layers = {t.block_inputs_layer for t in trajectories}
    # every action id is scored from the position before it: those positions must all have been fed
    complete = len(layers) == 1 and None not in layers and all(
        s.block_inputs is not None and s.block_inputs.shape[0] >= s.turn_spans[-1][1] - 1 for s in samples
    )
    return Batch(input_ids, attention, action, rollout_logp, token_turn, pre, post, sample_traj, bootstrap, turns,
                 list(trajectories), [s.block_inputs for s in samples] if complete else None,
                 layers.pop() if complete else None)


def micro_batches(batch: Batch, rows: list[int], micro_batch_size: int) -> list[list[int]]:
    """Split ``rows`` into micro-batches of similar length (sorted), at most ``micro_batch_size`` each."""
    lengths = batch.attention_mask.sum(dim=1)
    ordered = sorted(rows, key=lambda r: int(lengths[r]))
    return [ordered[i : i + micro_batch_size] for i in range(0, len(ordered), micro_batch_size)]


@dataclass
class MicroBatch:
    """Rows of one forward/backward and the turns whose boundaries fall in them."""

    rows: list[int]
    #: the rows' tensors, cut to their longest row (``Batch.rows``)
    tensors: dict[str, torch.Tensor]
    #: ``[K]`` global turn ids, and their (local row, column) pre- and post-action positions
    turn_ids: torch.Tensor
    pre_positions: tuple[torch.Tensor, torch.Tensor]
    post_positions: tuple[torch.Tensor, torch.Tensor]


def micro_batch(batch: Batch, rows: list[int]) -> MicroBatch:
    turn_ids, turn_rows, pre_cols = batch.locate(rows, batch.pre_action)
    post_cols = batch.post_action[turn_ids] % batch.width  # a turn's boundaries share its row
    return MicroBatch(rows, batch.rows(rows), turn_ids, (turn_rows, pre_cols), (turn_rows, post_cols))


@dataclass
class Counts:
    """Global denominators of one mini-batch (every micro-batch's loss is a share of its mean)."""

    tokens: float  # action tokens in the policy loss
    rows: float
    turns: float
    #: ``[M]`` bool: the turns whose rows are in the mini-batch
    turn_mask: torch.Tensor


def mini_batch_counts(batch: Batch, rows: list[int], loss_mask: torch.Tensor) -> Counts:
    """The denominators of the mini-batch ``rows``; ``loss_mask`` ``[N, S]``: tokens in the loss."""
    row_index = torch.tensor(rows, dtype=torch.long)
    in_rows = torch.zeros(batch.num_rows, dtype=torch.bool)
    in_rows[row_index] = True
    turn_mask = in_rows[batch.row_of(batch.pre_action)]
    return Counts(float(loss_mask[row_index].sum()), float(len(rows)), float(turn_mask.sum()), turn_mask)


def split_rows(order: list[int], parts: int) -> list[list[int]]:
    """``order`` in at most ``parts`` consecutive mini-batches of (nearly) equal size."""
    parts = max(1, min(parts, len(order)))
    size = -(-len(order) // parts)
    return [order[i : i + size] for i in range(0, len(order), size)]


def broadcast_to_tokens(turn_values: torch.Tensor, token_turn: torch.Tensor) -> torch.Tensor:
    """``[M]`` per turn -> ``[N, S]`` per action token, by ``token_turn``; off-action tokens (-1)
    get 0 (False for a bool ``turn_values``). Float values come back as float64."""
    if turn_values.dtype != torch.bool:
        turn_values = turn_values.to(torch.float64)
    padded = torch.cat([turn_values, turn_values.new_zeros(1)])
    return padded[token_turn]  # token_turn -1 picks the trailing zero


def position_chunks(
    batch: Batch, positions: torch.Tensor, micro_batch_size: int
) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Micro-batches of the rows holding flat ``positions``: yields each micro-batch's row
    tensors, which entries of ``positions`` it holds, and those entries' (local row, column)."""
    rows_of = batch.row_of(positions)
    for rows in micro_batches(batch, sorted(set(rows_of.tolist())), micro_batch_size):
        pick, local_rows, cols = batch.locate(rows, positions)
        yield batch.rows(rows), pick, local_rows, cols


def bootstrap_values(batch: Batch, read: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``[n]`` float64: the value after each cut episode's last turn, ``read`` at its flat
    bootstrap position (``truncation: bootstrap``); 0 for episodes without one."""
    has = batch.bootstrap >= 0
    values = torch.zeros(len(batch.trajectories), dtype=torch.float64)
    if has.any():
        values[has] = read(batch.bootstrap[has]).double()
    return values
