"""Collation, micro-batching and the index arithmetic of ``streamrl.training.batch``, and the one
optimiser step (``streamrl.training.optim``): unit tests on hand-built trajectories."""

from __future__ import annotations

import pytest
import torch

from streamrl.rollout import DispatchRecord, Trajectory, Turn
from streamrl.training.batch import (
    bootstrap_values,
    broadcast_to_tokens,
    collate,
    micro_batch,
    micro_batches,
    mini_batch_counts,
    position_chunks,
    split_rows,
)
from streamrl.training.critic import ValueTargets
from streamrl.training.errors import NonFiniteError
from streamrl.training.optim import clip_and_step


def _turn(context: list[int], action: list[int], reward: float = 0.0, done: bool = False) -> Turn:
    return Turn(context_ids=context, action_ids=action, logprobs=[-0.5] * len(action), action_text="x", action="x",
                format_valid=True, action_effective=True, reward=reward, done=done,
                finish_reason="stop", policy_version=0, observation="o")


def _full(request: str, turns: list[Turn], trailing: list[int] | None = None) -> Trajectory:
    return Trajectory(DispatchRecord(request, "p", 0, 0), "full_history", turns, outcome=0.0,
                      end_reason="max_turns" if trailing else "terminated", trailing_context_ids=trailing or [])


def _batch():
    # row 0: [1 2 | 3 4 | 5 | 6 7 7 | 8 9]  two turns, cut, trailing ids 8 9
    # row 1: [1 | 3]                        one turn
    # rows 2, 3: per step, one turn each
    a = _full("a", [_turn([1, 2], [3, 4]), _turn([5], [6, 7, 7], reward=1.0)], trailing=[8, 9])
    b = _full("b", [_turn([1], [3], done=True)])
    c = Trajectory(DispatchRecord("c", "p", 1, 0), "per_step", [_turn([1, 1, 1], [2]), _turn([1, 1], [2, 2], done=True)], outcome=1.0)
    return collate([a, b, c]), (a, b, c)


def test_collate_pads_rows_and_indexes_every_turn():
    batch, _ = _batch()
    assert batch.num_rows == 4 and batch.width == 10
    assert batch.input_ids[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 7, 8, 9]
    assert batch.attention_mask.sum(dim=1).tolist() == [10, 2, 4, 4]
    assert batch.action_mask[0].tolist() == [False, False, True, True, False, True, True, True, False, False]
    assert batch.token_turn[0].tolist() == [-1, -1, 0, 0, -1, 1, 1, 1, -1, -1]
    assert batch.turns.trajectory.tolist() == [0, 0, 1, 2, 2]
    assert batch.turns.offsets.tolist() == [0, 2, 3, 5]
    assert batch.sample_trajectory.tolist() == [0, 1, 2, 2]
    # pre-action boundary: the last context token; post: the last action token (flat positions)
    assert batch.pre_action.tolist() == [1, 4, 10, 22, 31]
    assert batch.post_action.tolist() == [3, 7, 11, 23, 33]
    assert batch.bootstrap.tolist() == [9, -1, -1]
    assert batch.outcomes().tolist() == [1.0, 0.0, 0.0]


def test_locate_and_value_mask():
    batch, _ = _batch()
    pick, rows, cols = batch.locate([3, 1], batch.pre_action)
    assert pick.tolist() == [2, 4] and rows.tolist() == [1, 0] and cols.tolist() == [0, 1]
    assert batch.row_of(batch.post_action).tolist() == [0, 0, 1, 2, 3]
    mask = batch.value_mask()
    assert mask.view(-1).nonzero().squeeze(1).tolist() == [1, 3, 4, 7, 9, 10, 11, 20 + 2, 20 + 3, 30 + 1, 30 + 3]


def test_broadcast_to_tokens_gives_each_action_token_its_turn_value():
    batch, _ = _batch()
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    tokens = broadcast_to_tokens(values, batch.token_turn)
    assert tokens.dtype == torch.float64
    assert tokens[0].tolist() == [0, 0, 1, 1, 0, 2, 2, 2, 0, 0]
    assert tokens[3].tolist()[:4] == [0, 0, 5, 5]
    keep = broadcast_to_tokens(torch.tensor([True, False, True, True, False]), batch.token_turn)
    assert keep.dtype == torch.bool and int(keep.sum()) == 2 + 1 + 1
    assert torch.equal(keep, keep & batch.action_mask)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_micro_batches_partition_rows_by_length(size):
    batch, _ = _batch()
    parts = micro_batches(batch, [0, 1, 2, 3], size)
    assert sorted(r for part in parts for r in part) == [0, 1, 2, 3]
    assert all(len(part) <= size for part in parts)
    lengths = [int(batch.attention_mask[r].sum()) for part in parts for r in part]
    assert lengths == sorted(lengths)  # similar lengths share a micro-batch
    for part in parts:
        tensors = batch.rows(part)
        assert tensors["input_ids"].shape == (len(part), max(int(batch.attention_mask[r].sum()) for r in part))


