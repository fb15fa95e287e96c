"""streamrl: reinforcement learning for multi-turn, tool-using LLM agents.

    import streamrl
    summary = streamrl.train("smoke", "runs/x", overrides=["train.steps=2"])
    metrics = streamrl.evaluate("smoke", "runs/x/final_model")

Layers (imports point down only):
    cli, api
    training   learners, loop, checkpoints, SFT
    rollout    async engine, trajectories, layouts      (uses envs, policy)
    algos | envs | sandbox | policy                      (ground floor, independent)
"""

__version__ = "0.1.0"

from streamrl.api import evaluate, train  # noqa: E402
from streamrl.envs import register  # noqa: E402
from streamrl.training.algo_config import register_algorithm  # noqa: E402
from streamrl.training.config import Config, ConfigError  # noqa: E402
from streamrl.training.config_files import load_config

__all__ = ["Config", "ConfigError", "__version__", "evaluate", "load_config", "register", "register_algorithm", "train"]
