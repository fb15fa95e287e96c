"""SPO's KL-adaptive Beta tracker: spec §4.5."""

import json
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamrl.algos import SPOTracker, forgetting_factor, offline_prior, sampling_weight, spo_advantages

unit_rewards = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(st.tuples(unit_rewards, st.floats(0.0, 0.5)), max_size=20),
    reward=unit_rewards,
    drift=st.floats(0.0, 0.5),
)
def test_spo_4_5_1_ema_equivalence(history, reward, drift):
    tracker = SPOTracker()
    for r, d in history:
        tracker.update("x", r, drift=d)
    v_prev, n_prev = tracker.value("x"), tracker.n_eff("x")
    rho = tracker.update("x", reward, drift=drift)
    expected = v_prev + (reward - v_prev) / (rho * n_prev + 1.0)
    assert tracker.value("x") == pytest.approx(expected, rel=1e-12, abs=1e-12)


@settings(max_examples=20, deadline=None)
@given(rho=st.floats(0.5, 0.96), seed=st.integers(0, 2**31 - 1))
def test_spo_4_5_2_equilibrium_count(rho, seed):
    rewards = torch.rand(500, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    tracker = SPOTracker(rho_min=rho, rho_max=rho)
    tracker.init_offline("x", successes=3, n0=8)
    for r in rewards.tolist():
        tracker.update("x", r, drift=0.01)
    assert tracker.n_eff("x") == pytest.approx(1.0 / (1.0 - rho), abs=1e-6)


def _spo_step(tracker, prompts, rewards, drift=0.05):
    """SPO's step order: read every baseline, compute advantages, then absorb in batch order."""
    baselines = torch.tensor([tracker.baseline(p) for p in prompts], dtype=torch.float64)
    raw = torch.tensor(rewards, dtype=torch.float64) - baselines
    for p, r in zip(prompts, rewards):
        tracker.update(p, r, drift=drift)
    return baselines, raw


@settings(max_examples=40, deadline=None)
@given(
    history=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 1)), max_size=15),
    batch=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 1)), min_size=1, max_size=6),
    flip=st.integers(0, 5),
)
def test_spo_4_5_3_causality(history, batch, flip):
    flip %= len(batch)
    prompts = [p for p, _ in batch]
    rewards = [float(r) for _, r in batch]
    flipped = list(rewards)
    flipped[flip] = 1.0 - flipped[flip]

    def run(rs):
        tracker = SPOTracker()
        for p, r in history:
            tracker.update(p, float(r), drift=0.02)
        return _spo_step(tracker, prompts, rs)

    base_v, base_a = run(rewards)
    flip_v, flip_a = run(flipped)
    # the baselines (duplicates of the flipped prompt included) do not see the flipped reward
    assert torch.equal(base_v, flip_v)
    delta = flip_a - base_a
    assert float(delta[flip]) == flipped[flip] - rewards[flip]
    assert torch.equal(torch.cat([delta[:flip], delta[flip + 1 :]]), torch.zeros(len(batch) - 1, dtype=torch.float64))


@settings(max_examples=100, deadline=None)
@given(
    drift=st.floats(0.0, 100.0, allow_nan=False),
    rho_min=st.floats(0.3, 0.9),
    width=st.floats(0.0, 0.09),
    d_half=st.floats(0.01, 1.0),
)
def test_spo_4_5_4_rho_bounds(drift, rho_min, width, d_half):
    rho_max = rho_min + width
    rho = forgetting_factor(drift, d_half, rho_min, rho_max)
    assert rho_min <= rho <= rho_max
    assert forgetting_factor(0.0, d_half, rho_min, rho_max) == rho_max
    assert forgetting_factor(d_half, d_half, rho_min, rho_max) == pytest.approx(min(max(0.5, rho_min), rho_max))


def test_spo_4_5_4_defaults():
    tracker = SPOTracker()
    assert tracker.forgetting_factor(0.0) == 0.96
    assert tracker.forgetting_factor(0.06) == 0.875  # 2^-1 = 0.5 clamps to rho_min
    assert tracker.forgetting_factor(0.01) == pytest.approx(2 ** (-0.01 / 0.06))  # inside the bounds
    with pytest.raises(ValueError, match="drift"):
        tracker.forgetting_factor(-0.1)


def test_spo_4_5_5_global_normalisation_of_spo_advantages():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    baselines = torch.tensor([0.5, 0.2, 0.9, 0.4, 0.6])
    out = spo_advantages(rewards, baselines)
    raw = (rewards - baselines).double()
    sigma = float(raw.std(unbiased=True))
    assert abs(float(out.mean())) < 1e-6
    assert float(out.double().std(unbiased=True)) == pytest.approx(sigma / (sigma + 1e-8), rel=1e-6)
    assert torch.equal(spo_advantages(torch.ones(3), torch.full((3,), 0.5)), torch.zeros(3))


