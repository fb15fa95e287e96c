"""sample_next: banned ids never drawn, the right distribution, top-p, greedy, seeds."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.policy.sampling import inverse_cdf_sample, nucleus_filter, sample_next


def test_banned_ids_never_sampled_even_when_they_dominate():
    vocab, banned = 300, torch.tensor([3, 7, 299])
    logits = torch.randn(10_000, vocab)
    logits[:, banned] = 50.0  # the banned ids hold almost all the mass before masking
    ids, logprobs = sample_next(
        logits, torch.ones(10_000), torch.ones(10_000), [None] * 10_000, banned, torch.Generator().manual_seed(0)
    )
    assert not torch.isin(ids, banned).any()
    assert torch.isfinite(logprobs).all() and (logprobs < 0).all()


def test_reported_logprob_is_the_action_vocabulary_log_softmax_before_top_p():
    logits = torch.randn(64, 50)
    banned = torch.tensor([0, 1])
    temperature = torch.full((64,), 0.7)
    ids, logprobs = sample_next(logits, temperature, torch.full((64,), 0.5), [None] * 64, banned)
    expected = (logits / 0.7).index_fill(-1, banned, float("-inf")).log_softmax(-1)
    assert torch.allclose(logprobs, expected.gather(1, ids[:, None])[:, 0], atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(vocab=st.integers(2, 700), zeros=st.integers(0, 5), seed=st.integers(0, 10**6))
def test_inverse_cdf_never_picks_zero_probability_tokens(vocab, zeros, seed):
    generator = torch.Generator().manual_seed(seed)
    probs = torch.rand(8, vocab, generator=generator) ** 4
    probs[:, torch.randperm(vocab, generator=generator)[: min(zeros, vocab - 1)]] = 0
    uniforms = torch.cat([torch.tensor([0.0, 1 - 2**-24]), torch.rand(6, generator=generator)])
    ids = inverse_cdf_sample(probs, uniforms)
    assert (probs.gather(1, ids[:, None]) > 0).all()


def test_inverse_cdf_follows_the_distribution():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3] * 100)  # 400 tokens: a full 256-token block and a padded one
    probs = probs / probs.sum()
    draws = inverse_cdf_sample(
        probs.expand(200_000, -1), torch.rand(200_000, generator=torch.Generator().manual_seed(1))
    )
    freq = torch.bincount(draws, minlength=400).float() / 200_000
    assert (freq - probs).abs().max() < 1.5e-3
    assert freq[1::4].sum() == 0


@settings(max_examples=20, deadline=None)
@given(top_p=st.floats(0.05, 1.0), seed=st.integers(0, 10**6))
def test_nucleus_keeps_the_smallest_top_set_reaching_top_p(top_p, seed):
    probs = torch.rand(1, 40, generator=torch.Generator().manual_seed(seed)).softmax(-1)
    kept = nucleus_filter(probs, torch.tensor([top_p]))[0]
    chosen = kept > 0
    assert probs[0, chosen].sum() >= top_p - 1e-6  # reaches top_p ...
    if (~chosen).any():  # ... with the most likely tokens
        assert probs[0, chosen].min() >= probs[0, ~chosen].max()
    smallest = probs[0, chosen].min()
    assert probs[0, chosen].sum() - smallest < top_p + 1e-6  # ... and none to spare


def test_greedy_and_seeded_rows():
    logits = torch.randn(4, 30)
    banned = torch.tensor([int(logits[0].argmax())])  # greedy must skip a banned argmax
    temperature = torch.tensor([0.0, 1.0, 1.0, 1.0])
    seeded = lambda: [None, torch.Generator().manual_seed(5), torch.Generator().manual_seed(5), None]  # noqa: E731
    first, _ = sample_next(logits, temperature, torch.ones(4), seeded(), banned)
    again, _ = sample_next(logits, temperature, torch.ones(4), seeded(), banned)
    masked = logits.index_fill(-1, banned, float("-inf"))
    assert first[0] == masked[0].argmax() and first[0] != banned[0]
    assert first[1] == again[1] and first[2] == again[2]  # same seed, same draw


def test_greedy_rows_among_sampled_rows_take_their_argmax_and_its_log_prob():
    logits = torch.randn(5, 40)
    banned = torch.tensor([3])
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.7, 0.0])
    ids, logprobs = sample_next(logits, temperature, torch.ones(5), [None] * 5, banned)
    masked = logits.index_fill(-1, banned, float("-inf"))
    for row in (0, 2, 4):
        assert ids[row] == masked[row].argmax()
        assert torch.isclose(logprobs[row], masked[row].log_softmax(-1)[ids[row]], atol=1e-6)
    assert not (ids == banned[0]).any()


def test_half_precision_logits_sample_like_their_float32_values_and_no_logits_change():
    """Half-precision logits are divided in a float32 copy, float32 ones in a new tensor: the same
    draws and log-probs either way, and the caller's logits are never modified."""
    logits = (torch.randn(32, 500) * 3).to(torch.bfloat16)
    wide = logits.float()
    kept_half, kept_wide = logits.clone(), wide.clone()
    temperature = torch.full((32,), 0.7)
    draws = [
        sample_next(x, temperature, torch.ones(32), [None] * 32, torch.tensor([4]), torch.Generator().manual_seed(1))
        for x in (logits, wide)
    ]
    assert torch.equal(draws[0][0], draws[1][0]) and torch.equal(draws[0][1], draws[1][1])
    assert torch.equal(logits, kept_half) and torch.equal(wide, kept_wide)
