"""Training an agent function instead of an environment (``agent.function``, ``--agent``): the
tasks, the rollout backend and evaluation, built from the configuration (docs/agents.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrl.policy.protocols import InferenceEngine
from streamrl.training.config import Config

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy


def agent_tasks(config: Config) -> dict[str, list[dict[str, Any]]]:
    from streamrl.agents import read_tasks

    assert config.agent.tasks is not None
    return read_tasks(config.agent.tasks)


def agent_settings(config: Config, temperature: float | None = None) -> Any:
    """The sessions' settings from the configuration (``temperature``: another than the rollout's)."""
    from streamrl.agents import AgentSettings

    rollout = config.rollout
    return AgentSettings(timeout_s=config.agent.timeout_s, temperature=rollout.temperature if temperature is None else temperature,
                         top_p=rollout.top_p, max_new_tokens=rollout.max_new_tokens, max_tokens=config.agent.max_tokens,
                         max_context_tokens=rollout.max_context_tokens, reward_range=(config.agent.reward_range[0], config.agent.reward_range[1]))


def agent_player(config: Config, split: str = "train", temperature: float | None = None) -> Any:
    """An ``AgentPlayer``: builds, over an engine and a policy, the backend in which the agent plays
    ``split``'s tasks at the rollout's sampling (``temperature``: another), here or in a Ray worker."""
    from streamrl.agents import AgentPlayer

    assert config.agent.function is not None
    settings = agent_settings(config, temperature)
    tasks = agent_tasks(config)
    return AgentPlayer(config.agent.function, tasks[split] if split in tasks else tasks["train"], settings)


def agent_backend(config: Config, engine: InferenceEngine, policy: Policy, split: str = "train",
                  temperature: float | None = None) -> Any:
    """An ``AgentBackend`` over the trainer's engine (see ``agent_player``)."""
    return agent_player(config, split, temperature)(engine, policy)


def external_backend(config: Config, engine: InferenceEngine, policy: Policy) -> Any:
    """The endpoint of ``streamrl serve --train``: agents elsewhere claim the dispatched tasks."""
    import os

    from streamrl.agents.runner import ExternalAgentBackend

    return ExternalAgentBackend(engine, policy, policy.tool_format,
                                agent_tasks(config)["train"], agent_settings(config), config.agent.host, config.agent.port,
                                os.environ.get("STREAMRL_ENDPOINT_TOKEN") or None)


def eval_split(config: Config) -> str:
    """The agent's held-out tasks: the file's ``test`` rows (else its training rows)."""
    return "test" if "test" in agent_tasks(config) else "train"


async def play_agent(config: Config, engine: InferenceEngine, policy: Policy, task_ids: list[str], request_prefix: str,
                     split: str = "train", temperature: float | None = None) -> list[Any]:
    backend = agent_backend(config, engine, policy, split, temperature)
    try:
        return await backend.play_all(task_ids, concurrency=config.eval.concurrency or config.rollout.concurrency,
                                      request_prefix=request_prefix)
    finally:
        await backend.close()
