"""``Policy.limit_training``: only the top blocks (and, for SAPO, the value rows) train, and the
backward pass really stops at the lowest trained block."""

from __future__ import annotations

import pytest
import torch

from streamrl.policy.loading import load_policy
from streamrl.policy.scoring import forward_for_loss

SMALL = {"hidden_size": 32, "num_hidden_layers": 4, "intermediate_size": 64}


def _lora_policy():
    return load_policy("tiny", model_overrides=SMALL, lora={"r": 4}, seed=0)


def _trained_blocks(policy) -> set[int]:
    from streamrl.policy.policy import _block_index

    return {_block_index(n) for n, p in policy.model.named_parameters() if p.requires_grad and _block_index(n) is not None}


def _backward(policy) -> None:
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    token_mask = torch.zeros_like(ids, dtype=torch.bool)
    token_mask[:, 6:] = True
    out = forward_for_loss(policy.model, ids, mask, token_mask=token_mask, excluded_ids=policy.banned_token_ids)
    (-out.logprobs.sum()).backward()


def test_top_layers_train_and_the_rest_gets_no_gradient():
    policy = _lora_policy()
    policy.limit_training(top_layers=2, value_rows=False)
    assert _trained_blocks(policy) == {2, 3}
    assert not any("trainable_tokens_delta" in n for n, p in policy.model.named_parameters() if p.requires_grad)
    _backward(policy)
    for name, parameter in policy.model.named_parameters():
        if "lora_" not in name:
            continue
        if int(name.split(".layers.")[1].split(".")[0]) < 2:
            assert parameter.grad is None, f"{name} got a gradient below the trained blocks"
        elif "lora_B" in name:  # lora_B starts at zero, so lora_A's gradient is 0 on the first step
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, f"{name} got no gradient"


@pytest.mark.parametrize(("value_rows", "reaches_block_0"), [(False, False), (True, True)])
def test_the_backward_pass_stops_at_the_lowest_trained_block(value_rows, reaches_block_0):
    policy = _lora_policy()
    policy.limit_training(top_layers=2, value_rows=value_rows)
    base = policy.model.get_base_model()
    reached = []
    base.model.layers[0].register_full_backward_hook(lambda *_: reached.append(True))
    _backward(policy)
    # trainable value rows sit in the embedding: their gradient drags the pass through every block
    assert bool(reached) == reaches_block_0


def test_a_later_call_starts_from_what_the_model_trains_unlimited():
    policy = _lora_policy()
    everything = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    policy.limit_training(top_layers=1, value_rows=False)
    policy.limit_training()  # e.g. SFT limited it, then SAPO's learner needs the value rows
    assert {n for n, p in policy.model.named_parameters() if p.requires_grad} == everything
    assert any("trainable_tokens_delta" in n for n in everything)


def test_too_many_layers_is_refused():
    with pytest.raises(ValueError, match="between 1 and the model's 4 layers"):
        _lora_policy().limit_training(top_layers=5)
