"""Pieces shared by the per-prompt success trackers of SPO and SPO++ (docs/algorithms.md §4, §5).

Both keep a Beta(alpha, beta) pseudo-count per prompt over rewards mapped into [0, 1]; the
baseline is ``v = alpha / (alpha + beta)`` and ``N_eff = alpha + beta``. They differ in how old
evidence fades: SPO multiplies by a drift-dependent ``rho`` on every visit, SPO++ by event distance.
Plain Python floats: the state is small, per prompt, and must serialise to JSON.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from typing import Literal

import torch

PromptId = str | int
UnseenPrior = Literal["half", "N0_half"]


def check_id(kind: str, value: Hashable) -> None:
    """Prompt and request ids must be str or int: the state must round-trip through JSON intact."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise TypeError(f"{kind} ids must be str or int, got {type(value).__name__}: {value!r}")


def forgetting_factor(drift: float, d_half: float = 0.06, rho_min: float = 0.875, rho_max: float = 0.96) -> float:
    """``rho = clamp(2 ** (-drift / d_half), rho_min, rho_max)`` (docs/algorithms.md §4): evidence
    half-life in drift units."""
    if not (math.isfinite(drift) and drift >= 0):
        raise ValueError(f"drift must be a finite non-negative number, got {drift!r}")
    return min(max(2.0 ** (-drift / d_half), rho_min), rho_max)


def policy_drift(logp_now: torch.Tensor | Sequence[float], logp_last: torch.Tensor | Sequence[float]) -> float:
    """SPO's drift ``D = mean_j |logp_now_j - logp_last_j|`` over a prompt's previous response (docs/algorithms.md §4).

    Both arguments hold the log-probs of the same action tokens (current policy, and the policy
    right after the last visit). An empty response gives 0 (a first visit has no drift).
    """
    now = torch.as_tensor(logp_now, dtype=torch.float64)
    last = torch.as_tensor(logp_last, dtype=torch.float64)
    if now.shape != last.shape:
        raise ValueError(f"logp_now has shape {tuple(now.shape)} but logp_last has {tuple(last.shape)}")
    if now.numel() == 0:
        return 0.0
    drift = float((now - last).abs().mean())
    if not math.isfinite(drift):
        raise ValueError("log-probs for the drift estimate contain NaN or infinite values")
    return drift


def prior_strength(rho: float) -> float:
    """``N0 = 1 / (1 - rho)``: the equilibrium pseudo-count under forgetting factor ``rho`` (8 for 0.875)."""
    if not (0.0 <= rho < 1.0):
        raise ValueError(f"forgetting factor must lie in [0, 1), got {rho}")
    return 1.0 / (1.0 - rho)


def offline_prior(successes: float, n0: int, n_prior: float, smoothed: bool = True) -> tuple[float, float]:
    """Offline initialisation (docs/algorithms.md §4): ``n0`` rollouts of ``pi_0`` with ``successes`` wins give
    ``(alpha0, beta0) = N0 * (v0, 1 - v0)`` with ``N0 = n_prior`` (see :func:`prior_strength`).

    ``v0 = (s + 1/2) / (n0 + 1)`` when ``smoothed`` (never exactly 0 or 1), else ``s / n0``.
    """
    if n0 < 1 or not (0 <= successes <= n0):
        raise ValueError(f"offline init needs n0 >= 1 and 0 <= successes <= n0, got successes={successes}, n0={n0}")
    v0 = (successes + 0.5) / (n0 + 1.0) if smoothed else successes / n0
    return n_prior * v0, n_prior * (1.0 - v0)


def sampling_weight(v_hat: float, n_eff: float, eps_s: float = 0.05, gamma: float = 0.0) -> float:
    """Prioritised-sampling weight ``sqrt(v (1 - v)) / N_eff ** gamma + eps_s`` (docs/algorithms.md §4)."""
    return math.sqrt(max(v_hat * (1.0 - v_hat), 0.0)) / n_eff**gamma + eps_s


