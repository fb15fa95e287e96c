"""Injected latency: the asynchronous regime of a cluster, produced on one machine (issue 37).

On a real cluster, episodes finish in an order set by systems timing: slow environment calls,
queueing, failures that run to the turn cap. On one small machine with a fast simulator they
finish almost in dispatch order, so an arrival-order effect (SPO++'s event-time memory against a
receipt-order one) cannot show. ``LatencyModel`` makes each episode wait, after each turn and once
at its end, for delays drawn from a heavy-tailed distribution; an episode that is not won can wait
longer (``failure_factor``), as failures that run to the cap do. The agent sees nothing of it: the
wait happens between its turns, never inside a generation or an environment call.

Each delay is drawn from its own generator, seeded by ``(seed, request id, turn)``, so a replayed
request waits as long as the first time, whatever else is in flight.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Tail = Literal["lognormal", "pareto"]


@dataclass(frozen=True)
class LatencyModel:
    #: median wait after each turn, seconds (0: none)
    turn_s: float = 0.0
    #: median wait at each episode's end, seconds (0: none)
    episode_s: float = 0.0
    #: the distribution of a delay around its median: ``lognormal`` (``shape`` is sigma) or
    #: ``pareto`` (``shape`` is alpha; smaller is heavier, below 2 the variance is infinite)
    tail: Tail = "lognormal"
    shape: float = 1.0
    #: an episode that is not won waits this many times as long at its end
    failure_factor: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.turn_s < 0 or self.episode_s < 0:
            raise ValueError(f"latency: turn_s and episode_s must be >= 0, got {self.turn_s}, {self.episode_s}")
        if self.tail not in ("lognormal", "pareto"):
            raise ValueError(f"latency: tail must be 'lognormal' or 'pareto', got {self.tail!r}")
        if self.shape <= 0:
            raise ValueError(f"latency: shape must be > 0, got {self.shape}")
        if self.failure_factor < 0:
            raise ValueError(f"latency: failure_factor must be >= 0, got {self.failure_factor}")

    @property
    def active(self) -> bool:
        return self.turn_s > 0 or self.episode_s > 0

    def turn_delay(self, request_id: str, turn: int) -> float:
        """Seconds to wait after turn ``turn`` (0-based) of ``request_id``."""
        return self._draw(self.turn_s, f"{request_id}:{turn}")

    def episode_delay(self, request_id: str, won: bool) -> float:
        """Seconds to wait at the end of ``request_id``'s episode."""
        return self._draw(self.episode_s, f"{request_id}:end") * (1.0 if won else self.failure_factor)

    def _draw(self, median: float, key: str) -> float:
        if median <= 0:
            return 0.0
        rng = random.Random(f"{self.seed}:{key}")
        if self.tail == "lognormal":
            return median * rng.lognormvariate(0.0, self.shape)
        # a Pareto variable with scale 1 has median 2^(1/alpha): rescaled so that ``median`` is its median
        return median * rng.paretovariate(self.shape) / 2.0 ** (1.0 / self.shape)
