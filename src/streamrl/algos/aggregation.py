"""Loss aggregation over masked tokens (docs/algorithms.md §1.4), with global denominators for micro-batching.

A mini-batch is often split into micro-batches whose gradients are accumulated. Averaging
per-micro-batch means is wrong whenever micro-batches hold different numbers of tokens. Instead,
pass the *mini-batch* totals (``global_tokens``: action tokens over all micro-batches and ranks,
``global_seqs``: rows over all micro-batches and ranks). Each micro-batch then returns its share,
and the sum of the shares is exactly the full-batch loss and gradient.
"""

from __future__ import annotations

from typing import Literal

import torch

from streamrl.algos import _checks

AggregationMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGGREGATION_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _denominator(given: float | int | torch.Tensor | None, local: float, name: str) -> float | torch.Tensor:
    if given is None:
        return max(local, 1.0)
    if isinstance(given, torch.Tensor):
        if bool((given < 0).any()):
            raise ValueError(f"{name} must be non-negative")
        return given.clamp(min=1)
    if given < 0:
        raise ValueError(f"{name} must be non-negative, got {given}")
    return max(float(given), 1.0)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: AggregationMode = "token-mean",
    norm_length: float | None = None,
    global_tokens: float | torch.Tensor | None = None,
    global_seqs: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` ``[B, T]`` to a scalar under ``mask`` ``[B, T]`` (0/1).

    * ``token-mean``: ``sum(m * l) / global_tokens`` (default ``sum(m)``). Works for any shape.
    * ``seq-mean-token-sum``: ``sum(m * l) / global_seqs`` (default ``B``).
    * ``seq-mean-token-mean``: ``sum_i (sum_j m l / max(1, sum_j m)) / global_seqs``; a row must not
      be split across micro-batches.
    * ``seq-mean-token-sum-norm`` (Dr.GRPO): ``sum(m * l) / (global_seqs * norm_length)``;
      ``norm_length`` (the maximum response length) is required.

    Masked entries never contribute, even if they hold NaN or inf. A zero denominator counts as 1,
    so an all-masked batch gives 0 with zero gradient.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r} (known: {', '.join(AGGREGATION_MODES)})")
    _checks.same_shape("values", values, mask=mask)
    keep = mask.bool()
    masked = torch.where(keep, values, torch.zeros_like(values))
    if mode == "token-mean":
        return masked.sum() / _denominator(global_tokens, float(keep.sum()), "global_tokens")
    _checks.ndim("values", values, 2)
    seqs = _denominator(global_seqs, float(values.shape[0]), "global_seqs")
    if mode == "seq-mean-token-sum":
        return masked.sum() / seqs
    if mode == "seq-mean-token-mean":
        per_row = masked.sum(dim=1) / keep.sum(dim=1).clamp(min=1)
        return per_row.sum() / seqs
    if norm_length is None:
        raise ValueError("aggregation 'seq-mean-token-sum-norm' needs norm_length (the maximum response length)")
    _checks.positive("norm_length", norm_length)
    return masked.sum() / (seqs * norm_length)
