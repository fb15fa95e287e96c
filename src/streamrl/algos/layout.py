"""Moving per-turn quantities to and from packed token rows.

A row of ``L`` tokens holds several turns. Turn-level algorithms (turn GAE, SAPO) need values read
at one position per turn (:func:`gather_positions`) and advantages spread over a turn's action
tokens (:func:`broadcast_turns_to_tokens`).
"""

from __future__ import annotations

import torch

from streamrl.algos import _checks


def gather_positions(token_values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Read ``token_values`` at one position per turn.

    Args:
        token_values: ``[B, L]`` (e.g. a value readout at every position).
        positions: ``[B, T]`` long, the token index of each turn's boundary; ``-1`` for padded turns.
    Returns:
        ``[B, T]``, 0 at padded turns; differentiable with respect to ``token_values``.
    """
    _checks.ndim("token_values", token_values, 2)
    _checks.ndim("positions", positions, 2)
    if positions.shape[0] != token_values.shape[0]:
        raise ValueError(f"positions has {positions.shape[0]} rows but token_values has {token_values.shape[0]}")
    if bool((positions >= token_values.shape[1]).any()) or bool((positions < -1).any()):
        raise ValueError(f"positions must lie in [-1, {token_values.shape[1] - 1}]")
    present = positions >= 0
    picked = token_values.gather(1, positions.clamp(min=0))
    return torch.where(present, picked, torch.zeros_like(picked))


def broadcast_turns_to_tokens(turn_values: torch.Tensor, token_turn: torch.Tensor) -> torch.Tensor:
    """Give every action token its turn's value.

    Args:
        turn_values: ``[B, T]`` per turn (e.g. normalised turn advantages).
        token_turn: ``[B, L]`` long, the turn index of each action token; ``-1`` on non-action tokens.
    Returns:
        ``[B, L]``, 0 on non-action tokens.
    """
    _checks.ndim("turn_values", turn_values, 2)
    _checks.ndim("token_turn", token_turn, 2)
    if token_turn.shape[0] != turn_values.shape[0]:
        raise ValueError(f"token_turn has {token_turn.shape[0]} rows but turn_values has {turn_values.shape[0]}")
    if bool((token_turn >= turn_values.shape[1]).any()) or bool((token_turn < -1).any()):
        raise ValueError(f"token_turn must lie in [-1, {turn_values.shape[1] - 1}]")
    action = token_turn >= 0
    spread = turn_values.gather(1, token_turn.clamp(min=0))
    return torch.where(action, spread, torch.zeros_like(spread))
