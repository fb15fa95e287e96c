"""``streamrl.rollout``: asynchronous multi-turn rollouts, token-in/token-out.

Pieces, bottom up:

* ``Trajectory`` / ``Turn`` / ``DispatchRecord``: what one episode produced, with the exact ids the
  engine saw and sampled, behaviour log-probs, per-turn policy versions and the metadata frozen at
  dispatch (version k, event coordinate z, baseline). ``to_dict``/``from_dict`` round-trip JSON.
* ``to_samples`` (``full_history_sample``, ``per_step_samples``) -> ``TrainingSample``: packed ids,
  action mask, rollout log-probs, turn spans, pre/post-action positions, per-turn rewards/dones.
* ``EpisodeRunner`` + ``EpisodeSettings``: plays one episode; faults end it with an ``end_reason``.
  ``run_episodes`` plays a fixed task list once each (evaluation). ``LatencyModel`` (optional)
  injects heavy-tailed waits between turns and at the end, for the asynchronous regime on one machine.
* ``Rollout`` + ``RolloutSettings``: ``mode="stream"`` (single-stream, first-finished) or
  ``mode="group"`` (GRPO groups behind a barrier), with admission bounded by ``max_staleness``.
* ``make_backend`` -> ``LocalBackend`` (episodes in this process) or ``RayBackend`` (Ray actors,
  each with its own engine and environments, built from a ``WorkerSpec``; ``ray_backend.py``).
* ``PromptSource`` (implemented by the trainer; ``UniformPromptSource`` is the default) and
  ``DispatchMeta``: which prompt to run next and what to freeze when it is dispatched.
* ``admission_capacity`` / ``sample_lag`` / ``is_stale``: the staleness rules, as pure functions.
* ``EventLog`` output (``events.jsonl``) and ``replay``/``read_events`` to audit a run.

Usage (a trainer loop)::

    from streamrl.envs import make, make_parser, make_prompt_builder
    from streamrl.rollout import EpisodeSettings, Rollout, RolloutSettings, UniformPromptSource, to_samples

    env = make("guess_number")
    rollout = Rollout(
        engine=engine,  # any streamrl.policy.protocols.InferenceEngine
        codec=codec,  # its ChatCodec
        env_factory=lambda: make("guess_number"),
        parser=make_parser("guess_number"),
        prompt_builder=make_prompt_builder("guess_number"),
        source=UniformPromptSource(env.task_ids("train", limit=256)),
        settings=RolloutSettings(mode="stream", concurrency=16, batch_size=16, max_staleness=4,
                                 episode=EpisodeSettings(layout="full_history", max_context_tokens=2048)),
        event_log="runs/x/events.jsonl",
    )
    async with rollout:
        for step in range(steps):
            batch = await rollout.next_batch()  # trajectories, first-finished
            samples = to_samples([t for t in batch if not t.excluded_from_loss and t.outcome is not None])
            ...  # compute the loss, optimiser step
            engine.update_weights(state_dict, version=step + 1)
            rollout.publish(step + 1)
            checkpoint["rollout"] = rollout.state_dict()  # resume: rollout.load_state_dict(...) before start

Evaluation, outside the training stream::

    runner = EpisodeRunner(engine, codec, parser, prompt_builder, EpisodeSettings(layout="full_history"))
    results = await run_episodes(runner, lambda: make("guess_number"), env.task_ids("test"), concurrency=16)
    success = sum(t.won for t in results) / len(results)

``streamrl.policy.scripted`` has a scripted engine and a character-level codec for dry runs.
"""

from streamrl.rollout.backend import EpisodeBackend, LocalBackend, WorkerSpec
from streamrl.rollout.backends import make_backend
from streamrl.rollout.dispatcher import Rollout
from streamrl.rollout.episode import EpisodeRunner, EpisodeSettings
from streamrl.rollout.events import EventLog, read_events, replay
from streamrl.rollout.latency import LatencyModel
from streamrl.rollout.layouts import TrainingSample, full_history_sample, per_step_samples, to_samples
from streamrl.rollout.play_tasks import run_episodes
from streamrl.rollout.settings import DeadEnvironmentError, RolloutError, RolloutSettings, RolloutStalledError
from streamrl.rollout.sources import DispatchMeta, PromptSource, UniformPromptSource
from streamrl.rollout.staleness import admission_capacity, is_stale, sample_lag
from streamrl.rollout.trajectory import (
    CUT_END_REASONS,
    END_REASONS,
    ENV_FAULT_END_REASONS,
    OUTCOME_END_REASONS,
    DispatchRecord,
    EndReason,
    Layout,
    Trajectory,
    Turn,
)

__all__ = [
    "CUT_END_REASONS",
    "END_REASONS",
    "ENV_FAULT_END_REASONS",
    "OUTCOME_END_REASONS",
    "DispatchMeta",
    "DispatchRecord",
    "EndReason",
    "EpisodeBackend",
    "EpisodeRunner",
    "EpisodeSettings",
    "EventLog",
    "LatencyModel",
    "Layout",
    "LocalBackend",
    "PromptSource",
    "Rollout",
    "RolloutError",
    "RolloutSettings",
    "RolloutStalledError",
    "DeadEnvironmentError",
    "TrainingSample",
    "Trajectory",
    "Turn",
    "UniformPromptSource",
    "WorkerSpec",
    "admission_capacity",
    "full_history_sample",
    "is_stale",
    "make_backend",
    "per_step_samples",
    "read_events",
    "replay",
    "run_episodes",
    "sample_lag",
    "to_samples",
]
