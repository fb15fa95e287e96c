"""GRPO and Dr.GRPO group-relative advantages (docs/algorithms.md §2)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from streamrl.algos import _checks


def _group_index(group_ids: torch.Tensor | Sequence[Hashable], n: int, device: torch.device) -> torch.Tensor:
    """Dense group index ``[n]`` (0..G-1) from tensor ids or any hashable ids (prompt ids, strings)."""
    if isinstance(group_ids, torch.Tensor):
        if group_ids.shape != (n,):
            raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, expected ({n},)")
        return torch.unique(group_ids, return_inverse=True)[1].to(device)
    ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids has {len(ids)} entries but rewards has {n}")
    dense: dict[Hashable, int] = {}
    return torch.tensor([dense.setdefault(g, len(dense)) for g in ids], dtype=torch.long, device=device)


def _group_moments(
    rewards: torch.Tensor, group_ids: torch.Tensor | Sequence[Hashable]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(index [n], count [G], centred [n], std [G], degenerate [G])`` in float64: each item's
    group, group sizes, rewards minus their group mean, unbiased group std, degeneracy.

    A group is degenerate when it has fewer than 2 members or all members share one outcome.
    """
    _checks.ndim("rewards", rewards, 1)
    r = rewards.detach().to(torch.float64)
    _checks.finite("rewards", r)
    idx = _group_index(group_ids, r.shape[0], r.device)
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=r.device)
    count = zeros.index_add(0, idx, torch.ones_like(r))
    mean = zeros.index_add(0, idx, r) / count.clamp(min=1)
    centred = r - mean[idx]
    std = (zeros.index_add(0, idx, centred**2) / (count - 1).clamp(min=1)).sqrt()
    high = torch.full_like(zeros, -torch.inf).scatter_reduce(0, idx, r, "amax")
    low = torch.full_like(zeros, torch.inf).scatter_reduce(0, idx, r, "amin")
    degenerate = (count < 2) | (high == low)
    return idx, count, centred, std, degenerate


@torch.no_grad()
def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages ``(R - mean_g) / (std_g + eps)`` with unbiased std.

    ``scale_by_std=False`` is Dr.GRPO: ``R - mean_g``. Members of a degenerate group (a singleton,
    or zero variance) get exactly 0; :func:`grpo_group_stats` counts them for logging.

    Args:
        rewards: ``[n]`` trajectory outcomes.
        group_ids: ``[n]`` ids (tensor, or a sequence of hashables such as prompt ids).
    Returns:
        ``[n]`` advantages in ``rewards``' float dtype; broadcast them to every action token.
    """
    idx, _, centred, std, degenerate = _group_moments(rewards, group_ids)
    adv = centred / (std[idx] + eps) if scale_by_std else centred
    adv = torch.where(degenerate[idx], torch.zeros_like(adv), adv)
    return adv.to(_checks.float_dtype(rewards))


@torch.no_grad()
def grpo_group_stats(rewards: torch.Tensor, group_ids: torch.Tensor | Sequence[Hashable]) -> dict[str, float]:
    """``n_groups``, ``frac_degenerate_groups`` (advantage collapse: zero variance or < 2 members) and
    ``n_singleton_groups`` (the spec's warning case; the caller logs it)."""
    _, count, _, _, degenerate = _group_moments(rewards, group_ids)
    n_groups = int(count.numel())
    return {
        "n_groups": float(n_groups),
        "frac_degenerate_groups": float(degenerate.sum()) / n_groups if n_groups else 0.0,
        "n_singleton_groups": float((count == 1).sum()),
    }
