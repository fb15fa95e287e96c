"""score / forward_for_loss: alignment, padding, packing, micro-batches, value logits, gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.algos.values import value_readout
from streamrl.policy.scoring import forward_for_loss, score


def reference_logprobs(model, ids: list[int], excluded, temperature: float = 1.0) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 from one plain full forward of the unpadded row."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / temperature
    logits[:, list(excluded)] = float("-inf")
    return logits.log_softmax(-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def random_rows(count: int, low: int, high: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=generator).tolist()
    return [torch.randint(20, 2000, (n,), generator=generator).tolist() for n in lengths]


def right_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def test_alignment_matches_a_plain_forward(small_policy):
    model, excluded = small_policy.model.eval(), small_policy.banned_token_ids
    rows = random_rows(5, 2, 40, seed=1)
    ids, mask = right_padded(rows)
    out = score(model, {"input_ids": ids, "attention_mask": mask}, micro_batch_size=2, excluded_ids=excluded)
    for i, row in enumerate(rows):
        assert torch.allclose(out.logprobs[i, 1 : len(row)], reference_logprobs(model, row, excluded), atol=1e-5)
        assert out.logprobs[i, 0] == 0 and not out.logprobs[i, len(row) :].any()
        assert (out.entropy[i, 1 : len(row)] > 0).all() and not out.entropy[i, len(row) :].any()


@settings(max_examples=5, deadline=None)
@given(micro=st.integers(1, 6), temperature=st.sampled_from([0.5, 1.0, 1.7]), seed=st.integers(0, 10**6))
def test_micro_batching_and_temperature(small_policy, micro, temperature, seed):
    model, excluded = small_policy.model.eval(), small_policy.banned_token_ids
    rows = random_rows(5, 2, 24, seed)
    ids, mask = right_padded(rows)
    batch = {"input_ids": ids, "attention_mask": mask}
    whole = score(model, batch, micro_batch_size=8, excluded_ids=excluded, temperature=temperature)
    parts = score(model, batch, micro_batch_size=micro, excluded_ids=excluded, temperature=temperature)
    assert torch.allclose(whole.logprobs, parts.logprobs, atol=1e-5)
    assert torch.allclose(whole.entropy, parts.entropy, atol=1e-4)
    row = rows[0]
    ref = reference_logprobs(model, row, excluded, temperature)
    assert torch.allclose(whole.logprobs[0, 1 : len(row)], ref, atol=1e-5)


def test_action_vocabulary_excludes_banned_ids(small_policy):
    model = small_policy.model.eval()
    ids, mask = right_padded(random_rows(2, 8, 12, seed=3))
    with_ban = score(model, {"input_ids": ids, "attention_mask": mask}, excluded_ids=small_policy.banned_token_ids)
    without = score(model, {"input_ids": ids, "attention_mask": mask})
    # removing tokens from the normaliser raises every remaining token's log-prob
    scored = mask.bool().clone()
    scored[:, 0] = False
    assert (with_ban.logprobs[scored] > without.logprobs[scored]).all()


def test_packed_rows_equal_separate_rows(small_policy):
    model, excluded = small_policy.model.eval(), small_policy.banned_token_ids
    first, second = random_rows(2, 6, 15, seed=4)
    packed = torch.tensor([first + second + [0, 0]])
    segments = torch.tensor([[1] * len(first) + [2] * len(second) + [0, 0]])
    out = score(
        model,
        {"input_ids": packed, "attention_mask": (segments > 0).long(), "segment_ids": segments},
        excluded_ids=excluded,
    )
    assert torch.allclose(out.logprobs[0, 1 : len(first)], reference_logprobs(model, first, excluded), atol=1e-5)
    start = len(first)
    assert out.logprobs[0, start] == 0  # a segment's first token has no predecessor
    assert torch.allclose(
        out.logprobs[0, start + 1 : start + len(second)], reference_logprobs(model, second, excluded), atol=1e-5
    )


def test_token_mask_limits_the_work_and_rejects_column_zero(small_policy):
    model = small_policy.model.eval()
    ids, mask = right_padded(random_rows(2, 10, 11, seed=5))
    token_mask = torch.zeros_like(mask, dtype=torch.bool)
    token_mask[:, 4:7] = True
    out = score(model, {"input_ids": ids, "attention_mask": mask, "token_mask": token_mask})
    full = score(model, {"input_ids": ids, "attention_mask": mask})
    assert torch.allclose(out.logprobs[token_mask], full.logprobs[token_mask], atol=1e-6)
    assert not out.logprobs[~token_mask].any()
    token_mask[:, 0] = True
    with pytest.raises(ValueError, match="column 0"):
        forward_for_loss(model, ids, mask, token_mask=token_mask)


class ShiftedHead(torch.nn.Module):
    """The same LM head plus a context-dependent constant added to every logit."""

    def __init__(self, head: torch.nn.Module):
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden) + 10.0 * hidden.sum(-1, keepdim=True)


def test_value_readout_and_logprobs_ignore_a_constant_logit_shift(small_policy):
    import copy

    model = small_policy.model.eval()
    shifted = copy.deepcopy(model)
    shifted.lm_head = ShiftedHead(shifted.lm_head)
    ids, mask = right_padded(random_rows(3, 6, 20, seed=6))
    value_mask = mask.bool().clone()
    batch = {"input_ids": ids, "attention_mask": mask, "value_mask": value_mask}
    kwargs = dict(excluded_ids=small_policy.banned_token_ids, value_token_ids=small_policy.value_token_ids)
    plain, moved = score(model, batch, **kwargs), score(shifted, batch, **kwargs)
    assert not torch.allclose(plain.value_logits, moved.value_logits)  # the raw logits did move
    assert torch.allclose(plain.value_logit_diff, moved.value_logit_diff, atol=1e-3)
    readout = lambda out: value_readout(out.value_logits, 0, 1, r_max=1.0)  # noqa: E731
    assert torch.allclose(readout(plain), readout(moved), atol=1e-3)
    assert torch.allclose(plain.logprobs, moved.logprobs, atol=1e-3)
    assert (plain.value_logit_diff[value_mask].abs() < 0.5).all()  # near zero at initialisation


def test_forward_for_loss_is_differentiable_and_ignores_banned_logits(small_policy):
    model = small_policy.model.train()
    ids, mask = right_padded(random_rows(2, 8, 12, seed=7))
    model.zero_grad()
    out = forward_for_loss(
        model,
        ids,
        mask,
        excluded_ids=small_policy.banned_token_ids,
        value_token_ids=small_policy.value_token_ids,
        value_mask=mask.bool(),
    )
    loss = -out.logprobs.sum() - out.entropy.sum()
    loss.backward()
    head_grad = model.get_output_embeddings().weight.grad
    assert head_grad is not None and head_grad.abs().sum() > 0
    # the policy terms never touch the value tokens' rows (the value logits were not in the loss)
    assert head_grad[list(small_policy.value_token_ids)].abs().sum() == 0
    model.zero_grad()
    model.eval()


def test_forward_for_loss_gradients_match_a_plain_log_softmax(small_policy):
    """The learner's loss terms (log-probs and entropy from one pass) give the parameters the
    gradient of the textbook definition on a plain forward's logits."""
    model, excluded = small_policy.model.train(), list(small_policy.banned_token_ids)
    rows = random_rows(3, 6, 14, seed=11)
    ids, mask = right_padded(rows)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    params = [p for p in model.parameters() if p.requires_grad]

    out = forward_for_loss(model, ids, mask, excluded_ids=excluded)
    ours = torch.autograd.grad((out.logprobs * weights).sum() + 0.3 * (out.entropy * weights).sum(), params)

    scored = mask.bool().clone()
    scored[:, 0] = False
    scored[:, 1:] &= mask[:, :-1].bool()
    log_softmax = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    log_softmax = log_softmax.index_fill(-1, torch.tensor(excluded), float("-inf")).log_softmax(-1)
    logprobs = log_softmax.gather(-1, ids[:, 1:, None]).squeeze(-1)
    probs = log_softmax.exp()
    ent = -(probs * torch.where(probs > 0, log_softmax, torch.zeros_like(probs))).sum(-1)
    w, keep = weights[:, 1:], scored[:, 1:]
    loss = (logprobs * w)[keep].sum() + 0.3 * (ent * w)[keep].sum()
    reference = torch.autograd.grad(loss, params)
    model.eval()
    torch.testing.assert_close(out.logprobs[scored], logprobs[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.entropy[scored], ent[keep], atol=1e-5, rtol=1e-5)
    for got, expected in zip(ours, reference):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_value_logits_are_differentiable(small_policy):
    model = small_policy.model.train()
    ids, mask = right_padded(random_rows(1, 8, 9, seed=8))
    model.zero_grad()
    out = forward_for_loss(
        model, ids, mask, value_token_ids=small_policy.value_token_ids, value_mask=mask.bool(), with_entropy=False
    )
    out.value_logit_diff.sum().backward()
    head_grad = model.get_output_embeddings().weight.grad
    plus, minus = small_policy.value_token_ids
    assert head_grad[plus].abs().sum() > 0 and torch.allclose(head_grad[plus], -head_grad[minus])
    model.zero_grad()
    model.eval()


def test_bad_inputs_are_named(small_policy):
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        forward_for_loss(small_policy.model, ids, torch.ones(2, 4))
    with pytest.raises(ValueError, match="value_mask given without value_token_ids"):
        forward_for_loss(small_policy.model, ids, torch.ones_like(ids), value_mask=torch.ones_like(ids))
    with pytest.raises(ValueError, match="missing"):
        score(small_policy.model, {"input_ids": ids})
    with pytest.raises(ValueError, match="no rows"):
        score(small_policy.model, {"input_ids": ids[:0], "attention_mask": ids[:0]})
