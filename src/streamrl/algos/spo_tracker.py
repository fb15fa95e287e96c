"""SPO's KL-adaptive Beta tracker (docs/algorithms.md §4).

Per prompt, ``(alpha, beta)`` absorb each result after the baseline for it has been read:
``alpha <- rho * alpha + R``, ``beta <- rho * beta + (1 - R)`` with ``rho`` from the policy's drift
since the prompt's last visit. The caller keeps the previous response's tokens and log-probs
(it owns the model that re-scores them) and passes the resulting ``drift`` to :meth:`update`.
"""

from __future__ import annotations

import math
from typing import Any

from streamrl.algos.beta_memory import (
    BetaPromptMemory,
    PromptId,
    UnseenPrior,
    check_id,
    forgetting_factor,
    policy_drift,
    prior_strength,
)


class SPOTracker(BetaPromptMemory):
    """Per-prompt success tracker with drift-adaptive forgetting.

    Step order (docs/algorithms.md §4): read :meth:`baseline` for every trajectory of the batch, compute advantages,
    update the actor, then :meth:`update` each prompt in batch order with the drift under the
    post-update policy. Duplicates within a batch all read the same pre-step value.
    """

    _offline_x = 0  # visits

    drift = staticmethod(policy_drift)

    def __init__(
        self,
        rho_min: float = 0.875,
        rho_max: float = 0.96,
        d_half: float = 0.06,
        reward_range: tuple[float, float] = (0.0, 1.0),
        eps_s: float = 0.05,
        gamma: float = 0.0,
        unseen_prior: UnseenPrior = "half",
    ) -> None:
        if not (0.0 <= rho_min <= rho_max < 1.0):
            raise ValueError(f"need 0 <= rho_min <= rho_max < 1, got {rho_min}, {rho_max}")
        super().__init__(reward_range, eps_s, gamma, unseen_prior, prior_strength(rho_min))
        self.rho_min = rho_min
        if not (math.isfinite(d_half) and d_half > 0):
            raise ValueError(f"d_half must be positive, got {d_half}")
        self.rho_max = rho_max
        self.d_half = d_half
        # prompt id -> [alpha, beta, visits]
        self._state: dict[PromptId, list[float]] = {}

    def _alpha_beta(self, prompt_id: PromptId) -> tuple[float, float]:
        entry = self._state.get(prompt_id)
        return (entry[0], entry[1]) if entry is not None else self._unseen_counts()

    def forgetting_factor(self, drift: float) -> float:
        return forgetting_factor(drift, self.d_half, self.rho_min, self.rho_max)

    def update(self, prompt_id: PromptId, reward: float, drift: float = 0.0) -> float:
        """Absorb one result; returns the ``rho`` used. ``drift`` = 0 on a first visit."""
        check_id("prompt", prompt_id)
        unit = self.to_unit(reward)
        rho = self.forgetting_factor(drift)
        alpha, beta = self._alpha_beta(prompt_id)
        visits = self._state[prompt_id][2] if prompt_id in self._state else 0
        self._state[prompt_id] = [rho * alpha + unit, rho * beta + (1.0 - unit), visits + 1]
        return rho

    def visits(self, prompt_id: PromptId) -> int:
        entry = self._state.get(prompt_id)
        return int(entry[2]) if entry is not None else 0

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: ``{"prompts": [[id, alpha, beta, visits], ...]}``."""
        return {"prompts": [[pid, a, b, int(n)] for pid, (a, b, n) in self._state.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        prompts = state.get("prompts") if isinstance(state, dict) else None
        if not isinstance(prompts, list):
            raise ValueError("SPOTracker state must be a dict with a 'prompts' list")
        restored: dict[PromptId, list[float]] = {}
        for row in prompts:
            if not (isinstance(row, (list, tuple)) and len(row) == 4):
                raise ValueError(f"SPOTracker state row must be [id, alpha, beta, visits], got {row!r}")
            pid, alpha, beta, visits = row
            check_id("prompt", pid)
            if not (alpha >= 0 and beta >= 0 and alpha + beta > 0):
                raise ValueError(f"SPOTracker state for prompt {pid!r} has invalid counts {alpha}, {beta}")
            restored[pid] = [float(alpha), float(beta), int(visits)]
        self._state = restored
