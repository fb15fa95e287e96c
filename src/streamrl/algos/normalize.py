"""Advantage standardisation under three measures (docs/algorithms.md §1.6).

* N_traj (:func:`whiten`): every trajectory (or masked item) weighs 1. SPO's global normalisation.
* N_tok (:func:`token_measure_whiten`): trajectory ``i`` weighs its action-token count ``L_i``, so
  a token-mean loss sees centred advantages: ``sum_i L_i * out_i == 0``. SPO++'s Eq. 6.
* N_turn (:func:`turn_normalize`): N_traj over the valid turns of a padded ``[B, T]`` batch (SAPO).

All three are one weighted standardisation: ``mu = sum w a / W``, ``var = sum w (a - mu)^2 / (W - 1)``
with ``W = sum w``, and ``out = (a - mu) / (sqrt(var) + eps)``. It is computed in float64 and
returned in the input dtype. Degenerate inputs (``W <= 1`` or every positively weighted value equal)
give exact zeros, never NaN. Advantages are constants for the loss, so results carry no gradient.
"""

from __future__ import annotations

import torch

from streamrl.algos import _checks


def _weighted_moments(values: torch.Tensor, weights: torch.Tensor) -> tuple[float, float, float] | None:
    """``(W, mu, sigma)`` of float64 ``values`` under ``weights``; None when the input is degenerate."""
    total = float(weights.sum())
    if total <= 1.0:
        return None
    support = values[weights > 0]
    if bool((support == support[0]).all()):
        return None
    mu = (weights * values).sum() / total
    var = (weights * (values - mu) ** 2).sum() / (total - 1.0)
    return total, float(mu), float(var.sqrt())


def _prepare(adv: torch.Tensor, weights: torch.Tensor, weights_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.same_shape("adv", adv, **{weights_name: weights})
    a = adv.detach().to(torch.float64)
    w = weights.detach().to(torch.float64)
    _checks.finite("adv", a)
    _checks.finite(weights_name, w)
    if bool((w < 0).any()):
        raise ValueError(f"{weights_name} must be non-negative")
    return a, w


def _standardise(adv: torch.Tensor, weights: torch.Tensor, eps: float, weights_name: str) -> torch.Tensor:
    a, w = _prepare(adv, weights, weights_name)
    out_dtype = _checks.float_dtype(adv)
    moments = _weighted_moments(a, w)
    if moments is None:
        return torch.zeros(adv.shape, dtype=out_dtype, device=adv.device)
    _, mu, sigma = moments
    return ((a - mu) / (sigma + eps)).to(out_dtype)


def whiten(adv: torch.Tensor, eps: float = 1e-8, mask: torch.Tensor | None = None) -> torch.Tensor:
    """N_traj: standardise with unbiased std, every item (or every item where ``mask`` is set) weighted 1.

    Args:
        adv: raw advantages, any shape (``[n]`` for trajectories, ``[B, T]`` for padded turns or tokens).
        eps: added to the std before dividing.
        mask: optional 0/1 tensor of ``adv``'s shape; masked-out items do not enter the statistics and
            come back as 0.
    Returns:
        Tensor of ``adv``'s shape and dtype.
    """
    if mask is None:
        return _standardise(adv, torch.ones_like(adv, dtype=torch.float64), eps, "mask")
    _checks.same_shape("adv", adv, mask=mask)
    keep = mask.bool()
    # padding may hold anything; it neither enters the statistics nor comes back
    out = _standardise(torch.where(keep, adv, torch.zeros_like(adv)), mask, eps, "mask")
    return torch.where(keep, out, torch.zeros_like(out))


def token_measure_whiten(adv: torch.Tensor, lengths: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """N_tok: standardise with item ``i`` weighted by its action-token count ``lengths[i]``.

    ``sum(lengths * result) == 0`` up to float error. Items with length 0 do not enter the
    statistics (they add no loss tokens either). Degenerate inputs (``sum(lengths) <= 1``, a single
    item, all values equal) give zeros.

    Args:
        adv: ``[n]`` (or any shape) raw advantages.
        lengths: non-negative weights of ``adv``'s shape, usually integer token counts ``L_i``.
    """
    return _standardise(adv, lengths, eps, "lengths")


def turn_normalize(turn_adv: torch.Tensor, turn_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """N_turn (SAPO): N_traj over the valid turns of a padded batch, each turn weighted 1.

    Args:
        turn_adv: ``[B, T]`` per-turn advantages.
        turn_mask: ``[B, T]`` 0/1, 1 on valid turns. Padded turns come back as 0.
    """
    return whiten(turn_adv, eps, mask=turn_mask)


def advantage_stats(
    raw: torch.Tensor, normalized: torch.Tensor, weights: torch.Tensor | None = None
) -> dict[str, float]:
    """Logging helpers for a normalisation: ``adv_std_raw`` (the weighted std the normaliser divided
    by; 0 for degenerate input) and ``frac_zero_adv`` (share of positively weighted items whose
    normalised advantage is exactly 0)."""
    w = torch.ones_like(raw, dtype=torch.float64) if weights is None else weights
    a, w = _prepare(raw, w, "weights")
    _checks.same_shape("raw", raw, normalized=normalized)
    moments = _weighted_moments(a, w)
    support = w > 0
    n_support = int(support.sum())
    zero = int((normalized.detach()[support] == 0).sum()) if n_support else 0
    return {
        "adv_std_raw": 0.0 if moments is None else moments[2],
        "frac_zero_adv": zero / n_support if n_support else 0.0,
    }
