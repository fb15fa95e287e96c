"""The optimiser every update builds (``adamw``) and the one step it takes (actor, PPO's critic,
SFT), and the non-finite guard.

Gradients are accumulated by the caller (``loss.backward()`` per micro-batch, each loss already a
share of the global mean); ``clip_and_step`` then clips, steps and clears them. With ``step`` given,
a non-finite loss, gradient norm or parameter raises ``NonFiniteError`` before the bad value reaches
the weights (loss, gradient norm) or, for parameters, before anything is published or checkpointed.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from streamrl.training.errors import NonFiniteError

#: how AdamW runs its step: an implementation choice of this build, never a checkpoint's
_IMPLEMENTATION_KEYS = ("fused", "foreach")


def adamw(parameters: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
          weight_decay: float = 0.0, eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW with the fused kernel where this torch build has it for the parameters' device and
    dtype (on CPU about 3x faster than the default foreach step, same update up to rounding),
    the default implementation otherwise."""
    parameters = list(parameters)
    settings: dict[str, Any] = {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "eps": eps}
    try:
        return torch.optim.AdamW(parameters, fused=True, **settings)
    except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(parameters, **settings)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any], model: Any = None) -> None:
    """``optimizer.load_state_dict`` that keeps this optimiser's implementation (fused or not):
    torch takes it from the checkpoint's groups, which would turn the fused step off when resuming
    an older checkpoint, or on under a build without the kernel. A state keyed by parameter name
    (what several learner processes save, ``training/data_parallel.py``) needs the ``model``."""
    kept = [{key: group[key] for key in _IMPLEMENTATION_KEYS if key in group} for group in optimizer.param_groups]
    if any(isinstance(key, str) for key in state.get("state", {})):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)
    for group, implementation in zip(optimizer.param_groups, kept):
        group.update(implementation)


def clip_and_step(
    parameters: Iterable[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    grad_clip: float,
    *,
    step: int | None = None,
    model: Any = None,
    what: str = "",
) -> float:
    """Clip the accumulated gradient to ``grad_clip``, take the optimiser step, zero the gradient;
    returns the gradient norm before clipping. ``step`` (the learner step being taken) turns on the
    guard on the norm and on ``model``'s parameters after the step; ``what`` prefixes the names in
    its messages (``"critic "``)."""
    norm = float(torch.nn.utils.clip_grad_norm_(parameters, grad_clip))
    if step is not None:
        check_finite_value(step, f"{what}gradient norm", norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step is not None and model is not None:
        check_finite_parameters(step, model, f"{what}parameter")
    return norm


def check_finite_value(step: int, name: str, value: float) -> None:
    if not math.isfinite(value):
        raise NonFiniteError(f"step {step}: non-finite {name} ({value}); training stopped before the update")


def check_finite_parameters(step: int, model: Any, what: str = "parameter") -> None:
    for name, parameter in model.named_parameters():
        if parameter.requires_grad and not bool(torch.isfinite(parameter).all()):
            raise NonFiniteError(
                f"step {step}: non-finite {what} {name} after the optimiser step (optim.lr too high?); "
                "training stopped, nothing of it was saved"
            )
