"""The training loop, readable in one screen: (SFT) -> eval -> [rollout -> learn -> publish] -> eval.

Rollouts never wait for the learner: the learner step runs in a worker thread while the rollout
keeps generating (with the engine's own weight copy), and weights are published after each step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from streamrl.policy.dtype_choice import processor_name
from streamrl.policy.engines import block_inputs_refusal, make_engine
from streamrl.policy.protocols import InferenceEngine
from streamrl.rollout import DeadEnvironmentError, Rollout, RolloutSettings
from streamrl.rollout.play_tasks import run_episodes
from streamrl.training.agent_mode import agent_tasks, play_agent
from streamrl.training.allocator import keep_freed_memory
from streamrl.training.assemble import make_learner
from streamrl.training.backend_choice import rollout_backend
from streamrl.training.config import Config
from streamrl.training.data_parallel import DataParallelLearner
from streamrl.training.environment import Environment
from streamrl.training.errors import TrainingError, TrainingInterrupted
from streamrl.training.evaluate import episode_runner, episode_settings, evaluate, training_episode_settings
from streamrl.training.learner import Learner
from streamrl.training.progress import Progress, StallWatch
from streamrl.training.report import write_report
from streamrl.training.resources import check_resources, engine_prefix_tokens, memory_line
from streamrl.training.run import RunState, Workspace, load_run_policy, model_line, model_record
from streamrl.training.samples import mixed_selection
from streamrl.training.sft import behaviour_cloning, demonstrations_and_heldout
from streamrl.training.signals import GracefulStop

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy


async def train(config: Config, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                echo=None) -> dict[str, Any]:
    """Train into ``out_dir`` (refused when not empty unless ``resume`` or ``overwrite``); returns the
    summary (``finished_earlier`` when a resumed run had already reached ``train.steps``)."""
    echo = echo or functools.partial(print, flush=True)  # progress lines must reach logs promptly
    keep_freed_memory()  # every update reuses its tensors' memory instead of faulting it in again
    check_resources(config)  # a run that cannot fit in memory is refused before any work
    ws = Workspace(Path(out_dir), config, echo, resume=resume, overwrite=overwrite)
    try:
        return await _train(config, ws, echo)
    finally:
        ws.release()


async def _train(config: Config, ws: Workspace, echo: Any) -> dict[str, Any]:
    finished = ws.finished()
    if finished is not None:
        assert ws.checkpoint is not None  # a finished run was resumed from its checkpoint
        echo(f"resume: the run in {ws.root} already finished at step {ws.checkpoint.step}; nothing to do")
        return {**finished, "finished_earlier": True}
    state = ws.restore()
    started = time.monotonic()
    policy = load_run_policy(config, state, ws.sft_kept)
    policy.limit_training(top_layers=config.model.train_top_layers)  # so the first line counts what trains
    model = model_record(config, policy)
    echo(model_line(model))
    prefix_tokens = engine_prefix_tokens(config)  # sized once: the line says what the engine gets
    echo(memory_line(config, prefix_tokens))
    if config.env.tools:  # the format auto picked, and why
        echo(policy.tool_format_reason)
    logger = ws.logger(state)
    samples = ws.sample_log(state)
    summary: dict[str, Any] = {"out_dir": str(ws.root), "model": model, "processor": processor_name()}
    stall = StallWatch()

    learner_threads, engine_threads = thread_split(config)
    agents = bool(config.agent.function or config.agent.external)
    if state is None and config.sft.demos > 0 and config.model.init_from is None and not agents and not ws.sft_kept:
        echo(f"SFT: collecting {config.sft.demos} demonstrations ({config.sft.source})")
        demos, heldout = await demonstrations_and_heldout(config, policy)
        echo(f"SFT: {len(demos)} demonstrations x {config.sft.epochs} epochs")
        torch.set_num_threads(learner_threads + engine_threads)  # nothing else runs during SFT
        summary["sft"] = behaviour_cloning(config, policy, demos, log=lambda s, m: logger.log(s, m, "sft"), heldout=heldout,
                                           progress=echo)
        echo(f"SFT: {len(demos)} demonstrations, final NLL {summary['sft']['nll']:.3f}")
        policy.save(ws.root / "sft_model")

    pool, reward_range = training_tasks(config)
    local = make_learner(config, policy, ws.reference(config, policy, state), reward_range)
    algorithm = local.algorithm
    run = RunState.initial() if state is None else ws.load_learner(state, local)
    torch.set_num_threads(learner_threads)
    capture = local.reused_block
    # the engine has every core while the learner is idle (evaluations, waiting for a batch) and
    # hands the learner its share during a step (``_engine_threads``)
    engine = make_engine(config.model.engine, policy, version=run.version, seed=config.train.seed,
                         threads=learner_threads + engine_threads,
                         rollout_dtype=config.model.rollout_dtype, capture_layer=capture,
                         prefix_cache_tokens=prefix_tokens)
    if capture is not None:  # said once: what the learner's forward pass costs
        refusal = block_inputs_refusal(engine, config.model.engine, config.model.rollout_dtype)
        echo(f"learner: runs blocks {capture}+ only, from the engine's inputs of block {capture}"
             if refusal is None else f"learner: runs every block ({refusal})")
        capture = capture if refusal is None else None

    if state is None and algorithm.warm_start is not None:  # a fresh run: initialised by the initial policy
        note = await algorithm.warm_start(pool, functools.partial(play_episodes, config, engine, policy))
        if note:
            echo(note)

    async def evaluate_and_log(tag: str) -> dict[str, Any]:
        result = await evaluate(config, engine, policy, tag=tag, progress=echo)
        if result.crash_note():
            echo(f"{tag}: {result.crash_note()}")
        samples.write(result.trajectories, kind="eval", step=run.step, tag=tag)
        metrics = result.metrics()
        logger.log(run.step, metrics, "eval")
        if run.step and run.step < config.train.steps:  # the first and last are printed by the caller
            echo(f"eval at step {run.step}: success {metrics['success']:.3f}")
        return metrics

    evaluates = not config.agent.external  # agents in other processes play only what the trainer dispatches
    if state is None and config.train.eval_at_start and evaluates:
        summary["eval_before"] = await evaluate_and_log("eval-v0")
        echo(f"eval before RL: success {summary['eval_before']['success']:.3f}")

    learner: Learner | DataParallelLearner = local
    if config.train.learner_processes > 1:  # from here on the learner's work is spread over processes
        learner = DataParallelLearner(local, config, state, reward_range, config.train.learner_processes,
                                      learner_threads, str(ws.root))
    episode = training_episode_settings(config)
    rollout = Rollout(
        backend=rollout_backend(config, episode, engine, policy, engine_threads, capture),
        source=algorithm.prompt_source(pool),
        settings=RolloutSettings(
            mode=algorithm.rollout_mode, concurrency=config.rollout.concurrency, batch_size=config.train.batch_size,
            group_size=algorithm.group_size, max_staleness=config.rollout.max_staleness,
            seed=config.train.seed, env_name=config.task_label(), episode=episode,
            max_env_faults_in_row=config.rollout.max_env_faults_in_row,
        ),
        event_log=ws.events_path(state),
    )
    if state is not None:
        rollout.load_state_dict(state.rollout)
    progress = Progress(config.train.steps, run.step, enabled=config.logging.progress, echo=echo)
    # RL time runs on from the checkpoint a resumed run starts at (what a killed process did after it is redone)
    rl_started, limit = time.monotonic() - run.rl_s, config.train.time_limit_minutes
    try:
        async with rollout, GracefulStop() as stop:
            while run.step < config.train.steps:
                if limit is not None and time.monotonic() - rl_started >= 60 * limit:
                    echo(f"time limit: {limit:g} min of RL reached after step {run.step}")
                    summary["stopped_by"] = "time_limit"
                    break
                waiting = time.monotonic()
                try:
                    batch = await rollout.next_batch()
                except DeadEnvironmentError:  # the environment keeps failing: keep what was learned, then stop
                    if run.step:
                        ws.save(run, policy, learner, rollout, logger)
                    raise
                # what generation costs a step beyond what the learner's update hides of it
                batch_wait_s = time.monotonic() - waiting
                require_outcomes(batch, run.step + 1)
                with _engine_threads(engine, engine_threads, learner_threads + engine_threads):
                    metrics = await asyncio.to_thread(_with_threads, learner_threads, learner.step, batch)
                run.advance(batch, rl_s=time.monotonic() - rl_started)
                engine.update_weights(policy.state_dict_for_engine(), run.version)
                rollout.publish(run.version)
                metrics.update(run.metrics(), batch_wait_s=batch_wait_s, **_rollout_metrics(rollout.stats()))
                if agents:  # calls whose prompt did not extend the transcript (trained per step)
                    metrics["prefix_breaks"] = float(sum(t.info.get("prefix_breaks", 0) for t in batch))
                try:
                    logger.log(run.step, metrics)
                    if config.logging.samples_every and run.step % config.logging.samples_every == 0:
                        chosen = mixed_selection(batch, config.logging.samples_per_step)
                        samples.write(chosen, kind="train", step=run.step, advantages=learner.last_advantages)
                except OSError as error:  # a full disk: keep the steps since the last checkpoint if it can
                    raise _disk_full(error, run.step, lambda: ws.save(run, policy, learner, rollout, logger)) from None
                progress.update(run.step, metrics)
                warning = stall.update(run.step, metrics)
                if warning:
                    echo(f"warning: {warning}")
                if evaluates and config.train.eval_every and run.step % config.train.eval_every == 0 and run.step < config.train.steps:
                    await evaluate_and_log(f"eval-v{run.version}")
                if stop.requested is not None:  # SIGTERM / SIGINT: keep this step, then stop
                    ws.save(run, policy, learner, rollout, logger)
                    raise TrainingInterrupted(stop.requested, run.step, str(ws.root))
                if config.train.checkpoint_every and run.step % config.train.checkpoint_every == 0:
                    ws.save(run, policy, learner, rollout, logger)
            ws.save(run, policy, learner, rollout, logger)
        rl_finished = time.monotonic()
        progress.close()
        if evaluates:
            summary["eval_after"] = await evaluate_and_log(f"eval-v{run.version}-final")
    finally:
        progress.close()
        if isinstance(learner, DataParallelLearner):
            learner.close()
        await engine.close()
        logger.close()
        samples.close()
    policy.save(ws.root / "final_model")
    summary.update(steps=run.step, trajectories=run.trajectories, wall_s=round(time.monotonic() - started, 1),
                   rl_s=round(rl_finished - rl_started, 1),
                   warnings=[stall.warning] if stall.warning else [])
    try:
        summary["report"] = str(write_report(ws.root, config, summary, reward_range))
    except Exception as error:  # the run is trained and saved: a report that fails must not undo that
        echo(f"report: could not be written ({type(error).__name__}: {error}); the model, checkpoints and logs are saved")
    ws.write_summary(summary)
    return summary


def _disk_full(error: OSError, step: int, save: Any) -> TrainingError:
    """One line for a log write that failed (a full disk), after trying to checkpoint the step."""
    try:
        save()
        kept = f"step {step} is checkpointed"
    except TrainingError:
        kept = "the checkpoint could not be written either; the previous one is intact"
    return TrainingError(f"writing the run's logs failed at step {step}: {error.strerror}; {kept}. "
                         "Free space and continue with --resume")


def training_tasks(config: Config) -> tuple[list[str], tuple[float, float]]:
    """The prompt pool (task ids) and the reward range: the environment's, or the agent's tasks."""
    if config.agent.function or config.agent.external:
        reward_range = cast("tuple[float, float]", tuple(config.agent.reward_range))  # validated as a pair
        return [task["id"] for task in agent_tasks(config)["train"]], reward_range
    with Environment.of(config.env).probe() as env:
        return env.task_ids("train", limit=config.env.train_tasks), env.spec.reward_range


async def play_episodes(
    config: Config, engine: InferenceEngine, policy: Policy, prompt_ids: list[str], request_prefix: str
) -> list[Any]:
    """One episode per prompt id with the training episode settings, outside the rollout stream
    (what an algorithm's ``warm_start`` plays)."""
    if config.agent.function:
        return await play_agent(config, engine, policy, prompt_ids, request_prefix)
    return await run_episodes(
        episode_runner(config, engine, policy, episode_settings(config)),
        Environment.of(config.env).make,
        prompt_ids,
        concurrency=config.rollout.concurrency, seed=config.train.seed, request_prefix=request_prefix,
    )


def thread_split(config: Config) -> tuple[int, int]:
    """(learner, engine) torch threads: they run at the same time, so together they fill the cores
    without oversubscribing them (spinning OpenMP pools make oversubscription very costly)."""
    cores = os.cpu_count() or 2
    learner = config.model.threads or max(1, cores // 2)
    return learner, config.rollout.engine_threads or max(1, cores - learner)


def require_outcomes(batch: list[Any], step: int) -> None:
    """Never train on an empty batch: one in which every episode crashed stops training."""
    if batch and all(t.outcome is None for t in batch):
        first = batch[0]
        raise TrainingError(
            f"step {step}: all {len(batch)} episodes of the batch crashed ({first.end_reason}: {first.error}); "
            "nothing to train on"
        )


@contextlib.contextmanager
def _engine_threads(engine: InferenceEngine, during: int, after: int) -> Iterator[None]:
    """``engine`` (when it can change them: the HF engine) on ``during`` threads for the block."""
    set_threads = getattr(engine, "set_threads", None)
    if set_threads is not None:
        set_threads(during)
    try:
        yield
    finally:
        if set_threads is not None:
            set_threads(after)


def _with_threads(threads: int, fn: Any, *args: Any) -> Any:
    torch.set_num_threads(threads)  # OpenMP settings are per thread: set it in the worker itself
    return fn(*args)


def _rollout_metrics(stats: dict[str, Any]) -> dict[str, float]:
    keys = ("dispatched", "in_flight", "buffered", "slot_utilisation")
    return {f"rollout_{key}": float(stats[key]) for key in keys}
