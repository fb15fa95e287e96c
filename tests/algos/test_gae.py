"""GAE properties (token level §3.1, turn level §3.2) and the critic loss: spec §3 property tests."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.algos import masked_gae, turn_gae_batched, value_loss


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _reference_gae(rewards, values, dones, gamma, lam, last_value=0.0):
    """Plain-Python GAE over a list of valid positions (the oracle)."""
    adv = [0.0] * len(rewards)
    next_value, next_adv = last_value, 0.0
    for t in reversed(range(len(rewards))):
        cont = gamma * (1.0 - dones[t])
        delta = rewards[t] + cont * next_value - values[t]
        adv[t] = delta + cont * lam * next_adv
        next_value, next_adv = values[t], adv[t]
    return adv


def _outcome_on_last_token(outcomes, mask):
    """Token rewards: each row's outcome on its last action token, 0 elsewhere."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
    rewards = torch.zeros(mask.shape, dtype=outcomes.dtype)
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] = outcomes[rows]
    return rewards


def _random_action_mask(gen, rows, length):
    """Rows of turns: runs of action tokens separated by observation tokens, plus right padding."""
    mask = torch.rand(rows, length, generator=gen) < 0.6
    mask[:, 0] = True  # every row has at least one action token
    return mask


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 6), length=st.integers(1, 40))
def test_ppo_3_1_unit_discount_terminal_reward_token_level(seed, rows, length):
    gen = _gen(seed)
    mask = _random_action_mask(gen, rows, length)
    outcome = torch.randn(rows, generator=gen, dtype=torch.float64)
    values = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    adv, ret = masked_gae(_outcome_on_last_token(outcome, mask), values, mask, gamma=1.0, lam=1.0)
    expected_adv = torch.where(mask, outcome[:, None] - values, torch.zeros_like(values))
    torch.testing.assert_close(adv, expected_adv)
    torch.testing.assert_close(ret, torch.where(mask, outcome[:, None].expand_as(values), torch.zeros_like(values)))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), turns=st.integers(1, 20))
def test_ppo_3_1_unit_discount_terminal_reward_turn_level(seed, turns):
    gen = _gen(seed)
    outcome = float(torch.randn(1, generator=gen))
    rewards = torch.zeros(turns, dtype=torch.float64)
    rewards[-1] = outcome
    dones = torch.zeros(turns)
    dones[-1] = 1.0
    values = torch.randn(turns, generator=gen, dtype=torch.float64)
    every = torch.ones(1, turns, dtype=torch.bool)
    adv, ret = turn_gae_batched(  # the bootstrap value is ignored: the last turn is done
        rewards[None], values[None], dones[None], every, gamma=1.0, lam=1.0, last_values=torch.tensor([123.0])
    )
    adv, ret = adv[0], ret[0]
    torch.testing.assert_close(adv, outcome - values)
    torch.testing.assert_close(ret, torch.full_like(values, outcome))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 5), length=st.integers(1, 30), gamma=st.floats(0.5, 1.0))
def test_ppo_3_2_lambda_zero_is_td_error(seed, rows, length, gamma):
    gen = _gen(seed)
    mask = _random_action_mask(gen, rows, length)
    rewards = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    values = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    dones = (torch.rand(rows, length, generator=gen) < 0.2).double()
    adv, _ = masked_gae(rewards, values, mask, gamma, 0.0, dones=dones)
    for b in range(rows):
        idx = mask[b].nonzero().squeeze(1).tolist()
        for k, t in enumerate(idx):
            next_v = values[b, idx[k + 1]] if k + 1 < len(idx) else 0.0
            delta = rewards[b, t] + gamma * (1 - dones[b, t]) * next_v - values[b, t]
            assert float(adv[b, t]) == pytest.approx(float(delta), abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 5), length=st.integers(1, 30))
