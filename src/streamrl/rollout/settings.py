"""The rollout's settings, the errors it stops with, and the watch on environment faults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from streamrl.rollout.episode import EpisodeSettings
from streamrl.rollout.trajectory import ENV_FAULT_END_REASONS, Trajectory

Mode = Literal["stream", "group"]


class RolloutError(RuntimeError):
    """The rollout stopped: a prompt-source call failed, or it was closed."""


class RolloutStalledError(RolloutError):
    """Nothing is in flight and nothing may be dispatched, so the requested batch cannot fill."""


class DeadEnvironmentError(RolloutError):
    """Episode after episode ended in an environment error: training on would learn nothing."""


class EnvFaultWatch:
    """Counts the current run of episodes that ended in an environment fault (env_error, env_timeout)."""

    def __init__(self, limit: int, env_name: str):
        self._limit = limit
        self._env_name = env_name
        self._run: list[Trajectory] = []

    def count(self, trajectory: Trajectory) -> DeadEnvironmentError | None:
        """Add an arrival; the error to stop with once ``limit`` faults came in a row."""
        if trajectory.end_reason not in ENV_FAULT_END_REASONS:
            self._run = []
            return None
        self._run.append(trajectory)
        return self.dead(self._run) if len(self._run) >= self._limit else None

    def dead(self, faults: list[Trajectory]) -> DeadEnvironmentError:
        first = faults[0]
        return DeadEnvironmentError(
            f"environment {self._env_name!r} is failing: {len(faults)} episodes in a row ended in "
            f"{'/'.join(sorted({t.end_reason for t in faults}))}; the first: {first.error or first.end_reason}"
        )


@dataclass(frozen=True)
class RolloutSettings:
    """How the rollout dispatches and delivers; every field is checked on construction."""

    mode: Mode = "stream"
    #: episodes in flight at most (slots); also the size of the environment thread pool
    concurrency: int = 8
    #: trajectories per learner batch (the unit of the admission bound)
    batch_size: int = 8
    #: group mode: rollouts per prompt
    group_size: int = 1
    #: group mode: deliver a group partially this long after its dispatch; None waits forever
    group_timeout_s: float | None = None
    #: versions a sample may lag the learner; bounds admission and flags excluded_from_loss.
    #: None disables both
    max_staleness: int | None = 4
    #: dispatch units (episodes, or groups in group mode) in flight per prompt
    per_prompt_inflight: int = 1
    #: seeds prompt selection and the per-episode environment seeds
    seed: int = 0
    request_prefix: str = "req"
    #: how long close() waits for environment threads and closers
    shutdown_timeout_s: float = 5.0
    #: the rollout stops with ``DeadEnvironmentError`` after this many episodes in a row ended in
    #: an environment fault (env_error, env_timeout), or a batch holds nothing else; None: batch_size
    max_env_faults_in_row: int | None = None
    #: names the environment in that error
    env_name: str = "environment"
    episode: EpisodeSettings = field(default_factory=EpisodeSettings)

    def __post_init__(self) -> None:
        def fail(name: str, problem: str) -> None:
            raise ValueError(f"RolloutSettings.{name} {problem}")

        if self.mode not in ("stream", "group"):
            fail("mode", f"must be 'stream' or 'group', got {self.mode!r}")
        for name in ("concurrency", "batch_size", "group_size", "per_prompt_inflight"):
            if getattr(self, name) < 1:
                fail(name, f"must be >= 1, got {getattr(self, name)}")
        if self.mode == "stream" and self.group_size != 1:
            fail("group_size", f"applies to mode='group' only (got {self.group_size} with mode='stream')")
        if self.mode == "stream" and self.group_timeout_s is not None:
            fail("group_timeout_s", "applies to mode='group' only")
        if self.mode == "group":
            if self.batch_size % self.group_size:
                fail("batch_size", f"({self.batch_size}) must be a multiple of group_size ({self.group_size})")
            if self.concurrency < self.group_size:
                fail("concurrency", f"({self.concurrency}) must be >= group_size ({self.group_size})")
        if self.group_timeout_s is not None and self.group_timeout_s <= 0:
            fail("group_timeout_s", f"must be > 0 or None, got {self.group_timeout_s}")
        if self.max_staleness is not None and self.max_staleness < 0:
            fail("max_staleness", f"must be >= 0 or None, got {self.max_staleness}")
        if self.shutdown_timeout_s <= 0:
            fail("shutdown_timeout_s", f"must be > 0, got {self.shutdown_timeout_s}")
        if self.max_env_faults_in_row is not None and self.max_env_faults_in_row < 1:
            fail("max_env_faults_in_row", f"must be >= 1 or None, got {self.max_env_faults_in_row}")

    @property
    def unit(self) -> int:
        """Episodes per dispatch."""
        return self.group_size if self.mode == "group" else 1

    @property
    def env_fault_limit(self) -> int:
        return self.max_env_faults_in_row or self.batch_size