class BetaPromptMemory(ABC):
    """Reward mapping, unseen-prompt prior, baselines and sampling weights shared by both trackers."""

    def __init__(
        self,
        reward_range: tuple[float, float] = (0.0, 1.0),
        eps_s: float = 0.05,
        gamma: float = 0.0,
        unseen_prior: UnseenPrior = "half",
        n_prior: float = 8.0,
    ) -> None:
        low, high = (float(reward_range[0]), float(reward_range[1]))
        if not (math.isfinite(low) and math.isfinite(high) and high > low):
            raise ValueError(f"reward_range must be finite with high > low, got {reward_range!r}")
        if eps_s < 0 or gamma < 0:
            raise ValueError(f"eps_s and gamma must be non-negative, got {eps_s}, {gamma}")
        if unseen_prior not in ("half", "N0_half"):
            raise ValueError(f"unseen_prior must be 'half' or 'N0_half', got {unseen_prior!r}")
        self.reward_range = (low, high)
        self.eps_s = eps_s
        self.gamma = gamma
        self.n_prior = n_prior  # N0: strength of offline priors (and of the "N0_half" unseen prior)
        self.unseen_prior = unseen_prior

    # -- subclass interface -------------------------------------------------------------------
    @abstractmethod
    def _alpha_beta(self, prompt_id: PromptId) -> tuple[float, float]:
        """Current pseudo-counts (the unseen prior for an unknown prompt), without side effects."""

    # -- shared -------------------------------------------------------------------------------
    #: subclasses keep ``_state[prompt_id] = [alpha, beta, x]``; an offline prior starts ``x`` here
    #: (SPO: visits 0; SPO++: anchored at ``z = 0``, so it fades as snapshots publish)
    _offline_x: float = 0.0
    _state: dict

    def init_offline(self, prompt_id: PromptId, successes: float, n0: int, smoothed: bool = True) -> None:
        """Start ``prompt_id`` from ``n0`` offline rollouts of ``pi_0`` with ``successes`` wins
        (before any evidence for it; see :func:`offline_prior`)."""
        check_id("prompt", prompt_id)
        if prompt_id in self._state:
            raise ValueError(f"prompt {prompt_id!r} already has tracker state; offline init must come first")
        alpha, beta = offline_prior(successes, n0, self.n_prior, smoothed)
        self._state[prompt_id] = [alpha, beta, self._offline_x]

    def _unseen_counts(self) -> tuple[float, float]:
        half = 0.5 if self.unseen_prior == "half" else 0.5 * self.n_prior
        return half, half

    def to_unit(self, reward: float) -> float:
        """Map a reward affinely from ``reward_range`` into [0, 1] (a soft success count)."""
        low, high = self.reward_range
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward!r}")
        unit = (reward - low) / (high - low)
        tolerance = 1e-9
        if not (-tolerance <= unit <= 1.0 + tolerance):
            raise ValueError(f"reward {reward} lies outside reward_range {self.reward_range}")
        return min(max(unit, 0.0), 1.0)

    def from_unit(self, value: float) -> float:
        low, high = self.reward_range
        return low + value * (high - low)

    def value(self, prompt_id: PromptId) -> float:
        """``v_hat`` in [0, 1] (the success-rate estimate)."""
        alpha, beta = self._alpha_beta(prompt_id)
        return alpha / (alpha + beta)

    def n_eff(self, prompt_id: PromptId) -> float:
        alpha, beta = self._alpha_beta(prompt_id)
        return alpha + beta

    def baseline(self, prompt_id: PromptId) -> float:
        """``v_hat`` in reward units, so ``A = R - baseline``."""
        return self.from_unit(self.value(prompt_id))

    def sampling_weights(self, prompt_ids: Iterable[PromptId]) -> list[float]:
        """Unnormalised prioritised-sampling weights (``P(x) = w(x) / sum w``); reads only."""
        out = []
        for prompt_id in prompt_ids:
            alpha, beta = self._alpha_beta(prompt_id)
            out.append(sampling_weight(alpha / (alpha + beta), alpha + beta, self.eps_s, self.gamma))
        return out