@settings(max_examples=60, deadline=None)
@given(v=st.floats(0.0, 1.0), n=st.floats(0.01, 100.0), gamma=st.floats(0.0, 1.0), eps_s=st.floats(0.0, 0.2))
@example(v=4.9e-22, n=0.01, gamma=1.0, eps_s=0.0)  # the draw that failed a fresh clone's make test
def test_spo_4_5_6_sampler_weights(v, n, gamma, eps_s):
    # symmetry in v and 1 - v, for a pair whose complement is exact: 1 - v rounds for small v
    # (v = 4.9e-22 gives 1 - v == 1.0), but 1 - hi is exact for hi >= 0.5 (Sterbenz)
    hi = v if v >= 0.5 else 1.0 - v
    lo = 1.0 - hi
    assert 1.0 - lo == hi
    w = sampling_weight(lo, n, eps_s, gamma)
    assert w >= eps_s
    assert sampling_weight(hi, n, eps_s, gamma) == pytest.approx(w, rel=1e-12, abs=1e-15)
    assert sampling_weight(v, n, eps_s, gamma) >= eps_s
    if gamma == 0.0:
        assert sampling_weight(0.5, n, eps_s, 0.0) >= w


def test_spo_4_5_6_tracker_sampling_weights_peak_at_even_odds():
    tracker = SPOTracker()
    for pid, successes in [("hard", 0), ("even", 4), ("easy", 8)]:
        tracker.init_offline(pid, successes=successes, n0=8)
    weights = tracker.sampling_weights(["hard", "even", "easy", "unseen"])
    assert min(weights) >= tracker.eps_s
    assert weights[1] == max(weights[:3])
    assert weights[0] == pytest.approx(weights[2])  # v and 1 - v
    assert weights[3] == pytest.approx(0.5 + 0.05)  # unseen prior v = 0.5, gamma = 0


def test_spo_offline_initialisation_and_unseen_priors():
    tracker = SPOTracker()
    tracker.init_offline("x", successes=0, n0=8)
    assert tracker.n_eff("x") == pytest.approx(8.0)  # N0 = 1 / (1 - 0.875)
    assert tracker.value("x") == pytest.approx(0.5 / 9)  # smoothed (s + 1/2) / (n0 + 1)
    assert offline_prior(2, 8, 8.0, smoothed=False) == pytest.approx((2.0, 6.0))
    assert (tracker.value("new"), tracker.n_eff("new")) == (0.5, 1.0)
    assert SPOTracker(unseen_prior="N0_half").n_eff("new") == pytest.approx(8.0)
    with pytest.raises(ValueError, match="already has tracker state"):
        tracker.init_offline("x", successes=1, n0=8)
    with pytest.raises(ValueError, match="successes"):
        tracker.init_offline("y", successes=9, n0=8)


def test_spo_maps_rewards_from_reward_range():
    tracker = SPOTracker(reward_range=(-1.0, 1.0))
    tracker.update("x", 1.0)
    plain = SPOTracker()
    plain.update("x", 1.0)
    assert tracker.value("x") == plain.value("x")
    assert tracker.baseline("x") == pytest.approx(2 * plain.value("x") - 1)
    with pytest.raises(ValueError, match="outside reward_range"):
        tracker.update("x", 1.5)
    with pytest.raises(ValueError, match="finite"):
        tracker.update("x", math.nan)


def test_spo_drift_helper():
    assert SPOTracker.drift([-1.0, -2.0], [-1.5, -1.0]) == pytest.approx(0.75)
    assert SPOTracker.drift(torch.zeros(0), torch.zeros(0)) == 0.0
    with pytest.raises(ValueError, match="shape"):
        SPOTracker.drift([0.0], [0.0, 1.0])


def test_spo_state_dict_round_trips_through_json():
    tracker = SPOTracker()
    tracker.init_offline("a", 3, 8)
    tracker.update("a", 1.0, drift=0.03)
    tracker.update(7, 0.0)
    restored = SPOTracker()
    restored.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
    for pid in ("a", 7, "unseen"):
        assert restored.value(pid) == tracker.value(pid)
        assert restored.n_eff(pid) == tracker.n_eff(pid)
        assert restored.visits(pid) == tracker.visits(pid)
    with pytest.raises(ValueError, match="prompts"):
        restored.load_state_dict({"alpha": {}})
    with pytest.raises(TypeError, match="str or int"):
        tracker.update(("tuple", "id"), 1.0)
