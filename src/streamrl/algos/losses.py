"""Policy, value and KL loss terms (docs/algorithms.md §1.1-1.3, §1.5, §3).

All per-token tensors are ``[B, T]`` with a 0/1 action-token ``mask``; reductions go through
:func:`streamrl.algos.aggregation.aggregate`.
"""

from __future__ import annotations

from typing import Literal

import torch

from streamrl.algos import _checks
from streamrl.algos.aggregation import AggregationMode, aggregate

# Log-ratios beyond this are clamped before exp() so a wild token cannot overflow to inf. exp(20)
# is ~5e8, far outside any clip range, so only already-clipped or dual-clipped tokens are touched.
_MAX_LOG_RATIO = 20.0


def _masked_mean(values: torch.Tensor, keep: torch.Tensor) -> float:
    count = int(keep.sum())
    return float(torch.where(keep, values, torch.zeros_like(values)).sum()) / count if count else 0.0


def tis_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Truncated importance weights ``min(exp(old - rollout), cap)`` (docs/algorithms.md §1.1-1.3),
    detached, shape of inputs."""
    _checks.same_shape("old_logp", old_logp, rollout_logp=rollout_logp)
    _checks.positive("cap", cap)
    log_w = (old_logp.detach() - rollout_logp.detach()).clamp(max=_MAX_LOG_RATIO)
    return log_w.exp().clamp(max=cap)


def check_dual_clip(dual_clip: float | None) -> None:
    """Dual-clip needs ``c > 1`` (docs/algorithms.md §1.1-1.3); call at configuration time to fail early."""
    if dual_clip is not None and not (isinstance(dual_clip, (int, float)) and dual_clip > 1.0):
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip!r}")


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
) -> torch.Tensor:
    """Per-token PPO loss (docs/algorithms.md §1.1-1.3), any shape.

    ``l = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``; with dual-clip ``c``,
    ``l = min(l, -c * A)`` where ``A < 0`` (equivalently: tokens with ``A < 0`` and ``ratio > c``
    are capped at ``c * |A|`` and pass no gradient).
    """
    if not (0.0 <= clip_low < 1.0) or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    check_dual_clip(dual_clip)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    return loss


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    agg: AggregationMode = "token-mean",
    tis_weights: torch.Tensor | None = None,
    norm_length: float | None = None,
    global_tokens: float | torch.Tensor | None = None,
    global_seqs: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with clip-higher, optional dual-clip and truncated IS.

    Per token: ``l = clipped_surrogate(exp(logp - old_logp), A, ...)``, times ``tis_weights``,
    reduced by ``aggregate``.

    Args:
        logp: ``[B, T]`` log-probs under the policy being trained (carries the gradient).
        old_logp: ``[B, T]`` proximal (old) log-probs; detached.
        advantages: ``[B, T]`` per token, or ``[B]`` broadcast over each row; detached.
        mask: ``[B, T]`` 0/1 action-token mask.
        tis_weights: ``[B, T]`` from :func:`tis_weights`, or None.
        norm_length, global_tokens, global_seqs: see :func:`aggregate`.
    Returns:
        ``(loss, stats)``; stats are means over this call's action tokens: ``clip_frac``
        (``clip_frac_low`` + ``clip_frac_high``), ``dual_clip_frac``, ``ppo_kl`` (mean of
        ``old_logp - logp``), ``ratio_max`` and ``tokens`` (the count, for weighting across calls).
    """
    _checks.ndim("logp", logp, 2)
    _checks.same_shape("logp", logp, old_logp=old_logp, mask=mask, tis_weights=tis_weights)
    if advantages.shape == logp.shape[:1]:
        advantages = advantages[:, None].expand_as(logp)
    _checks.same_shape("logp", logp, advantages=advantages)
    keep = mask.bool()
    adv = torch.where(keep, advantages.detach(), torch.zeros_like(advantages))
    # padding may hold -inf log-probs: neutralise it before exp() so no NaN reaches the gradient
    log_ratio = torch.where(keep, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    per_token = clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip)
    if tis_weights is not None:
        per_token = per_token * torch.where(keep, tis_weights.detach(), torch.zeros_like(tis_weights))
    loss = aggregate(per_token, keep, agg, norm_length, global_tokens, global_seqs)

    with torch.no_grad():
        low = keep & (adv < 0) & (ratio < 1.0 - clip_low)
        high = keep & (adv > 0) & (ratio > 1.0 + clip_high)
        dual = keep & (adv < 0) & (ratio > dual_clip) if dual_clip is not None else torch.zeros_like(keep)
        stats = {
            "clip_frac": _masked_mean((low | high).double(), keep),
            "clip_frac_low": _masked_mean(low.double(), keep),
            "clip_frac_high": _masked_mean(high.double(), keep),
            "dual_clip_frac": _masked_mean(dual.double(), keep),
            "ppo_kl": _masked_mean(-log_ratio.double(), keep),
            "ratio_max": float(torch.where(keep, ratio, torch.zeros_like(ratio)).max()) if keep.any() else 1.0,
            "tokens": float(keep.sum()),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.5,
    global_count: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Clipped value loss ``0.5 * max((V - G)^2, (V_clip - G)^2)``, ``V_clip = V_old + clip(V - V_old, ±clip)``,
    averaged over the items where ``mask`` is set (tokens or turns; any shape).

    ``global_count``: total masked items over all micro-batches (see :func:`aggregate`).
    """
    _checks.same_shape("values", values, old_values=old_values, targets=targets, mask=mask)
    _checks.positive("clip", clip)
    old = old_values.detach()
    target = targets.detach()
    clipped = old + (values - old).clamp(-clip, clip)
    per_item = 0.5 * torch.maximum((values - target) ** 2, (clipped - target) ** 2)
    return aggregate(per_item, mask, "token-mean", global_tokens=global_count)


KLKind = Literal["k1", "k2", "k3"]
# k3 is clamped to [0, 10]; |delta| beyond 20 already saturates that clamp, and capping delta keeps
# exp() finite so the clamp's zero gradient never meets an inf.
_K3_MAX = 10.0


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate on sampled tokens (docs/algorithms.md §1.5), ``delta = ref_logp - logp``.

    * ``k1 = -delta``: unbiased, can be negative.
    * ``k2 = delta^2 / 2``: non-negative; its gradient is the on-policy reverse-KL gradient.
    * ``k3 = exp(delta) - 1 - delta`` clamped to ``[0, 10]``: non-negative, unbiased, low variance.

    Shapes: ``logp`` and ``ref_logp`` alike (``[B, T]``); reduce with :func:`aggregate`.
    ``ref_logp`` is detached.
    """
    _checks.same_shape("logp", logp, ref_logp=ref_logp)
    delta = ref_logp.detach() - logp
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta**2
    if kind == "k3":
        delta = delta.clamp(-2 * _K3_MAX, 2 * _K3_MAX)
        return (delta.exp() - 1.0 - delta).clamp(0.0, _K3_MAX)
    raise ValueError(f"unknown KL estimator kind {kind!r} (known: k1, k2, k3)")
