"""Why training stopped on its own: one line each, printed by the CLI without a traceback."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """Training cannot usefully go on (nothing to learn from, or the weights broke)."""


class NonFiniteError(TrainingError):
    """A loss, gradient norm or parameter became NaN or infinite; nothing of it was saved."""
