"""PPO clip / dual-clip, aggregation with global denominators, TIS and KL: spec §1.1-§1.5, §1.8.1-4."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.algos import (
    AGGREGATION_MODES,
    aggregate,
    check_dual_clip,
    clipped_surrogate,
    kl_estimate,
    ppo_policy_loss,
    tis_weights,
    value_loss,
)

CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 64))
def test_shared_1_8_1_unit_ratio_gives_minus_advantage(seed, n):
    adv = torch.randn(n, generator=_gen(seed), dtype=torch.float64)
    assert torch.equal(clipped_surrogate(torch.ones(n, dtype=torch.float64), adv, CLIP_LOW, CLIP_HIGH), -adv)
    assert torch.equal(clipped_surrogate(torch.ones(n, dtype=torch.float64), adv, dual_clip=2.0), -adv)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 4), length=st.integers(1, 32))
def test_shared_1_8_1_no_gradient_where_the_clip_binds(seed, rows, length):
    gen = _gen(seed)
    old = torch.randn(rows, length, generator=gen, dtype=torch.float64) - 2
    log_ratio = (torch.rand(rows, length, generator=gen, dtype=torch.float64) - 0.5) * 1.5
    logp = (old + log_ratio).requires_grad_(True)
    adv = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    mask = torch.ones(rows, length)
    loss, stats = ppo_policy_loss(logp, old, adv, mask, CLIP_LOW, CLIP_HIGH)
    loss.backward()
    ratio = log_ratio.exp()
    clipped = ((adv > 0) & (ratio > 1 + CLIP_HIGH)) | ((adv < 0) & (ratio < 1 - CLIP_LOW))
    assert torch.equal(logp.grad[clipped], torch.zeros_like(logp.grad[clipped]))
    assert (logp.grad[~clipped & (adv != 0)] != 0).all()
    assert stats["clip_frac"] == pytest.approx(float(clipped.double().mean()))


@settings(max_examples=60, deadline=None)
@given(
    adv=st.floats(-50, 50, allow_nan=False),
    log_ratio=st.floats(-15, 15, allow_nan=False),
    c=st.floats(1.0001, 20.0),
)
def test_shared_1_8_2_dual_clip_bounds_negative_advantages(adv, log_ratio, c):
    a = torch.tensor([adv], dtype=torch.float64)
    r = torch.tensor([math.exp(log_ratio)], dtype=torch.float64)
    dual = clipped_surrogate(r, a, CLIP_LOW, CLIP_HIGH, dual_clip=c)
    plain = clipped_surrogate(r, a, CLIP_LOW, CLIP_HIGH)
    if adv < 0:
        assert float(dual) <= c * abs(adv) * (1 + 1e-12)
    else:
        assert torch.equal(dual, plain)


def test_shared_1_8_2_dual_clip_stops_gradient_beyond_c():
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.log(torch.tensor([[0.5, 1.5, 2.5, 4.0]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.full((1, 4), -1.0, dtype=torch.float64)
    loss, stats = ppo_policy_loss(logp, old, adv, torch.ones(1, 4), dual_clip=2.0, agg="seq-mean-token-sum")
    loss.backward()
    # ratio 0.5: clipped low (no grad); 1.5: live; 2.5 and 4.0: above c -> capped at c|A|, no grad
    assert logp.grad[0].tolist()[0] == 0.0 and logp.grad[0, 1] != 0
    assert logp.grad[0, 2:].tolist() == [0.0, 0.0]
    assert float(loss.detach()) == pytest.approx(0.8 + 1.5 + 2.0 + 2.0)
    assert stats["dual_clip_frac"] == 0.5


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0, "2"])
def test_shared_1_8_2_dual_clip_at_most_one_raises(c):
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        check_dual_clip(c)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), dual_clip=c)


def _random_batch(seed: int, rows: int, length: int):
    gen = _gen(seed)
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    mask &= torch.rand(rows, length, generator=gen) < 0.8  # observation gaps
    old = torch.randn(rows, length, generator=gen, dtype=torch.float64) - 1
    logp = old + 0.3 * torch.randn(rows, length, generator=gen, dtype=torch.float64)
    logp[~mask] = -math.inf  # garbage in padding must not leak
    adv = torch.randn(rows, generator=gen, dtype=torch.float64)
    tis = torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2
    return logp, old, adv, mask, tis


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(2, 10),
    length=st.integers(1, 24),
    mode=st.sampled_from(AGGREGATION_MODES),
    dual=st.sampled_from([None, 2.0]),
    data=st.data(),
)
def test_shared_1_8_3_micro_batches_with_global_denominators_equal_full_batch(seed, rows, length, mode, dual, data):
    logp, old, adv, mask, tis = _random_batch(seed, rows, length)
    kwargs = dict(dual_clip=dual, agg=mode, tis_weights=tis, norm_length=float(length))
    full_logp = logp.clone().requires_grad_(True)
    full, _ = ppo_policy_loss(full_logp, old, adv, mask, **kwargs)
    full.backward()

    cuts = sorted(data.draw(st.sets(st.integers(1, rows - 1), max_size=rows - 1)))
    bounds = [0, *cuts, rows]
    micro_logp = logp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        part, _ = ppo_policy_loss(
            micro_logp[lo:hi], old[lo:hi], adv[lo:hi], mask[lo:hi],
            dual_clip=dual, agg=mode, tis_weights=tis[lo:hi], norm_length=float(length),
            global_tokens=int(mask.sum()), global_seqs=rows,
        )  # fmt: skip
        part.backward()
        total = total + part.detach()
    assert float(total) == pytest.approx(float(full.detach()), abs=1e-6)
    assert torch.isfinite(full_logp.grad).all()
    torch.testing.assert_close(micro_logp.grad, full_logp.grad, rtol=0, atol=1e-6)


def test_shared_1_8_3_mean_of_micro_batch_means_differs_from_full_batch():
    values = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    full = aggregate(values, mask)
    naive = (aggregate(values[:1], mask[:1]) + aggregate(values[1:], mask[1:])) / 2
    correct = aggregate(values[:1], mask[:1], global_tokens=4) + aggregate(values[1:], mask[1:], global_tokens=4)
    assert float(full) == pytest.approx(7 / 4) and float(correct) == pytest.approx(7 / 4)
    assert float(naive) == pytest.approx(2.5)


def test_aggregation_formulas():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(7 / 3)
    assert float(aggregate(values, mask, "seq-mean-token-sum")) == pytest.approx(7 / 2)
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx((1.5 + 4.0) / 2)
    assert float(aggregate(values, mask, "seq-mean-token-sum-norm", norm_length=10)) == pytest.approx(7 / 20)
    empty = aggregate(values.requires_grad_(True), torch.zeros(2, 3))
    empty.backward()
    assert float(empty.detach()) == 0.0 and torch.equal(values.grad, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(values, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(values, mask, "token-sum")


def test_value_loss_micro_batches_with_global_count_equal_full_batch():
    gen = _gen(3)
    values = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    old = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    targets = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = torch.rand(6, 5, generator=gen) < 0.6
    full = value_loss(values, old, targets, mask)
    count = int(mask.sum())
    parts = value_loss(values[:2], old[:2], targets[:2], mask[:2], global_count=count) + value_loss(
        values[2:], old[2:], targets[2:], mask[2:], global_count=count
    )
    assert float(parts) == pytest.approx(float(full), abs=1e-12)


def test_ppo_stats_and_broadcast_advantages():
    old = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5], [1.0, 1.1, 1.0]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss_row, stats = ppo_policy_loss(logp, old, torch.tensor([1.0, -1.0]), mask)
    loss_tok, _ = ppo_policy_loss(logp, old, torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]), mask)
    assert torch.equal(loss_row, loss_tok)
    assert stats["clip_frac"] == pytest.approx(1 / 5)  # only the 1.5 ratio with A > 0
    assert stats["clip_frac_high"] == pytest.approx(1 / 5) and stats["clip_frac_low"] == 0.0
    assert stats["ppo_kl"] == pytest.approx(float(-(logp * mask).sum() / 5), rel=1e-6)
    assert stats["tokens"] == 5.0
    assert stats["ratio_max"] == pytest.approx(1.5)


def test_tis_weights_are_truncated_and_detached():
    old = torch.log(torch.tensor([0.5, 0.9, 0.1])).requires_grad_(True)
    rollout = torch.log(torch.tensor([0.5, 0.3, 0.4]))
    w = tis_weights(old, rollout, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([1.0, 2.0, 0.25]))
    assert not w.requires_grad


def test_shared_1_8_4_kl_estimators_vanish_at_reference():
    logp = torch.randn(4, 7)
    for kind in ("k1", "k2", "k3"):
        assert torch.equal(kl_estimate(logp, logp.clone(), kind), torch.zeros(4, 7))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(0.01, 40.0))
def test_shared_1_8_4_k2_k3_non_negative(seed, scale):
    gen = _gen(seed)
    logp = torch.randn(64, generator=gen, dtype=torch.float64) * scale
    ref = torch.randn(64, generator=gen, dtype=torch.float64) * scale
    for kind in ("k2", "k3"):
        est = kl_estimate(logp, ref, kind)
        assert (est >= 0).all() and torch.isfinite(est).all()
    assert (kl_estimate(logp, ref, "k3") <= 10).all()


def test_shared_1_8_4_k3_clamp_keeps_gradients_finite():
    logp = torch.tensor([-60.0, 0.0, 60.0], requires_grad=True)
    kl_estimate(logp, torch.zeros(3), "k3").sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0] == 0 and logp.grad[2] == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_shared_1_8_4_k1_k3_sample_means_are_unbiased(seed):
    gen = _gen(seed)
    vocab = 12
    p = torch.rand(vocab, generator=gen, dtype=torch.float64) + 0.05  # bounded ratios: k3 stays < 10
    q = torch.rand(vocab, generator=gen, dtype=torch.float64) + 0.05
    p, q = p / p.sum(), q / q.sum()
    exact = float((p * (p.log() - q.log())).sum())
    tokens = torch.multinomial(p, 1_000_000, replacement=True, generator=gen)
    logp, ref = p.log()[tokens], q.log()[tokens]
    delta = ref - logp
    assert float((delta.exp() - 1 - delta).max()) < 10  # the k3 clamp is inactive here
    for kind in ("k1", "k3"):
        est = kl_estimate(logp, ref, kind)
        standard_error = float(est.std()) / math.sqrt(est.numel())
        assert abs(float(est.mean()) - exact) <= 3 * standard_error, kind


def test_kl_unknown_kind_raises():
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(torch.zeros(2), torch.zeros(2), "k4")
