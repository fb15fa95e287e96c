"""Staleness control as pure functions (no I/O, no state), in the spirit of AReaL's manager.

Admission bounds how far rollouts may run ahead of the learner. With batch size B, learner steps
taken v (publishes since the run started) and bound eta, the learner will have consumed v*B
samples; admitting at most (eta + v + 1)*B samples in total means a sample consumed in FIFO order
is generated at most eta versions before it is trained on. Samples that finish out of order (a
straggler overtaken by faster episodes) can still lag more; ``is_stale`` flags those for exclusion
from the loss, while their evidence still reaches the trackers.

Lag is measured at delivery, against the behaviour version of the oldest token: the learner's
current version minus the policy version of the trajectory's earliest turn (its dispatch version
when it has no turns). The oldest token is the one whose importance weight is most off-policy.
"""

from __future__ import annotations


def admission_capacity(
    *,
    free_slots: int,
    max_staleness: int | None,
    learner_steps: int,
    batch_size: int,
    admitted: int,
) -> int:
    """How many new episodes may be dispatched now.

    ``admitted`` counts samples dispatched so far that can still reach the learner (dispatches
    minus stragglers discarded undelivered). ``max_staleness=None`` disables the bound.
    """
    if free_slots < 0 or learner_steps < 0 or admitted < 0:
        raise ValueError("admission_capacity: free_slots, learner_steps and admitted must be >= 0")
    if batch_size < 1:
        raise ValueError(f"admission_capacity: batch_size must be >= 1, got {batch_size}")
    if max_staleness is None:
        return free_slots
    if max_staleness < 0:
        raise ValueError(f"admission_capacity: max_staleness must be >= 0 or None, got {max_staleness}")
    ahead = (max_staleness + learner_steps + 1) * batch_size - admitted
    return max(0, min(free_slots, ahead))


def sample_lag(learner_version: int, behaviour_version: int) -> int:
    """Versions between the weights that generated a sample and the weights it is trained with."""
    return learner_version - behaviour_version


def is_stale(lag: int, max_staleness: int | None) -> bool:
    """True when a sample lags more than the bound and must be kept out of the loss."""
    return max_staleness is not None and lag > max_staleness
