"""The learner's AdamW: the fused kernel gives the default implementation's update up to float
rounding, falls back where the build has none, and keeps its implementation across a checkpoint."""

from __future__ import annotations

import pytest
import torch

from streamrl.policy.loading import load_policy
from streamrl.training.optim import adamw, load_optimizer_state


def _three_steps(fused: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The tiny model's parameters before and after three AdamW steps on a language-model loss."""
    policy = load_policy("tiny", seed=0)
    model = policy.model
    parameters = policy.trainable_parameters()
    optimizer = adamw(parameters, lr=1e-3, weight_decay=0.1) if fused else torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.1)
    assert bool(optimizer.param_groups[0]["fused"]) is fused
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ids = torch.randint(16, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return before, {name: p.detach().clone() for name, p in model.named_parameters()}


def test_fused_adamw_steps_like_the_default_up_to_rounding():
    before, fused = _three_steps(fused=True)
    _, default = _three_steps(fused=False)
    for name, start in before.items():
        moved = default[name] - start
        assert float(moved.abs().max()) > 1e-4, name  # every parameter was updated
        # float32 rounding of differently ordered arithmetic: far below the step size (lr = 1e-3).
        # It feeds the next steps' gradients, and where a gradient is near zero Adam's m/sqrt(v)
        # magnifies it (1.5e-6 on one weight on an AVX2 EPYC), so a few elements get a looser bound
        difference = (fused[name] - default[name]).abs()
        assert float(difference.max()) < 1e-5, name
        assert float((difference > 1e-6).float().mean()) < 1e-3, name


def test_adamw_falls_back_where_there_is_no_fused_kernel(monkeypatch):
    original = torch.optim.AdamW

    def without_fused(parameters, fused=None, **settings):
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return original(parameters, **settings)

    monkeypatch.setattr(torch.optim, "AdamW", without_fused)
    optimizer = adamw(iter([torch.nn.Parameter(torch.ones(3))]), lr=0.1)  # a generator is read once
    assert not optimizer.param_groups[0]["fused"] and len(optimizer.param_groups[0]["params"]) == 1


@pytest.mark.parametrize("saved_fused", [None, True])
def test_loading_a_checkpoint_keeps_this_optimiser_implementation(saved_fused):
    weight = torch.nn.Parameter(torch.ones(4))
    saved = torch.optim.AdamW([weight], lr=0.1, fused=saved_fused)
    weight.sum().backward()
    saved.step()
    optimizer = adamw([weight], lr=0.1)
    optimizer.param_groups[0]["fused"] = not saved_fused  # the build's choice, unlike the checkpoint's
    load_optimizer_state(optimizer, saved.state_dict())
    assert optimizer.param_groups[0]["fused"] is (not saved_fused)
    assert torch.equal(optimizer.state[weight]["exp_avg"], saved.state[weight]["exp_avg"])
