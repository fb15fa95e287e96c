"""The configured environment (``env.name`` with ``env.options``), built in one place: the factory
the rollout, evaluation and demonstrations make episodes' environments from, and a probe for
what an environment says about itself (its spec, its task ids)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from streamrl.envs import Env, EnvSpec, make
from streamrl.training.config import EnvConfig


@dataclass(frozen=True)
class Environment:
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, env: EnvConfig) -> Environment:
        return cls(env.name, dict(env.options))

    def make(self) -> Env:
        """A new environment (an episode's; the caller closes it)."""
        return make(self.name, **self.options)

    @contextlib.contextmanager
    def probe(self) -> Iterator[Env]:
        """One environment to ask (its spec, its task ids), closed after."""
        env = self.make()
        try:
            yield env
        finally:
            env.close()

    def spec(self) -> EnvSpec:
        with self.probe() as env:
            return env.spec

    def task_ids(self, split: str, limit: int | None = None) -> list[str]:
        with self.probe() as env:
            return env.task_ids(split, limit=limit)


def split_task_ids(env: Env, splits: str, count: int | None = None, start: int = 0) -> list[str]:
    """The ids of ``splits`` (one split, or several joined by "+"): ``count`` of each (None: all)
    from its ``start``-th; a ``ValueError`` naming the split that is unknown or has none there."""
    ids: list[str] = []
    for split in splits.split("+"):
        taken = env.task_ids(split, limit=None if count is None else start + count)[start:]
        if not taken:
            raise ValueError(f"{env.spec.name}: split {split!r} has no tasks from index {start}")
        ids.extend(taken)
    return ids
