"""One small module per algorithm; ``make_learner`` picks by ``config.algo.name`` through the
algorithm table (``streamrl.train.config.ALGORITHM_TABLE``)."""

from __future__ import annotations

import importlib
from typing import Any

from streamrl.train.config import ALGORITHM_TABLE, Config
from streamrl.train.learner import Learner


def learner_class(name: str) -> type[Learner]:
    """The learner class of algorithm ``name`` (a row of the algorithm table)."""
    module, _, attribute = ALGORITHM_TABLE[name][1].partition(":")
    return getattr(importlib.import_module(module), attribute)


def make_learner(config: Config, policy: Any, reference: Any | None = None, reward_range: tuple[float, float] = (0.0, 1.0)) -> Learner:
    return learner_class(config.algo.name)(config, policy, reference, reward_range)


__all__ = ["learner_class", "make_learner"]
