"""SAPO's in-stream values and their targets (docs/algorithms.md §6.1-6.3).

One model serves as policy and critic: the value of a context is read from the LM-head logits of
two reserved tokens at a causal boundary, ``V = r_max * squash((z[w+] - z[w-]) / tau)``. State
values are read at the pre-action boundary (the last context token before a turn's action), action
values at the post-action boundary (the turn's last action token).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from streamrl.algos import _checks
from streamrl.algos.gae import turn_gae_batched
from streamrl.algos.losses import value_loss

Squash = Literal["clip", "tanh"]


def value_readout(
    logits: torch.Tensor,
    pos_id: int,
    neg_id: int,
    r_max: float = 1.0,
    tau: float = 1.0,
    squash: Squash = "clip",
) -> torch.Tensor:
    """``r_max * clip((z[pos] - z[neg]) / tau, -1, 1)`` (``squash="tanh"``: ``tanh`` instead).

    Only two logit columns are touched, so this is cheap at every position.

    Args:
        logits: ``[..., V]``. Returns: ``[...]`` in ``[-r_max, r_max]``.
    """
    vocab = logits.shape[-1]
    if pos_id == neg_id or not (0 <= pos_id < vocab and 0 <= neg_id < vocab):
        raise ValueError(f"pos_id and neg_id must be distinct ids in [0, {vocab - 1}], got {pos_id}, {neg_id}")
    _checks.positive("r_max", r_max)
    _checks.positive("tau", tau)
    diff = (logits[..., pos_id] - logits[..., neg_id]) / tau
    if squash == "clip":
        return r_max * diff.clamp(-1.0, 1.0)
    if squash == "tanh":
        return r_max * torch.tanh(diff)
    raise ValueError(f"unknown value squash {squash!r} (known: clip, tanh)")


def value_saturation_frac(values: torch.Tensor, r_max: float, mask: torch.Tensor | None = None) -> float:
    """Share of readouts at ``|V| = r_max``, where the clip squash passes no gradient (for logging)."""
    saturated = values.detach().abs() >= r_max
    if mask is None:
        return float(saturated.double().mean()) if saturated.numel() else 0.0
    keep = mask.bool()
    count = int(keep.sum())
    return float((saturated & keep).sum()) / count if count else 0.0


@torch.no_grad()
def sarsa_targets(
    rewards: torch.Tensor,
    q_old: torch.Tensor,
    dones: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    last_values: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """On-policy SARSA targets ``y^Q_t = r_t + gamma * (1 - d_t) * Q_old[next turn]``.

    "Next turn" is the next valid turn of the row: the action actually taken, not a max. After a
    row's last valid turn, ``last_values`` (the bootstrap ``V_old(c_{T+1})``, default 0) stands in.

    Args:
        rewards, q_old, dones, mask: ``[B, T]`` per turn. last_values: ``[B]``, scalar or None.
    Returns:
        ``[B, T]``, 0 at padded turns.
    """
    _checks.ndim("rewards", rewards, 2)
    _checks.same_shape("rewards", rewards, q_old=q_old, dones=dones, mask=mask)
    _checks.in_closed_unit("gamma", gamma)
    dtype = _checks.float_dtype(q_old)
    valid = mask.bool()
    cont = gamma * (1.0 - dones.to(dtype))
    rows, turns = rewards.shape
    next_q = _checks.row_values("last_values", last_values, rows, q_old.to(dtype))
    targets = torch.zeros(rewards.shape, dtype=dtype, device=rewards.device)
    for t in range(turns - 1, -1, -1):
        ok = valid[:, t]
        targets[:, t] = torch.where(ok, rewards[:, t].to(dtype) + cont[:, t] * next_q, targets[:, t])
        next_q = torch.where(ok, q_old[:, t].to(dtype), next_q)
    return targets


class SapoTargets(NamedTuple):
    """Per-turn ``[B, T]`` outputs of :func:`sapo_targets`."""

    advantages: torch.Tensor  # raw GAE advantages A_t (before correction and normalisation)
    v_targets: torch.Tensor  # lambda-returns V_old + A
    q_targets: torch.Tensor  # SARSA targets


def sapo_targets(
    rewards: torch.Tensor,
    v_old: torch.Tensor,
    q_old: torch.Tensor,
    dones: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
    last_values: torch.Tensor | float | None = None,
) -> SapoTargets:
    """Turn-level GAE advantages, lambda-return V targets and SARSA Q targets (docs/algorithms.md §6.2).

    ``last_values`` implements ``truncation="bootstrap"`` for rows whose last turn is not done: the
    same ``V_old(c_{T+1})`` bootstraps both targets. Leave it None for ``truncation="terminal"``
    (and set the last turn's done flag).
    """
    adv, v_targets = turn_gae_batched(rewards, v_old, dones, mask, gamma, lam, last_values)
    q_targets = sarsa_targets(rewards, q_old, dones, mask, gamma, last_values)
    return SapoTargets(adv, v_targets, q_targets)


def invalid_action_correction(advantages: torch.Tensor, invalid: torch.Tensor, kappa: float = 0.1) -> torch.Tensor:
    """``A - kappa * invalid`` (our reading of SAPO's invalid-action indicator; ``kappa = 0.1 * R_max``)."""
    _checks.same_shape("advantages", advantages, invalid=invalid)
    if kappa < 0:
        raise ValueError(f"kappa must be non-negative, got {kappa}")
    return advantages - kappa * invalid.to(advantages.dtype)


def sapo_value_loss(
    predicted: torch.Tensor,
    old: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    r_max: float = 1.0,
    clip: float = 0.5,
    global_count: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """SAPO's V or Q loss in normalised units (docs/algorithms.md §6.3), averaged over turns (not tokens).

    ``value_loss(V / r_max, V_old / r_max, clip(y / r_max, -1, 1), mask, clip)``.

    Args:
        predicted, old, targets, mask: ``[B, T]`` per turn (V at pre-action, or Q at post-action
            boundaries). For Q, the mask excludes turns without action tokens.
    """
    _checks.positive("r_max", r_max)
    return value_loss(
        predicted / r_max,
        old / r_max,
        (targets / r_max).clamp(-1.0, 1.0),
        mask,
        clip=clip,
        global_count=global_count,
    )
