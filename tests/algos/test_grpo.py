"""GRPO / Dr.GRPO properties: spec §2."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.algos import grpo_advantages, grpo_group_stats

EPS = 1e-6


def _batch(seed: int, n_groups: int, max_size: int, binary: bool = False):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, max_size + 1, (n_groups,), generator=gen)
    ids = torch.repeat_interleave(torch.arange(n_groups), sizes)
    ids = ids[torch.randperm(ids.numel(), generator=gen)]  # members need not be contiguous
    if binary:
        rewards = torch.randint(0, 2, ids.shape, generator=gen).double()
    else:
        rewards = torch.randn(ids.shape, generator=gen, dtype=torch.float64)
    return rewards, ids


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_groups=st.integers(1, 12), scale=st.booleans())
def test_grpo_2_1_group_sums_are_zero(seed, n_groups, scale):
    rewards, ids = _batch(seed, n_groups, 8)
    adv = grpo_advantages(rewards.float(), ids, scale_by_std=scale)
    for g in ids.unique():
        assert abs(float(adv[ids == g].double().sum())) <= 1e-6


def test_grpo_2_2_zero_variance_and_singleton_groups_give_zero():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.3, 0.7, 5.0, 0.1, 0.1])
    ids = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    for scale in (True, False):
        adv = grpo_advantages(rewards, ids, scale_by_std=scale)
        assert torch.isfinite(adv).all()
        assert torch.equal(adv[[0, 1, 2, 5, 6, 7]], torch.zeros(6))
        assert (adv[[3, 4]] != 0).all()
    stats = grpo_group_stats(rewards, ids)
    assert stats == {"n_groups": 4.0, "frac_degenerate_groups": 0.75, "n_singleton_groups": 1.0}


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_groups=st.integers(1, 10),
    a=st.floats(1.0, 10.0),
    b=st.floats(-10.0, 10.0),
)
def test_grpo_2_3_affine_invariance_and_dr_grpo_equivariance(seed, n_groups, a, b):
    rewards, ids = _batch(seed, n_groups, 8, binary=True)  # binary outcomes: non-degenerate std >= 0.35
    base = grpo_advantages(rewards, ids)
    moved = grpo_advantages(a * rewards + b, ids)
    torch.testing.assert_close(moved, base, rtol=0, atol=1e-5)
    dr_grpo = lambda r: grpo_advantages(r, ids, scale_by_std=False)  # noqa: E731
    torch.testing.assert_close(dr_grpo(a * rewards + b), a * dr_grpo(rewards))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_groups=st.integers(1, 10))
def test_grpo_2_4_within_group_std(seed, n_groups):
    rewards, ids = _batch(seed, n_groups, 16)
    adv = grpo_advantages(rewards, ids, eps=EPS)
    for g in ids.unique():
        group = rewards[ids == g]
        std = float(group.std(unbiased=True))
        assert float(adv[ids == g].std(unbiased=True)) == pytest.approx(std / (std + EPS), abs=1e-4)


def test_grpo_accepts_hashable_group_ids_and_keeps_dtype():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float32)
    by_name = grpo_advantages(rewards, ["a", "a", "b", "b"])
    by_int = grpo_advantages(rewards, torch.tensor([5, 5, 9, 9]))
    assert by_name.dtype == torch.float32
    assert torch.equal(by_name, by_int)
    assert torch.equal(by_name[2:], torch.zeros(2))


@pytest.mark.parametrize(
    "rewards, ids, message",
    [
        (torch.ones(3), [0, 0], "group_ids has 2 entries"),
        (torch.ones(2, 2), [0, 0], "1-D"),
        (torch.tensor([1.0, float("nan")]), [0, 0], "NaN"),
    ],
)
def test_grpo_bad_input_names_the_problem(rewards, ids, message):
    with pytest.raises(ValueError, match=message):
        grpo_advantages(rewards, ids)