def test_micro_batch_locates_each_turn_of_its_rows():
    batch, _ = _batch()
    for rows in ([0], [2, 1], [3, 0, 2]):
        micro = micro_batch(batch, rows)
        owned = [turn for turn in range(batch.turns.size) if int(batch.row_of(batch.pre_action[turn])) in rows]
        assert sorted(micro.turn_ids.tolist()) == owned
        for positions, flat in ((micro.pre_positions, batch.pre_action), (micro.post_positions, batch.post_action)):
            local_rows, cols = positions
            expected = batch.input_ids.view(-1)[flat[micro.turn_ids]]
            assert torch.equal(micro.tensors["input_ids"][local_rows, cols], expected)


def test_mini_batch_counts_are_the_global_denominators():
    batch, _ = _batch()
    loss_mask = batch.action_mask.clone()
    loss_mask[0] = False  # a row whose tokens are out of the loss still counts as a row
    counts = mini_batch_counts(batch, [0, 2], loss_mask)
    assert counts.tokens == float(loss_mask[2].sum()) and counts.rows == 2.0
    in_rows = [int(batch.row_of(batch.pre_action[turn])) in (0, 2) for turn in range(batch.turns.size)]
    assert counts.turn_mask.tolist() == in_rows and counts.turns == float(sum(in_rows))


@pytest.mark.parametrize(("rows", "parts", "sizes"), [(7, 1, [7]), (7, 2, [4, 3]), (7, 3, [3, 3, 1]), (2, 5, [1, 1])])
def test_split_rows_keeps_the_order_in_nearly_equal_mini_batches(rows, parts, sizes):
    order = list(range(rows))[::-1]
    split = split_rows(order, parts)
    assert [len(part) for part in split] == sizes and [r for part in split for r in part] == order


@pytest.mark.parametrize("size", [1, 2, 4])
def test_position_chunks_cover_each_position_once_at_its_token(size):
    batch, _ = _batch()
    seen = []
    for tensors, pick, rows, cols in position_chunks(batch, batch.post_action, size):
        flat = batch.input_ids.view(-1)[batch.post_action[pick]]
        assert torch.equal(tensors["input_ids"][rows, cols], flat)
        seen += pick.tolist()
    assert sorted(seen) == list(range(batch.turns.size))


def test_bootstrap_values_read_only_cut_episodes():
    batch, _ = _batch()
    read = []
    values = bootstrap_values(batch, lambda positions: read.append(positions.tolist()) or positions.float() * 10)
    assert read == [[9]] and values.tolist() == [90.0, 0.0, 0.0] and values.dtype == torch.float64


def test_clip_and_step_clips_steps_clears_and_guards():
    layer = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    before = layer.weight.detach().clone()
    (layer(torch.tensor([[30.0, 40.0]])).sum()).backward()
    norm = clip_and_step(layer.parameters(), optimizer, 1.0, step=1, model=layer)
    assert norm == pytest.approx((30**2 + 40**2 + 1) ** 0.5)
    assert float((before - layer.weight.detach()).norm()) <= 1.0 + 1e-6  # the step used the clipped gradient
    assert all(p.grad is None for p in layer.parameters())
    (layer(torch.tensor([[float("nan"), 1.0]])).sum()).backward()
    with pytest.raises(NonFiniteError, match="step 2: non-finite critic gradient norm"):
        clip_and_step(layer.parameters(), optimizer, 1.0, step=2, model=layer, what="critic ")


def _critic(micro_batch_size: int):
    from streamrl.policy.loading import load_policy
    from streamrl.training.critic import CriticUpdater

    torch.manual_seed(0)
    policy = load_policy("tiny", seed=0)
    updater = CriticUpdater(policy, lr=0.05, micro_batch_size=micro_batch_size, value_clip=10.0)
    updater.optimizer = torch.optim.SGD(updater.model.parameters(), lr=0.05)
    return updater


def test_critic_updater_starts_at_zero_and_fits_returns_whatever_the_micro_batching():
    batch, _ = _batch()
    updaters = [_critic(1), _critic(4)]
    returns = torch.tensor([1.0, 1.0, -1.0, 0.5, 0.5])
    for updater in updaters:
        v_old = updater.values(batch, batch.pre_action)
        assert torch.equal(v_old, torch.zeros(batch.turns.size))  # zero-initialised head
        metrics = updater.update(batch, ValueTargets(v_old, returns), step=1)
        assert metrics["critic_loss"] > 0 and metrics["critic_grad_norm"] > 0
    # global denominators: one micro-batch per row or one for all gives the same step
    for a, b in zip(updaters[0].model.parameters(), updaters[1].model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    updater = updaters[1]
    for step in range(2, 30):
        v_old = updater.values(batch, batch.pre_action)
        updater.update(batch, ValueTargets(v_old, returns), step=step)
    error = (updater.values(batch, batch.pre_action) - returns).abs().mean()
    assert float(error) < 0.5 * float(returns.abs().mean())
    restored = _critic(4)
    restored.load_state_dict(updater.state_dict())
    assert torch.equal(restored.values(batch, batch.pre_action), updater.values(batch, batch.pre_action))
