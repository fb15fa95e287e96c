"""Why training stopped on its own: one line each, printed by the CLI without a traceback."""

from __future__ import annotations


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked: one line, exit status 2."""


class TrainingError(RuntimeError):
    """Training cannot usefully go on (nothing to learn from, or the weights broke)."""


class NonFiniteError(TrainingError):
    """A loss, gradient norm or parameter became NaN or infinite; nothing of it was saved."""


class TrainingInterrupted(Exception):
    """SIGTERM or SIGINT stopped training after a learner step, whose checkpoint was written."""

    def __init__(self, signal_number: int, step: int, out_dir: str):
        import signal

        self.signal_number, self.step = signal_number, step
        name = signal.Signals(signal_number).name
        super().__init__(f"stopped by {name} after step {step} (checkpoint written); "
                         f"continue with: streamrl train --out {out_dir} --resume")
