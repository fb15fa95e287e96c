"""N_traj / N_tok / N_turn properties: spec §1.6, §1.8.6, §4.5.5, §5.7.1-3, §6.6.6."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.algos import advantage_stats, token_measure_whiten, turn_normalize, whiten

EPS = 1e-8


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _token_sigma(adv: torch.Tensor, lengths: torch.Tensor) -> float:
    a, w = adv.double(), lengths.double()
    mu = (w * a).sum() / w.sum()
    return float(((w * (a - mu) ** 2).sum() / (w.sum() - 1)).sqrt())


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(st.tuples(st.integers(0, 4096), st.floats(-100, 100, allow_nan=False)), min_size=1, max_size=64),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_spo_pp_5_7_1_centering(items, dtype):
    lengths = torch.tensor([n for n, _ in items], dtype=torch.float64)
    adv = torch.tensor([a for _, a in items], dtype=dtype)
    out = token_measure_whiten(adv, lengths)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    weighted = (lengths * out.double()).sum().abs()
    assert weighted <= 1e-6 * max(1.0, float((lengths * out.double().abs()).sum()))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 64))
def test_spo_pp_5_7_2_scale(seed, n):
    gen = _rng(seed)
    lengths = torch.randint(1, 4097, (n,), generator=gen).double()
    adv = torch.randn(n, generator=gen, dtype=torch.float64) * 3.0
    out = token_measure_whiten(adv, lengths, EPS)
    total = lengths.sum()
    sigma = _token_sigma(adv, lengths)
    lhs = float((lengths * out**2).sum() / total)
    rhs = float((total - 1) / total) * sigma**2 / (sigma + EPS) ** 2
    assert lhs == pytest.approx(rhs, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 32), length=st.integers(1, 512))
def test_spo_pp_5_7_3_equal_lengths_match_trajectory_whitening(seed, n, length):
    adv = torch.randn(n, generator=_rng(seed), dtype=torch.float64)
    lengths = torch.full((n,), float(length), dtype=torch.float64)
    tok = token_measure_whiten(adv, lengths, EPS)
    traj = whiten(adv, EPS)
    # identical centring, scale differs only through the variance denominators (sum L - 1 vs n - 1)
    assert float(tok.mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(traj.mean()) == pytest.approx(0.0, abs=1e-12)
    sigma_traj = float(adv.std(unbiased=True))
    sigma_tok = _token_sigma(adv, lengths)
    torch.testing.assert_close(tok, traj * (sigma_traj + EPS) / (sigma_tok + EPS), rtol=1e-10, atol=1e-12)


def test_spo_pp_5_7_3_trajectory_whitening_biases_token_mean_when_length_covaries():
    gen = _rng(7)
    lengths = torch.randint(10, 2000, (64,), generator=gen).double()
    adv = lengths / 1000.0 + 0.3 * torch.randn(64, generator=gen, dtype=torch.float64)  # corr(L, A) > 0
    traj = whiten(adv, EPS)
    token_weighted_mean = float((lengths * traj).sum() / lengths.sum())
    cov_n = float(((lengths - lengths.mean()) * (traj - traj.mean())).mean())
    assert token_weighted_mean == pytest.approx(cov_n / float(lengths.mean()), rel=1e-10)
    assert abs(token_weighted_mean) > 0.1  # clearly not centred under the token measure
    tok = token_measure_whiten(adv, lengths, EPS)
    assert abs(float((lengths * tok).sum() / lengths.sum())) < 1e-12


@pytest.mark.parametrize(
    "adv, lengths",
    [
        ([2.5], [7]),  # single item
        ([1.5, 1.5, 1.5], [3, 9, 1]),  # all equal
        ([1.0, 2.0, 3.0], [0, 0, 0]),  # sum L = 0
        ([1.0, 2.0, 3.0], [1, 0, 0]),  # sum L = 1
        ([0.1, 0.1, 0.1, 0.1], [5, 5, 5, 5]),  # equal values whose float mean is inexact
    ],
)
def test_shared_1_8_6_degenerate_inputs_give_finite_zeros(adv, lengths):
    a = torch.tensor(adv, dtype=torch.float32)
    tok = token_measure_whiten(a, torch.tensor(lengths))
    assert torch.equal(tok, torch.zeros_like(a))
    if len(adv) == 1 or len(set(adv)) == 1:
        assert torch.equal(whiten(a), torch.zeros_like(a))


def test_shared_1_8_6_empty_and_masked_out_batches_give_zeros():
    assert whiten(torch.zeros(0)).shape == (0,)
    out = whiten(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), mask=torch.zeros(2, 2))
    assert torch.equal(out, torch.zeros(2, 2))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 200), scale=st.floats(1e-3, 1e3))
def test_spo_4_5_5_global_normalisation(seed, n, scale):
    adv = torch.randn(n, generator=_rng(seed), dtype=torch.float64) * scale + 5.0
    out = whiten(adv, EPS)
    sigma = float(adv.std(unbiased=True))
    assert abs(float(out.mean())) <= 1e-6
    assert float(out.std(unbiased=True)) == pytest.approx(sigma / (sigma + EPS), rel=1e-9)


def test_spo_4_5_5_constant_advantages_give_zeros_without_nan():
    out = whiten(torch.full((9,), 0.3))
    assert torch.equal(out, torch.zeros(9))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 8), turns=st.integers(1, 12))
def test_sapo_6_6_6_turn_normalisation(seed, rows, turns):
    gen = _rng(seed)
    adv = torch.randn(rows, turns, generator=gen, dtype=torch.float64)
    mask = torch.rand(rows, turns, generator=gen) < 0.7
    garbage = torch.where(mask, adv, torch.full_like(adv, float("nan")))  # padding may hold anything
    out = turn_normalize(garbage, mask, EPS)
    valid = adv[mask]
    assert torch.isfinite(out).all()
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
    if valid.numel() < 2 or bool((valid == valid[0]).all()):
        assert torch.equal(out, torch.zeros_like(out))
        return
    sigma = float(valid.std(unbiased=True))
    assert abs(float(out[mask].mean())) <= 1e-6
    assert float(out[mask].std(unbiased=True)) == pytest.approx(sigma / (sigma + EPS), rel=1e-9)


def test_whitening_returns_input_dtype_and_no_gradient():
    adv = torch.randn(5, requires_grad=True)
    out = whiten(adv)
    assert out.dtype == torch.float32 and not out.requires_grad
    assert whiten(torch.tensor([1, 2, 3])).dtype == torch.get_default_dtype()


def test_advantage_stats_report_raw_std_and_zero_fraction():
    raw = torch.tensor([1.0, 2.0, 3.0, 4.0])
    stats = advantage_stats(raw, whiten(raw))
    assert stats["adv_std_raw"] == pytest.approx(float(raw.std(unbiased=True)))
    assert stats["frac_zero_adv"] == 0.0
    flat = torch.ones(4)
    assert advantage_stats(flat, whiten(flat)) == {"adv_std_raw": 0.0, "frac_zero_adv": 1.0}
    lengths = torch.tensor([2.0, 0.0, 2.0, 2.0])
    weighted = advantage_stats(raw, token_measure_whiten(raw, lengths), lengths)
    kept = torch.tensor([1.0, 3.0, 4.0])
    assert weighted["adv_std_raw"] == pytest.approx(_token_sigma(kept, torch.full((3,), 2.0)))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: token_measure_whiten(torch.ones(3), torch.ones(4)), "lengths has shape"),
        (lambda: token_measure_whiten(torch.ones(2), torch.tensor([1.0, -1.0])), "non-negative"),
        (lambda: whiten(torch.tensor([1.0, math.nan])), "NaN"),
    ],
)
def test_bad_input_names_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()
