"""One small module per algorithm, each a class satisfying ``base.Algorithm``; ``make_algorithm``
picks one by ``algo.name`` through the algorithm table (``training/algo_config.py``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from streamrl.training.algo_config import ALGORITHM_TABLE, PolicyLossConfig
from streamrl.training.algorithms.base import Algorithm, Setup


def algorithm_class(name: str) -> type[Algorithm]:
    """The class of algorithm ``name`` (a row of the algorithm table)."""
    algorithm = ALGORITHM_TABLE[name][1]
    if isinstance(algorithm, type):
        return algorithm
    module, _, attribute = algorithm.partition(":")
    return getattr(importlib.import_module(module), attribute)


def make_algorithm(section: PolicyLossConfig, setup: Setup) -> Algorithm:
    """The algorithm of config section ``section`` (``config.algo``)."""
    # every algorithm class is constructed as ``Class(section, setup)`` (``base.Algorithm``)
    factory = cast("Callable[[PolicyLossConfig, Setup], Algorithm]", algorithm_class(section.name))
    return factory(section, setup)


__all__ = ["algorithm_class", "make_algorithm"]
