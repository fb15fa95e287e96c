"""Generalised advantage estimation over masked positions (docs/algorithms.md §3, §6.2).

One recursion serves both levels. Positions are turns (turn-level GAE: one value per turn read at
the pre-action boundary) or tokens (token-level GAE). Masked positions (observation, prompt,
padding) are *skipped*, not zeroed: the last action position before a gap links straight to the
first one after it. A ``done`` flag on a valid position ends its episode there, so several episodes
can share a packed row.

    delta_t = r_t + gamma * (1 - d_t) * V_next - V_t
    A_t     = delta_t + gamma * lam * (1 - d_t) * A_next
    G_t     = A_t + V_t

where ``next`` is the next valid position of the row. After a row's last valid position,
``V_next`` is ``last_values`` (bootstrap for a truncated episode; 0 = terminal) and ``A_next = 0``.
Advantages and returns are targets, so they are computed without gradient.
"""

from __future__ import annotations

import torch

from streamrl.algos import _checks


def _check_discounts(gamma: float, lam: float) -> None:
    _checks.in_closed_unit("gamma", gamma)
    _checks.in_closed_unit("lam", lam)


@torch.no_grad()
def masked_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    dones: torch.Tensor | None = None,
    last_values: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the valid positions of each row, skipping masked ones.

    Args:
        rewards, values: ``[B, T]``. Entries at masked positions are ignored.
        mask: ``[B, T]`` 0/1, 1 on positions that carry a value (action tokens or valid turns).
        dones: optional ``[B, T]`` 0/1 terminal flags, read on valid positions only.
        last_values: ``[B]`` or scalar bootstrap value after each row's last valid position;
            default 0 (terminal).
    Returns:
        ``(advantages, returns)``, both ``[B, T]``, 0 at masked positions.
    """
    _checks.ndim("rewards", rewards, 2)
    _checks.same_shape("rewards", rewards, values=values, mask=mask, dones=dones)
    _check_discounts(gamma, lam)
    dtype = _checks.float_dtype(values)
    r = rewards.to(dtype)
    v = values.detach().to(dtype)
    valid = mask.bool()
    cont = gamma * (1.0 - dones.to(dtype)) if dones is not None else torch.full_like(v, gamma)
    rows, length = r.shape
    next_value = _checks.row_values("last_values", last_values, rows, v)
    next_adv = torch.zeros(rows, dtype=dtype, device=v.device)
    adv = torch.zeros_like(v)
    for t in range(length - 1, -1, -1):
        delta = r[:, t] + cont[:, t] * next_value - v[:, t]
        here = delta + cont[:, t] * lam * next_adv
        ok = valid[:, t]
        adv[:, t] = torch.where(ok, here, adv[:, t])
        next_value = torch.where(ok, v[:, t], next_value)
        next_adv = torch.where(ok, here, next_adv)
    returns = torch.where(valid, adv + v, torch.zeros_like(v))
    return adv, returns


def turn_gae_batched(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    last_values: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE on padded turns (docs/algorithms.md §3, §6.2).

    Args:
        rewards, values, dones, mask: ``[B, T]`` per turn (``values`` = V at each pre-action boundary).
        last_values: ``[B]`` V of the state after the last turn, used only when that turn is not
            done (``truncation="bootstrap"``); default terminal.
    Returns:
        ``(advantages, returns)`` ``[B, T]``; ``returns`` is the lambda-return target ``V + A``.
    """
    return masked_gae(rewards, values, mask, gamma, lam, dones=dones, last_values=last_values)
