"""One small module per algorithm; ``make_learner`` picks by ``config.algo.name``."""

from __future__ import annotations

from typing import Any

from streamrl.train.algorithms.grpo import GRPOLearner
from streamrl.train.algorithms.ppo import PPOLearner
from streamrl.train.algorithms.sapo import SAPOLearner
from streamrl.train.algorithms.spo import SPOLearner
from streamrl.train.algorithms.spo_pp import SPOPlusPlusLearner
from streamrl.train.config import Config
from streamrl.train.learner import Learner

LEARNERS: dict[str, type[Learner]] = {
    "spo": SPOLearner,
    "spo++": SPOPlusPlusLearner,
    "grpo": GRPOLearner,
    "ppo": PPOLearner,
    "sapo": SAPOLearner,
}


def make_learner(config: Config, policy: Any, reference: Any | None = None, reward_range: tuple[float, float] = (0.0, 1.0)) -> Learner:
    return LEARNERS[config.algo.name](config, policy, reference, reward_range)


__all__ = ["LEARNERS", "make_learner", "GRPOLearner", "PPOLearner", "SAPOLearner", "SPOLearner", "SPOPlusPlusLearner"]
