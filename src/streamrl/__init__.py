"""streamrl: reinforcement learning for multi-turn, tool-using LLM agents.

Layers (imports point down only):
    cli
    train      learners, loop, checkpoints, SFT
    rollout    async engine, trajectories, layouts      (uses envs, policy)
    algos | envs | sandbox | policy                      (ground floor, independent)
"""

__version__ = "0.1.0"
