"""Advantage estimators of the single-rollout algorithms, built from the primitives.

* SPO: ``A = R - baseline`` (tracker read before the reward is absorbed), then N_traj (docs/algorithms.md §4).
* SPO++: ``A = R - frozen baseline`` (event-time memory read at dispatch), then N_tok (docs/algorithms.md §5).
* SAPO: raw turn-GAE advantages, minus the invalid-action penalty, then N_turn (or N_tok over
  turns weighted by their action-token counts) (docs/algorithms.md §6.2).

GRPO/Dr.GRPO live in :mod:`streamrl.algos.grpo` and GAE in :mod:`streamrl.algos.gae`.
"""

from __future__ import annotations

from typing import Literal

import torch

from streamrl.algos import _checks
from streamrl.algos.normalize import token_measure_whiten, turn_normalize, whiten
from streamrl.algos.values import invalid_action_correction


def _raw(rewards: torch.Tensor, baselines: torch.Tensor) -> torch.Tensor:
    _checks.ndim("rewards", rewards, 1)
    _checks.same_shape("rewards", rewards, baselines=baselines)
    return rewards.detach().to(torch.float64) - baselines.detach().to(torch.float64)


def spo_advantages(rewards: torch.Tensor, baselines: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """SPO: ``N_traj(R - baseline)``. ``rewards``, ``baselines``: ``[n]`` -> ``[n]`` (rewards' dtype)."""
    return whiten(_raw(rewards, baselines), eps).to(_checks.float_dtype(rewards))


def spopp_advantages(
    rewards: torch.Tensor, baselines: torch.Tensor, lengths: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """SPO++: ``N_tok(R - frozen baseline; L)`` over the whole learner batch.

    Args:
        rewards, baselines, lengths: ``[n]``; ``lengths`` = action tokens per trajectory.
    """
    return token_measure_whiten(_raw(rewards, baselines), lengths, eps).to(_checks.float_dtype(rewards))


def sapo_advantages(
    gae_advantages: torch.Tensor,
    mask: torch.Tensor,
    invalid: torch.Tensor | None = None,
    kappa: float = 0.1,
    eps: float = 1e-8,
    norm_measure: Literal["turn", "token"] = "turn",
    turn_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """SAPO policy advantages per turn.

    Args:
        gae_advantages: ``[B, T]`` raw turn-GAE advantages (``sapo_targets(...).advantages``).
        mask: ``[B, T]`` valid turns.
        invalid: ``[B, T]`` 0/1 invalid-action flags, or None.
        kappa: invalid-action penalty (``0.1 * R_max``).
        norm_measure: ``"turn"`` (each valid turn weighs 1, the SAPO default) or ``"token"``
            (each turn weighs its action-token count ``turn_lengths``, SPO++'s measure).
    Returns:
        ``[B, T]`` normalised advantages, 0 on padded turns; broadcast with
        ``streamrl.training.batch.broadcast_to_tokens``.
    """
    adv = gae_advantages if invalid is None else invalid_action_correction(gae_advantages, invalid, kappa)
    if norm_measure == "turn":
        return turn_normalize(adv, mask, eps)
    if norm_measure == "token":
        if turn_lengths is None:
            raise ValueError("norm_measure='token' needs turn_lengths (action tokens per turn)")
        _checks.same_shape("gae_advantages", gae_advantages, turn_lengths=turn_lengths, mask=mask)
        weights = torch.where(
            mask.bool(), turn_lengths.to(torch.float64), torch.zeros_like(turn_lengths, dtype=torch.float64)
        )
        return token_measure_whiten(torch.where(mask.bool(), adv, torch.zeros_like(adv)), weights, eps) * mask.to(
            adv.dtype
        )
    raise ValueError(f"unknown norm_measure {norm_measure!r} (known: turn, token)")
