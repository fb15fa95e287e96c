"""Evaluation on a fixed task set: every task played once, success overall and by task type."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from streamrl.policy.protocols import InferenceEngine, SamplingParams
from streamrl.policy.tool_format import tool_format_of
from streamrl.rollout import EpisodeRunner, EpisodeSettings, LatencyModel, Trajectory
from streamrl.rollout.play_tasks import run_episodes
from streamrl.rollout.roles import action_parser, prompt_builder
from streamrl.rollout.trajectory import format_problem_shares, turn_stats
from streamrl.training.agent_mode import agent_tasks, eval_split, play_agent
from streamrl.training.config import Config
from streamrl.training.environment import Environment, split_task_ids
from streamrl.training.progress import TimedLines


@dataclass
class EvalResult:
    split: str
    policy_version: int
    episodes: int
    success: float
    #: the mean episode return in environment reward, on success's 0-1 scale (WebShop's score / 100;
    #: the success rate where the reward is 1 on success and 0 otherwise)
    score: float = 0.0
    by_task_type: dict[str, dict[str, float]] = field(default_factory=dict)
    mean_turns: float = 0.0
    format_invalid_frac: float = 0.0
    #: tool form: the share of turns with each format problem (``malformed/<kind>``)
    format_problems: dict[str, float] = field(default_factory=dict)
    crashed: int = 0
    #: every episode played, for transcripts (not a metric)
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)

    def crash_note(self) -> str | None:
        """One line when episodes crashed (None otherwise): how many, why, and the first error."""
        crashed = [t for t in self.trajectories if t.outcome is None]
        if not crashed:
            return None
        first = crashed[0]
        share = "every episode" if len(crashed) == self.episodes else f"{len(crashed)} of {self.episodes} episodes"
        return f"{share} of the evaluation crashed ({first.end_reason}: {first.error}); they count as failures"

    def metrics(self) -> dict[str, Any]:
        flat: dict[str, Any] = {
            "split": self.split,
            "episodes": self.episodes,
            "success": self.success,
            "score": self.score,
            "mean_turns": self.mean_turns,
            "format_invalid_frac": self.format_invalid_frac,
            **self.format_problems,
            "crashed": self.crashed,
            "policy_version": self.policy_version,
        }
        for task_type, row in self.by_task_type.items():
            flat[f"success/{task_type}"] = row["success"]
        return flat


def summarise(trajectories: list[Trajectory], split: str, version: int) -> EvalResult:
    by_type: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        t.block_inputs = None  # the engine's hidden states serve training only: an evaluation holds none
        by_type[t.task_type or "unknown"].append(bool(t.won))
    mean_turns, format_invalid_frac = turn_stats(trajectories)
    return EvalResult(
        split=split,
        policy_version=version,
        episodes=len(trajectories),
        success=sum(t.won for t in trajectories) / max(len(trajectories), 1),
        score=sum(t.outcome or 0.0 for t in trajectories) / max(len(trajectories), 1),
        by_task_type={k: {"success": sum(v) / len(v), "episodes": float(len(v))} for k, v in sorted(by_type.items())},
        mean_turns=mean_turns,
        format_invalid_frac=format_invalid_frac,
        format_problems=format_problem_shares(trajectories),
        crashed=sum(t.outcome is None for t in trajectories),
        trajectories=trajectories,
    )


def episode_settings(config: Config, temperature: float | None = None) -> EpisodeSettings:
    """The episode settings training rollouts use (evaluation may change the temperature)."""
    rollout = config.rollout
    return EpisodeSettings(
        layout=rollout.layout,
        sampling=SamplingParams(
            temperature=rollout.temperature if temperature is None else temperature,
            top_p=rollout.top_p,
            max_new_tokens=rollout.max_new_tokens,
        ),
        max_turns=rollout.max_turns,
        max_context_tokens=rollout.max_context_tokens,
        env_timeout_s=rollout.step_timeout_s,
        tools=config.env.tools,
    )


def training_episode_settings(config: Config) -> EpisodeSettings:
    """``episode_settings`` with the latency model of ``rollout.latency`` (training episodes only:
    evaluation and warm starts play without injected waits)."""
    model = LatencyModel(**config.rollout.latency.model_dump(), seed=config.train.seed)
    return replace(episode_settings(config), latency=model if model.active else None)


def episode_runner(config: Config, engine: InferenceEngine, codec: Any, settings: EpisodeSettings) -> EpisodeRunner:
    env = config.env
    tool_format = tool_format_of(codec) if settings.tools else None
    return EpisodeRunner(
        engine, codec, action_parser(env.name, env.parser, tool_format), prompt_builder(env.name, env.prompt, settings.tools),
        settings,
    )


def eval_task_ids(config: Config) -> tuple[str, list[str]]:
    with Environment.of(config.env).probe() as env:
        split = config.env.eval_split or env.spec.eval_split
        return split, split_task_ids(env, split, config.env.eval_tasks, config.env.eval_from)


class EvalProgress:
    """Every ``every_s`` seconds, one line: the episodes played of ``total``, the wins, the time left
    (the last episode is the result line's to tell)."""

    def __init__(self, tag: str, total: int, echo: Callable[[str], None], every_s: float = 10.0):
        self.tag, self.lines = tag, TimedLines(total, echo, every_s)
        self.done = self.won = 0

    def __call__(self, trajectory: Trajectory) -> None:
        self.done += 1
        self.won += bool(trajectory.won)
        if self.done < self.lines.total:
            self.lines.tell(self.done, f"{self.tag}: {self.done}/{self.lines.total} episodes, {self.won} won")


async def evaluate(config: Config, engine: InferenceEngine, codec: Any, tag: str = "eval",
                   progress: Callable[[str], None] | None = None) -> EvalResult:
    """Play the held-out tasks once each; ``progress`` hears a line every 10 s of a long one."""
    temperature = 0.0 if config.eval.greedy else config.eval.temperature
    if config.agent.function:  # the agent's held-out tasks, played through the endpoint
        split = eval_split(config)
        task_ids = [task["id"] for task in agent_tasks(config)[split]][: config.env.eval_tasks]
        trajectories = await play_agent(config, engine, codec, task_ids, tag, split, temperature)
        return summarise(trajectories, split, engine.version)
    split, task_ids = eval_task_ids(config)
    settings = episode_settings(config, temperature=temperature)
    trajectories = await run_episodes(
        episode_runner(config, engine, codec, settings),
        Environment.of(config.env).make,
        task_ids,
        concurrency=config.eval.concurrency or config.rollout.concurrency,
        seed=config.train.seed,
        request_prefix=tag,
        on_done=EvalProgress(tag, len(task_ids), progress) if progress is not None else None,
    )
    return summarise(trajectories, split, engine.version)
