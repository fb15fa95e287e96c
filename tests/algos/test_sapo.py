"""SAPO: action vocabulary, value readout, targets, turn-averaged value losses: spec §6.6."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streamrl.algos.vocab as vocab_module
from streamrl.algos import (
    action_log_probs,
    action_log_probs_and_entropy,
    entropy,
    invalid_action_correction,
    mask_excluded_logits,
    sapo_advantages,
    sapo_targets,
    sapo_value_loss,
    sarsa_targets,
    value_readout,
    value_saturation_frac,
)

POS, NEG = 3, 7  # the reserved value tokens w+ and w-
VOCAB = 16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _action_ids():
    return torch.tensor([w for w in range(VOCAB) if w not in (POS, NEG)])


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(0.1, 100.0),
    shift=st.floats(-1e3, 1e3),
    r_max=st.floats(0.1, 10.0),
    tau=st.floats(0.1, 5.0),
    squash=st.sampled_from(["clip", "tanh"]),
)
def test_sapo_6_6_1_readout_bounded_and_shift_invariant(seed, scale, shift, r_max, tau, squash):
    logits = torch.randn(3, 5, VOCAB, generator=_gen(seed), dtype=torch.float64) * scale
    values = value_readout(logits, POS, NEG, r_max, tau, squash)
    assert values.shape == (3, 5)
    assert (values.abs() <= r_max).all()
    shifted = value_readout(logits + shift, POS, NEG, r_max, tau, squash)
    torch.testing.assert_close(shifted, values, rtol=0, atol=1e-9 * max(1.0, abs(shift)) * r_max / tau)


def test_sapo_readout_formula_and_saturation():
    logits = torch.zeros(4, VOCAB)
    logits[:, POS] = torch.tensor([0.0, 0.5, 3.0, -3.0])
    values = value_readout(logits, POS, NEG, r_max=2.0, tau=1.0)
    torch.testing.assert_close(values, torch.tensor([0.0, 1.0, 2.0, -2.0]))
    assert value_saturation_frac(values, 2.0) == 0.5
    assert value_saturation_frac(values, 2.0, mask=torch.tensor([1, 1, 0, 0])) == 0.0
    with pytest.raises(ValueError, match="distinct"):
        value_readout(logits, POS, POS)
    with pytest.raises(ValueError, match="tau"):
        value_readout(logits, POS, NEG, tau=0.0)
    with pytest.raises(ValueError, match="squash"):
        value_readout(logits, POS, NEG, squash="sigmoid")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(0.1, 30.0))
def test_sapo_6_6_2_action_distribution_normalised_without_value_tokens(seed, scale):
    logits = torch.randn(1, 1, VOCAB, generator=_gen(seed)) * scale
    logits[..., POS] += 50.0  # a value token that would dominate an unmasked softmax
    actions = _action_ids()
    logp = action_log_probs(logits.expand(1, actions.numel(), VOCAB), actions[None], excluded_ids=(POS, NEG))
    assert float(logp.double().exp().sum()) == pytest.approx(1.0, abs=1e-6)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 3), length=st.integers(1, 6))
def test_sapo_6_6_2_policy_terms_give_value_tokens_zero_gradient(seed, rows, length):
    gen = _gen(seed)
    logits = (torch.randn(rows, length, VOCAB, generator=gen) * 3).requires_grad_(True)
    actions = _action_ids()
    tokens = actions[torch.randint(0, actions.numel(), (rows, length), generator=gen)]
    weights = torch.randn(rows, length, generator=gen)
    ((action_log_probs(logits, tokens, (POS, NEG)) * weights).sum() + entropy(logits, (POS, NEG)).sum()).backward()
    assert torch.equal(logits.grad[..., [POS, NEG]], torch.zeros(rows, length, 2))
    assert (logits.grad[..., actions] != 0).any()


def test_sapo_6_6_2_masked_sampling_never_draws_value_tokens():
    gen = _gen(0)
    logits = torch.randn(VOCAB, generator=gen)
    logits[POS], logits[NEG] = 8.0, 6.0  # unmasked, these two would take most of the mass
    probs = torch.softmax(mask_excluded_logits(logits, (POS, NEG)), dim=-1)
    draws = torch.multinomial(probs, 10_000, replacement=True, generator=gen)
    assert not torch.isin(draws, torch.tensor([POS, NEG])).any()
    # and the sampler's frequencies follow the action-vocabulary log-probs
    actions = _action_ids()
    expected = action_log_probs(logits.expand(actions.numel(), VOCAB), actions, (POS, NEG)).exp()
    observed = torch.bincount(draws, minlength=VOCAB)[actions].double() / draws.numel()
    assert float((observed - expected.double()).abs().sum()) / 2 < 0.03


@pytest.mark.parametrize("excluded", [(), (POS, NEG)])
def test_action_log_probs_and_entropy_match_reference_across_chunks(monkeypatch, excluded):
    monkeypatch.setattr(vocab_module, "_CHUNK_ELEMENTS", 3 * VOCAB)  # force several chunks
    gen = _gen(5)
    logits = (torch.randn(2, 5, VOCAB, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    actions = _action_ids()
    tokens = actions[torch.randint(0, actions.numel(), (2, 5), generator=gen)]
    weights = torch.randn(2, 5, generator=gen, dtype=torch.float64)

    ours = action_log_probs(logits, tokens, excluded)
    ent = entropy(logits, excluded)
    (ours * weights).sum().add((ent * weights).sum()).backward()
    grad = logits.grad.clone()

    logits.grad = None
    reference_log_softmax = torch.log_softmax(mask_excluded_logits(logits, excluded), dim=-1)
    ref = reference_log_softmax.gather(-1, tokens[..., None]).squeeze(-1)
    probs = reference_log_softmax.exp()
    ref_ent = -(probs * torch.where(probs > 0, reference_log_softmax, torch.zeros_like(probs))).sum(-1)
    (ref * weights).sum().add((ref_ent * weights).sum()).backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(grad, logits.grad)

    reference_grad, logits.grad = logits.grad, None
    ours, ent = action_log_probs_and_entropy(logits, tokens, excluded)  # the learner's: one pass
    (ours * weights).sum().add((ent * weights).sum()).backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(logits.grad, reference_grad)


def test_entropy_at_a_minus_inf_logit_is_that_of_the_other_ids():
    logits = torch.tensor([[0.5, -float("inf"), 1.0, 2.0, -1.0]], dtype=torch.float64, requires_grad=True)
    ent = entropy(logits, (3,))
    ent.sum().backward()
    finite = torch.tensor([[0.5, 1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    expected = entropy(finite)
    expected.sum().backward()
    torch.testing.assert_close(ent, expected)
    assert logits.grad[0, 1] == 0 and logits.grad[0, 3] == 0
    torch.testing.assert_close(logits.grad[:, [0, 2, 4]], finite.grad)
    # both terms together (the learner's): the same, the -inf logit still counts 0
    logits.grad, finite.grad = None, None
    logp, ent = action_log_probs_and_entropy(logits, torch.tensor([2]), (3,))
    (ent * 3.0 - logp * 2.0).sum().backward()
    expected_logp, expected = action_log_probs_and_entropy(finite, torch.tensor([1]))
    (expected * 3.0 - expected_logp * 2.0).sum().backward()
    torch.testing.assert_close((logp, ent), (expected_logp, expected))
    assert logits.grad[0, 1] == 0 and logits.grad[0, 3] == 0
    torch.testing.assert_close(logits.grad[:, [0, 2, 4]], finite.grad)


def test_action_log_prob_functions_pass_gradcheck():
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    tokens = torch.tensor([0, 2, 5, 4])
    assert torch.autograd.gradcheck(lambda z: action_log_probs(z, tokens, (1, 3)), (logits,))
    assert torch.autograd.gradcheck(lambda z: entropy(z, (1, 3)), (logits,))
    assert torch.autograd.gradcheck(lambda z: entropy(z), (logits,))
    assert torch.autograd.gradcheck(lambda z: action_log_probs_and_entropy(z, tokens, (1, 3)), (logits,))


def test_bf16_logits_give_float32_log_probs():
    logits = torch.randn(2, 3, VOCAB).to(torch.bfloat16).requires_grad_(True)
    out = action_log_probs(logits, torch.zeros(2, 3, dtype=torch.long), (POS, NEG))
    assert out.dtype == torch.float32
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "tokens, message", [(torch.tensor([[POS]]), "excluded ids"), (torch.tensor([[VOCAB]]), "must lie in")]
)
def test_action_log_probs_rejects_bad_tokens(tokens, message):
    with pytest.raises(ValueError, match=message):
        action_log_probs(torch.zeros(1, 1, VOCAB), tokens, (POS, NEG))


def _terminal_turns(seed: int, turns: int):
    gen = _gen(seed)
    rewards = torch.zeros(1, turns, dtype=torch.float64)
    rewards[0, -1] = float(torch.rand(1, generator=gen))
    dones = torch.zeros(1, turns)
    dones[0, -1] = 1.0
    v_old = torch.rand(1, turns, generator=gen, dtype=torch.float64) * 2 - 1
    q_old = torch.rand(1, turns, generator=gen, dtype=torch.float64) * 2 - 1
    return rewards, v_old, q_old, dones, torch.ones(1, turns, dtype=torch.bool)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), turns=st.integers(1, 15))
def test_sapo_6_6_3_gae_unit_discount_terminal_reward(seed, turns):
    rewards, v_old, q_old, dones, mask = _terminal_turns(seed, turns)
    out = sapo_targets(rewards, v_old, q_old, dones, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(out.advantages, rewards[0, -1] - v_old)
    torch.testing.assert_close(out.v_targets, torch.full_like(v_old, float(rewards[0, -1])))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), turns=st.integers(1, 15), gamma=st.floats(0.5, 1.0))
def test_sapo_6_6_3_lambda_zero_is_td_error_and_done_stops(seed, turns, gamma):
    gen = _gen(seed)
    rewards = torch.randn(1, turns, generator=gen, dtype=torch.float64)
    v_old = torch.randn(1, turns, generator=gen, dtype=torch.float64)
    dones = (torch.rand(1, turns, generator=gen) < 0.3).double()
    mask = torch.ones(1, turns, dtype=torch.bool)
    out = sapo_targets(rewards, v_old, v_old, dones, mask, gamma=gamma, lam=0.0)
    next_v = torch.cat([v_old[:, 1:], torch.zeros(1, 1, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(out.advantages, rewards + gamma * (1 - dones) * next_v - v_old)
    # a done at turn t: advantages up to t ignore every later reward
    done_at = dones[0].nonzero()
    if done_at.numel():
        t = int(done_at[0])
        later = rewards.clone()
        later[0, t + 1 :] += 5.0
        moved = sapo_targets(later, v_old, v_old, dones, mask, gamma=gamma, lam=0.9)
        base = sapo_targets(rewards, v_old, v_old, dones, mask, gamma=gamma, lam=0.9)
        assert torch.equal(moved.advantages[0, : t + 1], base.advantages[0, : t + 1])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 4), turns=st.integers(1, 10), gamma=st.floats(0.5, 1.0))
def test_sapo_6_6_4_sarsa_targets_use_the_recorded_next_action(seed, rows, turns, gamma):
    gen = _gen(seed)
    lengths = torch.randint(1, turns + 1, (rows,), generator=gen)
    mask = torch.arange(turns)[None, :] < lengths[:, None]
    rewards = torch.randn(rows, turns, generator=gen, dtype=torch.float64)
    q_old = torch.randn(rows, turns, generator=gen, dtype=torch.float64)
    dones = torch.zeros(rows, turns)
    dones[torch.arange(rows), lengths - 1] = 1.0  # terminal last turns
    targets = sarsa_targets(rewards, q_old, dones, mask, gamma)
    for b in range(rows):
        n = int(lengths[b])
        assert float(targets[b, n - 1]) == float(rewards[b, n - 1])  # y^Q_T = r_T
        for t in range(n - 1):
            expected = rewards[b, t] + gamma * q_old[b, t + 1]  # the recorded next turn, not a max
            assert float(targets[b, t]) == pytest.approx(float(expected), abs=1e-12)
        assert torch.equal(targets[b, n:], torch.zeros(turns - n, dtype=torch.float64))


def test_sapo_truncated_last_turn_bootstraps_both_targets():
    rewards = torch.tensor([[0.0, 0.5]], dtype=torch.float64)
    v_old = torch.tensor([[0.2, 0.3]], dtype=torch.float64)
    q_old = torch.tensor([[0.4, 0.6]], dtype=torch.float64)
    not_done = torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = sapo_targets(rewards, v_old, q_old, not_done, mask, gamma=0.9, lam=1.0, last_values=torch.tensor([0.7]))
    assert float(out.q_targets[0, 1]) == pytest.approx(0.5 + 0.9 * 0.7)
    assert float(out.v_targets[0, 1]) == pytest.approx(0.5 + 0.9 * 0.7)
    terminal = sapo_targets(rewards, v_old, q_old, torch.tensor([[0.0, 1.0]]), mask, gamma=0.9, lam=1.0)
    assert float(terminal.q_targets[0, 1]) == 0.5 and float(terminal.v_targets[0, 1]) == pytest.approx(0.5)


def _packed_row(action_lengths, obs_length=2, prompt_length=3):
    """Token ids and per-token turn index of one transcript: prompt | a1 | o1 | a2 | o2 | ..."""
    tokens, turn_of = [], []
    tokens += [1] * prompt_length
    turn_of += [-1] * prompt_length
    for t, n in enumerate(action_lengths):
        tokens += [10 + t] * n
        turn_of += [t] * n
        tokens += [2] * obs_length
        turn_of += [-1] * obs_length
    turn = torch.tensor(turn_of)
    starts = torch.tensor([int((turn == t).nonzero()[0]) for t in range(len(action_lengths))])
    ends = torch.tensor([int((turn == t).nonzero()[-1]) for t in range(len(action_lengths))])
    return torch.tensor(tokens), turn, starts - 1, ends  # pre-action and post-action boundaries


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    action_lengths=st.lists(st.integers(1, 5), min_size=1, max_size=5),
    repeat=st.integers(2, 4),
    which=st.integers(0, 4),
)
def test_sapo_6_6_5_turn_averaged_losses_ignore_action_length(seed, action_lengths, repeat, which):
    gen = _gen(seed)
    which = which % len(action_lengths)
    embed = torch.randn(32, VOCAB, generator=gen, dtype=torch.float64) * 2  # logits depend on the token only
    n_turns = len(action_lengths)
    old_v = torch.rand(1, n_turns, generator=gen, dtype=torch.float64) * 2 - 1
    old_q = torch.rand(1, n_turns, generator=gen, dtype=torch.float64) * 2 - 1
    y_v = torch.rand(1, n_turns, generator=gen, dtype=torch.float64) * 2 - 1
    y_q = torch.rand(1, n_turns, generator=gen, dtype=torch.float64) * 2 - 1
    turn_adv = torch.randn(1, n_turns, generator=gen, dtype=torch.float64)
    turn_mask = torch.ones(1, n_turns, dtype=torch.bool)

    def losses(lengths):
        tokens, turn_of, pre, post = _packed_row(lengths)
        readout = value_readout(embed[tokens][None], POS, NEG, r_max=1.0)
        v, q = readout[:, pre], readout[:, post]  # values read at each turn's boundaries
        per_token_adv = torch.cat([turn_adv, torch.zeros(1, 1, dtype=turn_adv.dtype)], 1)[:, turn_of]  # -1: the 0
        return (
            sapo_value_loss(v, old_v, y_v, turn_mask),
            sapo_value_loss(q, old_q, y_q, turn_mask),
            per_token_adv,
            turn_of,
        )

    longer = list(action_lengths)
    longer[which] *= repeat
    base_v, base_q, _, _ = losses(action_lengths)
    long_v, long_q, per_token_adv, turn_of = losses(longer)
    assert float(long_v) == pytest.approx(float(base_v), abs=1e-12)
    assert float(long_q) == pytest.approx(float(base_q), abs=1e-12)
    for t in range(n_turns):
        assert torch.equal(per_token_adv[0, turn_of == t], turn_adv[0, t].expand(int((turn_of == t).sum())))
    assert torch.equal(per_token_adv[0, turn_of < 0], torch.zeros(int((turn_of < 0).sum()), dtype=torch.float64))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 6), turns=st.integers(1, 10), kappa=st.floats(0.0, 1.0))
def test_sapo_6_6_6_normalised_advantages(seed, rows, turns, kappa):
    gen = _gen(seed)
    adv = torch.randn(rows, turns, generator=gen, dtype=torch.float64)
    mask = torch.rand(rows, turns, generator=gen) < 0.8
    invalid = (torch.rand(rows, turns, generator=gen) < 0.3).double()
    out = sapo_advantages(adv, mask, invalid, kappa=kappa, eps=1e-8)
    corrected = invalid_action_correction(adv, invalid, kappa)[mask]
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
    if corrected.numel() < 2:
        assert torch.equal(out, torch.zeros_like(out))
        return
    sigma = float(corrected.std(unbiased=True))
    assert abs(float(out[mask].mean())) <= 1e-6
    assert float(out[mask].std(unbiased=True)) == pytest.approx(sigma / (sigma + 1e-8), rel=1e-9)


def test_sapo_token_measure_option_centres_the_token_mean():
    gen = _gen(11)
    adv = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    turn_lengths = torch.randint(0, 50, (3, 4), generator=gen)
    out = sapo_advantages(adv, mask, norm_measure="token", turn_lengths=turn_lengths)
    assert abs(float((out * turn_lengths * mask).sum())) < 1e-9
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
    with pytest.raises(ValueError, match="turn_lengths"):
        sapo_advantages(adv, mask, norm_measure="token")


def test_sapo_value_loss_is_in_normalised_units():
    # targets beyond R_max are clipped to +-1 in normalised units
    loss = sapo_value_loss(
        torch.tensor([[4.0]]), torch.tensor([[4.0]]), torch.tensor([[10.0]]), torch.ones(1, 1), r_max=4.0
    )
    assert float(loss) == 0.0
    loss = sapo_value_loss(
        torch.tensor([[0.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]]), torch.ones(1, 1), r_max=4.0
    )
    assert float(loss) == pytest.approx(0.5 * 0.5**2)


def test_excluded_ids_may_be_given_as_a_tensor():
    logits = torch.randn(4, VOCAB, generator=_gen(2))
    tokens = torch.tensor([0, 1, 2, 4])
    as_tuple = action_log_probs(logits, tokens, (POS, NEG))
    as_tensor = action_log_probs(logits, tokens, torch.tensor([POS, NEG]))
    assert torch.equal(as_tuple, as_tensor)
    assert torch.equal(entropy(logits, (POS, NEG)), entropy(logits, torch.tensor([POS, NEG])))
    masked = mask_excluded_logits(logits, torch.tensor([POS]))
    assert torch.isinf(masked[:, POS]).all() and torch.equal(masked[:, NEG], logits[:, NEG])
    with pytest.raises(ValueError, match="excluded_ids must lie in"):
        mask_excluded_logits(logits, torch.tensor([VOCAB]))


@pytest.mark.parametrize("excluded", [(), (POS, NEG)])
def test_log_probs_and_entropy_together_equal_the_separate_functions(excluded):
    gen = _gen(7)
    logits = (torch.randn(3, 4, VOCAB, generator=gen) * 4).requires_grad_(True)
    actions = _action_ids()
    tokens = actions[torch.randint(0, actions.numel(), (3, 4), generator=gen)]
    w_logp, w_ent = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)

    logp, ent = action_log_probs_and_entropy(logits, tokens, excluded)
    ((logp * w_logp).sum() + (ent * w_ent).sum()).backward()
    together = logits.grad.clone()
    logits.grad = None
    ((action_log_probs(logits, tokens, excluded) * w_logp).sum() + (entropy(logits, excluded) * w_ent).sum()).backward()
    assert torch.equal(logp, action_log_probs(logits, tokens, excluded))
    assert torch.equal(ent, entropy(logits, excluded))
    torch.testing.assert_close(together, logits.grad, rtol=1e-6, atol=1e-6)
    # one term alone: the other's gradient counts zero
    logits.grad = None
    action_log_probs_and_entropy(logits, tokens, excluded)[1].sum().backward()
    alone = logits.grad.clone()
    logits.grad = None
    entropy(logits, excluded).sum().backward()
    torch.testing.assert_close(alone, logits.grad)