def test_ppo_3_2_zero_values_unit_discount_is_reward_to_go(seed, rows, length):
    gen = _gen(seed)
    mask = _random_action_mask(gen, rows, length)
    rewards = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    adv, _ = masked_gae(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0)
    kept = torch.where(mask, rewards, torch.zeros_like(rewards))  # masked rewards are ignored
    to_go = kept.flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(adv, torch.where(mask, to_go, torch.zeros_like(to_go)))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_actions=st.integers(1, 25),
    gamma=st.floats(0.8, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_ppo_3_3_masked_observation_tokens_leave_advantages_unchanged(seed, n_actions, gamma, lam):
    gen = _gen(seed)
    rewards = torch.randn(1, n_actions, generator=gen, dtype=torch.float64)
    values = torch.randn(1, n_actions, generator=gen, dtype=torch.float64)
    base_adv, base_ret = masked_gae(rewards, values, torch.ones(1, n_actions, dtype=torch.bool), gamma, lam)
    # interleave observation tokens with arbitrary rewards and values that must be skipped
    gaps = torch.randint(0, 4, (n_actions,), generator=gen).tolist()
    slots = sum(gaps) + n_actions
    long_rewards = torch.randn(1, slots, generator=gen, dtype=torch.float64) * 100
    long_values = torch.randn(1, slots, generator=gen, dtype=torch.float64) * 100
    mask = torch.zeros(1, slots, dtype=torch.bool)
    pos = 0
    for j, gap in enumerate(gaps):
        pos += gap
        mask[0, pos] = True
        long_rewards[0, pos] = rewards[0, j]
        long_values[0, pos] = values[0, j]
        pos += 1
    adv, ret = masked_gae(long_rewards, long_values, mask, gamma, lam)
    torch.testing.assert_close(adv[mask], base_adv[0])
    torch.testing.assert_close(ret[mask], base_ret[0])
    assert torch.equal(adv[~mask], torch.zeros_like(adv[~mask]))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1), shape=st.tuples(st.integers(1, 6), st.integers(1, 20)), clip=st.floats(0.05, 2.0)
)
def test_ppo_3_4_critic_loss(seed, shape, clip):
    gen = _gen(seed)
    mask = torch.rand(shape, generator=gen) < 0.7
    targets = torch.randn(shape, generator=gen, dtype=torch.float64)
    # V = G with V_old inside the clip range: zero loss
    near = targets + (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * clip
    assert float(value_loss(targets, near, targets, mask, clip)) <= 1e-24  # V_old + (V - V_old) rounds
    # V = G anywhere: zero gradient (beyond the clip range the constant clipped branch keeps a
    # positive loss; see docs/algorithms.md, "critic loss at V = G")
    far = targets + torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    values = targets.clone().requires_grad_(True)
    value_loss(values, far, targets, mask, clip).backward()
    assert float(values.grad.abs().max()) <= 1e-12
    # |V - V_old| <= clip: the plain squared error
    old = targets + torch.randn(shape, generator=gen, dtype=torch.float64)
    within = old + (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * clip
    unclipped = 0.5 * ((within - targets) ** 2)[mask].sum() / max(int(mask.sum()), 1)
    assert float(value_loss(within, old, targets, mask, clip)) == pytest.approx(float(unclipped), rel=1e-12, abs=1e-15)


def test_ppo_3_4_critic_loss_clips_large_moves():
    old, target = torch.tensor([0.0]), torch.tensor([2.0])
    mask = torch.ones(1)
    # V moved past the target by more than the clip: the clipped value is further away and wins
    assert float(value_loss(torch.tensor([3.0]), old, target, mask, 0.5)) == pytest.approx(0.5 * 1.5**2)
    # V moved towards the target beyond the clip: the constant clipped branch wins, no gradient
    values = torch.tensor([2.5], requires_grad=True)
    value_loss(values, torch.tensor([0.0]), torch.tensor([3.0]), mask, 0.5).backward()
    assert float(values.grad) == 0.0
    # V moved away from the target: the unclipped branch wins and pulls V back
    values = torch.tensor([-1.0], requires_grad=True)
    value_loss(values, torch.tensor([0.0]), torch.tensor([3.0]), mask, 0.5).backward()
    assert float(values.grad) == pytest.approx(-4.0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(3, 30), gamma=st.floats(0.5, 1.0), lam=st.floats(0.1, 1.0))
def test_ppo_3_5_done_stops_propagation(seed, length, gamma, lam):
    gen = _gen(seed)
    mask = _random_action_mask(gen, 1, length)
    idx = mask[0].nonzero().squeeze(1)
    if idx.numel() < 2:
        return
    cut = int(idx[int(torch.randint(0, idx.numel() - 1, (1,), generator=gen))])
    dones = torch.zeros(1, length)
    dones[0, cut] = 1.0
    rewards = torch.randn(1, length, generator=gen, dtype=torch.float64)
    values = torch.randn(1, length, generator=gen, dtype=torch.float64)
    later = rewards.clone()
    later[0, cut + 1 :] += 10.0 + torch.rand(length - cut - 1, generator=gen, dtype=torch.float64)
    adv, _ = masked_gae(rewards, values, mask, gamma, lam, dones=dones, last_values=torch.tensor([5.0]))
    adv_later, _ = masked_gae(later, values, mask, gamma, lam, dones=dones, last_values=torch.tensor([5.0]))
    assert torch.equal(adv[0, : cut + 1], adv_later[0, : cut + 1])
    # without the done the same change does reach the earlier positions
    no_done, _ = masked_gae(rewards, values, mask, gamma, lam)
    no_done_later, _ = masked_gae(later, values, mask, gamma, lam)
    assert not torch.equal(no_done[0, cut], no_done_later[0, cut])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 5), turns=st.integers(1, 12))
def test_turn_gae_batched_matches_per_trajectory_oracle_with_bootstrap(seed, rows, turns):
    gen = _gen(seed)
    lengths = torch.randint(1, turns + 1, (rows,), generator=gen)
    mask = torch.arange(turns)[None, :] < lengths[:, None]
    rewards = torch.randn(rows, turns, generator=gen, dtype=torch.float64)
    values = torch.randn(rows, turns, generator=gen, dtype=torch.float64)
    dones = (torch.rand(rows, turns, generator=gen) < 0.3).double()
    last = torch.randn(rows, generator=gen, dtype=torch.float64)
    adv, ret = turn_gae_batched(rewards, values, dones, mask, 0.97, 0.9, last_values=last)
    for b in range(rows):
        n = int(lengths[b])
        expected = _reference_gae(
            rewards[b, :n].tolist(), values[b, :n].tolist(), dones[b, :n].tolist(), 0.97, 0.9, float(last[b])
        )
        torch.testing.assert_close(adv[b, :n], torch.tensor(expected, dtype=torch.float64))
        torch.testing.assert_close(ret[b, :n], adv[b, :n] + values[b, :n])
        assert torch.equal(adv[b, n:], torch.zeros(turns - n, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gamma": 1.5}, "gamma"),
        ({"lam": -0.1}, "lam"),
        ({"last_values": torch.zeros(3)}, "last_values has shape"),
        ({"mask": torch.ones(2, 3)}, "mask has shape"),
    ],
)
def test_gae_bad_input_names_the_problem(kwargs, message):
    args = {
        "rewards": torch.zeros(2, 4),
        "values": torch.zeros(2, 4),
        "mask": torch.ones(2, 4),
        "gamma": 1.0,
        "lam": 1.0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        masked_gae(**args)
