"""The rollout backend a configuration asks for (``rollout.backend``, ``rollout.workers``,
``model.engine``): the local one over the trainer's engine, or Ray workers built from a spec."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from streamrl.policy.protocols import InferenceEngine
from streamrl.rollout import EpisodeBackend, EpisodeSettings, WorkerSpec, make_backend
from streamrl.training.agent_mode import agent_backend, agent_player, external_backend
from streamrl.training.config import Config
from streamrl.training.resources import engine_prefix_tokens
from streamrl.training.run import policy_source

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy


def worker_spec(config: Config, episode: EpisodeSettings, engine_threads: int | None,
                capture_layer: int | None = None) -> WorkerSpec:
    """What a Ray worker builds: the policy's architecture and tokeniser (its weights come from the
    trainer, LoRA merged), its engine (keeping block ``capture_layer``'s inputs for the learner) and
    the environment with its parser and prompt builder."""
    model, env = config.model, config.env
    return WorkerSpec(
        model={**policy_source(config), "dtype": model.dtype, "device": model.device, "threads": engine_threads},
        env=env.name, env_options=env.options, parser_options=env.parser, prompt_options=env.prompt,
        episode=episode, engine=model.engine, rollout_dtype=model.rollout_dtype,
        engine_threads=engine_threads, capture_layer=capture_layer, prefix_cache_tokens=engine_prefix_tokens(config),
        seed=config.train.seed,
        worker_gpus=1.0 if model.device.startswith("cuda") else 0.0,
    )


def rollout_backend(config: Config, episode: EpisodeSettings, engine: InferenceEngine, policy: Policy,
                    engine_threads: int | None, capture_layer: int | None = None) -> EpisodeBackend:
    if config.agent.external:  # agents elsewhere claim the tasks (streamrl serve --train)
        return external_backend(config, engine, policy)
    spec = worker_spec(config, episode, engine_threads, capture_layer)
    if config.agent.function:  # the user's agent plays, through an endpoint over the engine that serves it
        if config.rollout.backend == "local":
            return agent_backend(config, engine, policy)
        # in each Ray worker, against the worker's own endpoint; an episode is bounded by the agent's timeout
        spec = dataclasses.replace(spec, player=agent_player(config), episode_timeout_s=config.agent.timeout_s + 60.0)
    return make_backend(
        config.rollout.backend, spec, concurrency=config.rollout.concurrency,
        engine=engine, codec=policy, weights=policy.state_dict_for_engine, workers=config.rollout.workers,
    )
