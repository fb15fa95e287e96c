"""SPO++'s event-time prompt memory (docs/algorithms.md §5).

Time is counted in policy events, not wall clock or arrival order. Publishing a snapshot advances
the coordinate ``z`` by ``-ln(retention)`` (or, optionally, by ``-ln rho(drift)``). A result is
stored at the ``z`` of the snapshot that served its request, and evidence seen from coordinate
``z_q`` weighs ``exp(-(z_q - z_i))``:

    alpha_q = exp(-(z_q - z0)) alpha0 + sum_i exp(-(z_q - z_i)) R_i      (beta alike with 1 - R_i)

The sum is kept in an exact compact form ``(a, b, zref)``: evidence newer than ``zref`` first
rescales ``(a, b)`` to its own coordinate; older evidence is added with its decay. Both are
commutative, so a read never depends on the order in which the same evidence arrived.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from streamrl.algos.beta_memory import (
    BetaPromptMemory,
    PromptId,
    UnseenPrior,
    check_id,
    forgetting_factor,
    prior_strength,
)


class MemoryRead(NamedTuple):
    """What a dispatch records: the frozen baseline and the coordinate it was read at."""

    v_hat: float  # success-rate estimate in [0, 1]
    n_eff: float  # alpha + beta at z (decays with z; v_hat does not)
    z: float  # the coordinate read at (the serving snapshot's z)
    baseline: float  # v_hat in reward units: A = R - baseline


class EventTimeTracker(BetaPromptMemory):
    """Per-prompt Beta memory on the event clock, with frozen reads and order-free writes.

    Args:
        retention: weight kept per published snapshot (``dz = -ln retention``); also sets the
            offline-prior strength ``N0 = 1 / (1 - retention)``.
        rho_min, rho_max, d_half: bounds and half-life of the optional drift-adaptive clock
            (:meth:`publish` with ``drift``).
    """

    def __init__(
        self,
        retention: float = 0.875,
        reward_range: tuple[float, float] = (0.0, 1.0),
        eps_s: float = 0.05,
        gamma: float = 0.0,
        unseen_prior: UnseenPrior = "half",
        rho_min: float = 0.875,
        rho_max: float = 0.96,
        d_half: float = 0.06,
    ) -> None:
        if not (0.0 < retention < 1.0):
            raise ValueError(f"retention must lie in (0, 1), got {retention}")
        if not (0.0 < rho_min <= rho_max < 1.0):
            raise ValueError(f"need 0 < rho_min <= rho_max < 1, got {rho_min}, {rho_max}")
        if not (math.isfinite(d_half) and d_half > 0):
            raise ValueError(f"d_half must be positive, got {d_half}")
        super().__init__(reward_range, eps_s, gamma, unseen_prior, prior_strength(retention))
        self.retention = retention
        self.rho_min, self.rho_max, self.d_half = rho_min, rho_max, d_half
        self._z = 0.0
        # prompt id -> [a, b, zref] (compact form)
        self._state: dict[PromptId, list[float]] = {}
        #: prompts first met through ``record`` (never dispatched here): their prior's anchor, the
        #: earliest event among their results so far (it moves down when an older result arrives)
        self._floating: dict[PromptId, float] = {}
        self._seen: set[str | int] = set()

    # -- clock --------------------------------------------------------------------------------
    @property
    def z(self) -> float:
        """The current event coordinate (that of the latest published snapshot)."""
        return self._z

    def publish(self, drift: float | None = None) -> float:
        """Advance the clock by one snapshot; returns the new ``z``.

        ``drift=None``: ``dz = -ln retention``. Otherwise ``dz = -ln clamp(2^(-drift/d_half),
        rho_min, rho_max)`` with ``drift`` the global policy drift since the previous snapshot.
        """
        rho = self.retention if drift is None else forgetting_factor(drift, self.d_half, self.rho_min, self.rho_max)
        self._z += -math.log(rho)
        return self._z

    # -- registration -------------------------------------------------------------------------
    def register(self, prompt_id: PromptId, z: float | None = None) -> None:
        """Give an unseen prompt the unseen prior anchored at ``z`` (default: now). No-op if known
        (but it fixes the anchor of a prompt so far only met through ``record``)."""
        check_id("prompt", prompt_id)
        self._floating.pop(prompt_id, None)
        if prompt_id not in self._state:
            alpha, beta = self._unseen_counts()
            self._state[prompt_id] = [alpha, beta, self._z if z is None else float(z)]

    def is_registered(self, prompt_id: PromptId) -> bool:
        return prompt_id in self._state

    # -- read ---------------------------------------------------------------------------------
    def _compact(self, prompt_id: PromptId, z: float) -> tuple[float, float, float]:
        entry = self._state.get(prompt_id)
        if entry is None:  # an unseen prompt read without registering: its prior anchored at z
            alpha, beta = self._unseen_counts()
            return alpha, beta, z
        return entry[0], entry[1], entry[2]

    def read_full(self, prompt_id: PromptId, z: float | None = None) -> MemoryRead:
        """Read at ``z`` (default: now) without side effects.

        Evidence newer than ``z`` is read at its own coordinate (``z* = max(z, zref)``) so no weight
        exceeds 1; ``v_hat`` does not depend on ``z``, only ``n_eff`` does.
        """
        zq = self._z if z is None else float(z)
        if not math.isfinite(zq):
            raise ValueError(f"z must be finite, got {z!r}")
        a, b, zref = self._compact(prompt_id, zq)
        v_hat = a / (a + b)
        n_eff = (a + b) * math.exp(-(max(zq, zref) - zref))
        return MemoryRead(v_hat, n_eff, zq, self.from_unit(v_hat))

    def read(self, prompt_id: PromptId, z: float | None = None) -> float:
        """``v_hat`` at ``z`` (default: now), without side effects."""
        return self.read_full(prompt_id, z).v_hat

    def dispatch(self, prompt_id: PromptId) -> MemoryRead:
        """Read for a request being sent now: registers an unseen prompt at the current ``z``, then
        returns the read that the request carries (its baseline is frozen from here on)."""
        self.register(prompt_id)
        return self.read_full(prompt_id)

    def _alpha_beta(self, prompt_id: PromptId) -> tuple[float, float]:
        read = self.read_full(prompt_id)
        return read.v_hat * read.n_eff, (1.0 - read.v_hat) * read.n_eff

    # -- write --------------------------------------------------------------------------------
    def record(self, prompt_id: PromptId, z: float, reward: float, request_id: str | int) -> bool:
        """Store one result at the coordinate ``z`` of the snapshot that served its request.

        A repeated ``request_id`` is ignored (returns False). A prompt never registered gets the
        unseen prior anchored at its first registration (docs/algorithms.md §5), which for a prompt met only through
        its results is the earliest event among them: the anchor follows the oldest ``z`` recorded
        so far, so the memory does not depend on the order the results arrive in (docs/algorithms.md §5). Its
        first dispatch fixes the anchor. Returns True when the evidence was stored.
        """
        check_id("prompt", prompt_id)
        check_id("request", request_id)
        if request_id in self._seen:
            return False
        z = float(z)
        if not math.isfinite(z):
            raise ValueError(f"z must be finite, got {z!r}")
        unit = self.to_unit(reward)
        if prompt_id not in self._state:
            alpha, beta = self._unseen_counts()
            self._state[prompt_id] = [alpha, beta, z]
            self._floating[prompt_id] = z
        elif z < self._floating.get(prompt_id, z):
            self._move_prior(prompt_id, z)
        entry = self._state[prompt_id]
        if z > entry[2]:
            shrink = math.exp(-(z - entry[2]))
            entry[0] *= shrink
            entry[1] *= shrink
            entry[2] = z
        weight = math.exp(-(entry[2] - z))
        entry[0] += weight * unit
        entry[1] += weight * (1.0 - unit)
        self._seen.add(request_id)
        return True

    def _move_prior(self, prompt_id: PromptId, z: float) -> None:
        """Re-anchor a floating unseen prior from its anchor down to the older event ``z``."""
        entry, old = self._state[prompt_id], self._floating[prompt_id]
        alpha, beta = self._unseen_counts()
        moved = math.exp(-(entry[2] - z)) - math.exp(-(entry[2] - old))  # <= 0: older weighs less
        entry[0] = max(entry[0] + moved * alpha, 0.0)
        entry[1] = max(entry[1] + moved * beta, 0.0)
        self._floating[prompt_id] = z

    # -- persistence --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: clock, compact memories and the seen request ids."""
        return {
            "z": self._z,
            "prompts": [[pid, a, b, zref] for pid, (a, b, zref) in self._state.items()],
            "seen_request_ids": list(self._seen),
            "floating": [[pid, z] for pid, z in self._floating.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not {"z", "prompts", "seen_request_ids"} <= state.keys():
            raise ValueError("EventTimeTracker state must be a dict with 'z', 'prompts' and 'seen_request_ids'")
        z = float(state["z"])
        if not math.isfinite(z):
            raise ValueError(f"EventTimeTracker state has a non-finite z: {state['z']!r}")
        restored: dict[PromptId, list[float]] = {}
        for row in state["prompts"]:
            if not (isinstance(row, (list, tuple)) and len(row) == 4):
                raise ValueError(f"EventTimeTracker state row must be [id, a, b, zref], got {row!r}")
            pid, a, b, zref = row
            check_id("prompt", pid)
            if not (a >= 0 and b >= 0 and a + b > 0 and math.isfinite(zref)):
                raise ValueError(f"EventTimeTracker state for prompt {pid!r} is invalid: {row!r}")
            restored[pid] = [float(a), float(b), float(zref)]
        seen = state["seen_request_ids"]
        if not isinstance(seen, list):
            raise ValueError("EventTimeTracker state 'seen_request_ids' must be a list")
        for request_id in seen:
            check_id("request", request_id)
        floating = {}
        for row in state.get("floating", []):  # absent in states saved before it existed
            if not (isinstance(row, (list, tuple)) and len(row) == 2 and row[0] in restored
                    and isinstance(row[1], (int, float)) and math.isfinite(row[1])):
                raise ValueError(f"EventTimeTracker state 'floating' row must be [known id, z], got {row!r}")
            floating[row[0]] = float(row[1])
        self._z = z
        self._state = restored
        self._floating = floating
        self._seen = set(seen)
