"""One episode, start to finish: reset, prompt, generate, parse, step, repeat.

``EpisodeRunner.run`` never raises for a fault of the environment, the engine or the parser: it
returns a ``Trajectory`` whose ``end_reason`` says what happened (only cancellation propagates).
Each turn records the policy version of the weights that generated it; when the trainer swaps
weights between two turns, the trajectory straddles versions and says so turn by turn.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Iterable, TypeVar

from streamrl.envs.base import ActionParser, AsyncEnv, PromptBuilder, StepResult
from streamrl.envs.tools import AssistantMessage
from streamrl.policy.protocols import ChatCodec, GenerationRequest, GenerationResult, InferenceEngine, SamplingParams
from streamrl.rollout.context import bridge_ids, opening_ids, step_prompt_ids
from streamrl.rollout.env_pool import EnvPool
from streamrl.rollout.latency import LatencyModel
from streamrl.rollout.timeouts import CallTimedOut, bounded
from streamrl.rollout.trajectory import (
    ENV_FAULT_END_REASONS,
    LAYOUTS,
    OUTCOME_END_REASONS,
    DispatchRecord,
    EndReason,
    Layout,
    Trajectory,
    Turn,
)

T = TypeVar("T")


@dataclass(frozen=True)
class EpisodeSettings:
    """How episodes are played; every field is checked on construction."""

    layout: Layout = "full_history"
    #: the end-of-turn id of the codec is added to ``stop_token_ids`` automatically
    sampling: SamplingParams = field(default_factory=SamplingParams)
    #: turn cap; None uses the environment's ``spec.max_steps``
    max_turns: int | None = None
    #: full history: end the episode ("context_limit") before a turn that might not fit;
    #: per step: left-truncate prompts to ``max_context_tokens - max_new_tokens``
    max_context_tokens: int | None = None
    #: per call to reset/step; a call that overruns ends the episode with "env_timeout"
    env_timeout_s: float | None = 60.0
    #: per generate call; an overrun ends the episode with "engine_timeout"
    generate_timeout_s: float | None = None
    #: the tool form: prompts carry the environment's tool schemas, the parser reads the model's
    #: tool calls, and answers come back as tool messages (``env.tools``)
    tools: bool = False
    #: injected waits after turns and at the episode's end (None: none); see ``rollout/latency.py``
    latency: LatencyModel | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"EpisodeSettings.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"EpisodeSettings.max_turns must be >= 1, got {self.max_turns}")
        if self.sampling.max_new_tokens < 1:
            raise ValueError(f"EpisodeSettings.sampling.max_new_tokens must be >= 1, got {self.sampling.max_new_tokens}")
        if self.max_context_tokens is not None and self.max_context_tokens <= self.sampling.max_new_tokens:
            raise ValueError(
                f"EpisodeSettings.max_context_tokens ({self.max_context_tokens}) must exceed "
                f"sampling.max_new_tokens ({self.sampling.max_new_tokens})"
            )
        for name in ("env_timeout_s", "generate_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"EpisodeSettings.{name} must be > 0 or None, got {value}")

    @property
    def max_prompt_tokens(self) -> int | None:
        """The longest prompt that leaves room for a full generation."""
        if self.max_context_tokens is None:
            return None
        return self.max_context_tokens - self.sampling.max_new_tokens


class _EpisodeEnded(Exception):
    def __init__(self, reason: EndReason, message: str | None = None):
        super().__init__(message or reason)
        self.reason = reason
        self.message = message


class EpisodeRunner:
    """Plays episodes against one engine with one parser, prompt builder and codec.

    Every engine result is checked before it enters the trajectory (``_malformed``): one id per
    log-prob, ids in ``[0, vocab_size)`` and none of ``banned_token_ids`` (SAPO's value tokens,
    vocabulary padding). Both default to the codec's own (``Policy.vocab_size``,
    ``Policy.banned_token_ids``); a codec without them leaves that check off.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        codec: ChatCodec,
        parser: ActionParser,
        prompt_builder: PromptBuilder,
        settings: EpisodeSettings | None = None,
        *,
        vocab_size: int | None = None,
        banned_token_ids: Iterable[int] | None = None,
    ):
        self.engine = engine
        self.codec = codec
        self.parser = parser
        self.prompt_builder = prompt_builder
        self.settings = settings or EpisodeSettings()
        self.vocab_size = vocab_size if vocab_size is not None else getattr(codec, "vocab_size", None)
        banned = banned_token_ids if banned_token_ids is not None else getattr(codec, "banned_token_ids", ())
        self.banned_token_ids = frozenset(int(i) for i in banned or ())
        sampling = self.settings.sampling
        end = codec.end_of_turn_id
        if end not in sampling.stop_token_ids:
            sampling = replace(sampling, stop_token_ids=(*sampling.stop_token_ids, end))
        self._sampling = sampling

    async def run_leased(self, envs: EnvPool, record: DispatchRecord) -> Trajectory:
        """``run`` on an environment leased from ``envs``, returned to it afterwards (closed
        instead when the environment failed or the episode was cancelled)."""
        try:
            env = await envs.acquire()
        except Exception as error:
            reason: EndReason = "env_timeout" if isinstance(error, CallTimedOut) else "env_error"
            return Trajectory(
                dispatch=record,
                layout=self.settings.layout,
                end_reason=reason,
                error=f"environment factory failed: {type(error).__name__}: {error}",
                finished_at=time.time(),
            )
        reusable = False
        try:
            trajectory = await self.run(env, record)
            reusable = trajectory.end_reason not in ENV_FAULT_END_REASONS
            return trajectory
        finally:
            envs.release(env, reusable=reusable)

    async def run(self, env: AsyncEnv, record: DispatchRecord) -> Trajectory:
        """Play one episode of task ``record.prompt_id``; faults end it with an ``end_reason``."""
        trajectory = Trajectory(dispatch=record, layout=self.settings.layout)
        started = time.monotonic()
        try:
            await self._play(env, trajectory)
        except _EpisodeEnded as ended:
            trajectory.end_reason = ended.reason
            trajectory.error = ended.message
        finally:
            if trajectory.turns and self.settings.layout == "full_history":  # per step, _play forgot each turn's
                self._forget([i for turn in trajectory.turns for i in (*turn.context_ids, *turn.action_ids)][:-1])
        latency = self.settings.latency
        if latency is not None:
            await self._wait(trajectory, latency.episode_delay(record.request_id, trajectory.won))
        trajectory.outcome = sum(trajectory.rewards) if trajectory.end_reason in OUTCOME_END_REASONS else None
        trajectory.finished_at = time.time()
        trajectory.duration_s = time.monotonic() - started
        return trajectory

    # -- the turn loop ---------------------------------------------------------------------

    async def _play(self, env: AsyncEnv, trajectory: Trajectory) -> None:
        record = trajectory.dispatch
        reset = await self._env_call(env.reset(seed=record.env_seed, task_id=record.prompt_id), "reset")
        if not (isinstance(reset, tuple) and len(reset) == 2 and isinstance(reset[0], str) and isinstance(reset[1], dict)):
            raise _EpisodeEnded("env_error", f"env.reset returned {type(reset).__name__}, not (str, dict)")
        observation, info = reset
        trajectory.initial_observation = observation
        trajectory.info = dict(info)
        trajectory.task_type = info.get("task_type")
        max_turns = self.settings.max_turns or env.spec.max_steps
        full_history = self.settings.layout == "full_history"
        limit = self.settings.max_context_tokens
        transcript: list[int] = []
        history: list[tuple[str, str]] = []
        prompt_truncated = False
        tools = self._built(env.tools) if self.settings.tools else None
        context = (
            self._built(lambda: opening_ids(self.codec, self.prompt_builder, observation, info, tools))
            if full_history
            else []
        )

        for index in range(max_turns):
            if full_history:
                if limit is not None and len(transcript) + len(context) + self._sampling.max_new_tokens > limit:
                    self._keep_trailing(trajectory, transcript, context)
                    raise _EpisodeEnded("context_limit")
                prompt = transcript + context
            else:
                context, prompt_truncated = self._built(
                    lambda: step_prompt_ids(
                        self.codec,
                        self.prompt_builder,
                        trajectory.initial_observation,
                        history,
                        observation,
                        info,
                        self.settings.max_prompt_tokens,
                        tools,
                    )
                )
                prompt = context
            result = await self._generate(f"{record.request_id}:{index}", prompt)
            text = result.text or (self.codec.decode(result.token_ids) if result.token_ids else "")
            try:
                parsed = self.parser.parse(text)
            except Exception as error:
                raise _EpisodeEnded("parser_error", f"parser raised {type(error).__name__}: {error}") from None
            step = await self._env_call(env.step(parsed.action), "step")
            problem = _malformed_step(step)
            if problem:
                raise _EpisodeEnded("env_error", problem)
            # the parser judges the format; an environment may reject it too (e.g. an out-of-range guess)
            format_valid = parsed.format_valid and bool(step.info.get("format_valid", True))
            info = {**step.info, "format_valid": format_valid}
            message = parsed.action if isinstance(parsed.action, AssistantMessage) else None
            action = parsed.action.summary() if isinstance(parsed.action, AssistantMessage) else parsed.action
            trajectory.turns.append(
                Turn(
                    context_ids=context,
                    action_ids=list(result.token_ids),
                    logprobs=[float(lp) for lp in result.logprobs],
                    action_text=text,
                    action=action,
                    format_valid=format_valid,
                    action_effective=bool(info.get("action_effective", True)),
                    reward=float(step.reward),
                    done=bool(step.terminated),
                    finish_reason=result.finish_reason,
                    policy_version=result.policy_version,
                    observation=step.observation,
                    info=info,
                    prompt_truncated=prompt_truncated,
                    format_reason=None if format_valid else (parsed.reason or info.get("format_reason")),
                    tool_calls=[call.to_dict() for call in message.tool_calls] if message is not None else None,
                    reply=step.messages,
                )
            )
            trajectory.info = info
            trajectory.won = bool(info.get("won", False))
            _keep_block_inputs(trajectory, result, full_history)
            if self.settings.latency is not None:
                await self._wait(trajectory, self.settings.latency.turn_delay(record.request_id, index))
            if full_history:
                transcript.extend(context)
                transcript.extend(result.token_ids)
            history.append((observation, action))
            if not full_history:
                self._forget([*prompt, *result.token_ids[:-1]])
            observation = step.observation
            if full_history and not step.terminated:
                action_ids, answer = list(result.token_ids), step.messages
                context = self._built(
                    lambda: bridge_ids(self.codec, self.prompt_builder, action_ids, observation, info, answer, tools)
                )
            if step.terminated:
                trajectory.end_reason = "terminated"
                return
            if step.truncated:
                trajectory.end_reason = "truncated"
                self._keep_trailing(trajectory, transcript, context)
                return
        trajectory.end_reason = "max_turns"
        self._keep_trailing(trajectory, transcript, context)

    def _forget(self, fed: list[int]) -> None:
        """Tell an engine that keeps finished sequences for a next turn (the HF engine) that ``fed``
        (a prompt and its answer but the last id) has none: its KV is freed now, not when it ages
        out. Full history: the episode's last sequence; per step: every turn's (no prompt extends another)."""
        forget = getattr(self.engine, "forget", None)
        if forget is not None:
            forget(fed)

    @staticmethod
    async def _wait(trajectory: Trajectory, seconds: float) -> None:
        """An injected delay (the latency model), added to the trajectory's record of them."""
        if seconds > 0:
            trajectory.injected_delay_s += seconds
            await asyncio.sleep(seconds)

    def _keep_trailing(self, trajectory: Trajectory, transcript: list[int], context: list[int]) -> None:
        """Full history, cut episode: keep the next context (mask 0) when it fits the window."""
        if self.settings.layout != "full_history" or not trajectory.turns:
            return
        limit = self.settings.max_context_tokens
        if limit is None or len(transcript) + len(context) <= limit:
            trajectory.trailing_context_ids = list(context)

    # -- calls that may fail ---------------------------------------------------------------

    @staticmethod
    def _built(build: Any) -> Any:
        """Run prompt-building code (the environment's prompt builder); its faults are env faults."""
        try:
            return build()
        except Exception as error:
            raise _EpisodeEnded("env_error", f"prompt builder raised {type(error).__name__}: {error}") from None

    async def _env_call(self, call: Awaitable[T], what: str) -> T:
        try:
            return await bounded(call, self.settings.env_timeout_s)
        except CallTimedOut:
            raise _EpisodeEnded("env_timeout", f"env.{what} did not return within {self.settings.env_timeout_s} s") from None
        except Exception as error:
            raise _EpisodeEnded("env_error", f"env.{what} raised {type(error).__name__}: {error}") from None

    async def _generate(self, request_id: str, prompt_ids: list[int]) -> GenerationResult:
        request = GenerationRequest(request_id=request_id, prompt_ids=prompt_ids, sampling=self._sampling)
        try:
            result = await bounded(self.engine.generate(request), self.settings.generate_timeout_s)
        except CallTimedOut:
            raise _EpisodeEnded(
                "engine_timeout", f"generate did not return within {self.settings.generate_timeout_s} s"
            ) from None
        except Exception as error:
            raise _EpisodeEnded("engine_error", f"generate raised {type(error).__name__}: {error}") from None
        problem = _malformed(result, self._sampling.max_new_tokens, self.vocab_size, self.banned_token_ids)
        if problem:
            raise _EpisodeEnded("engine_error", problem)
        if result.finish_reason == "abort":
            raise _EpisodeEnded("engine_abort", result.error)
        return result


def _malformed_step(step: Any) -> str | None:
    """Why an environment step result cannot be recorded, or None when it is sound."""
    if not isinstance(step, StepResult):
        return f"env.step returned {type(step).__name__}, not StepResult"
    if not isinstance(step.observation, str) or not isinstance(step.info, dict):
        return "env.step returned a StepResult whose observation is not a str or whose info is not a dict"
    if step.messages is not None and not (
        isinstance(step.messages, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in step.messages)
    ):
        return "env.step returned messages that are not a list of message dicts with text content"
    if isinstance(step.reward, bool) or not isinstance(step.reward, (int, float)) or not math.isfinite(step.reward):
        return f"env.step returned the reward {step.reward!r}, not a finite number"
    return None


def _malformed(
    result: Any, max_new_tokens: int, vocab_size: int | None = None, banned: frozenset[int] = frozenset()
) -> str | None:
    """Why an engine result cannot be trained on, or None when it is sound."""
    if not isinstance(result, GenerationResult):
        return f"generate returned {type(result).__name__}, not GenerationResult"
    if result.finish_reason == "error" or (result.error is not None and result.finish_reason != "abort"):
        return f"engine reported an error: {result.error or 'finish_reason=error'}"
    if result.finish_reason not in ("stop", "length", "abort"):
        return f"unknown finish_reason {result.finish_reason!r}"
    if not isinstance(result.token_ids, (list, tuple)) or not isinstance(result.logprobs, (list, tuple)):
        return "token_ids and logprobs must be lists"
    if len(result.token_ids) != len(result.logprobs):
        return f"{len(result.token_ids)} token ids but {len(result.logprobs)} logprobs"
    if len(result.token_ids) > max_new_tokens:
        return f"{len(result.token_ids)} tokens exceed max_new_tokens={max_new_tokens}"
    if not all(isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in result.token_ids):
        return "token ids must be non-negative ints"
    if vocab_size is not None and any(token >= vocab_size for token in result.token_ids):
        bad = next(token for token in result.token_ids if token >= vocab_size)
        return f"token id {bad} is outside the vocabulary (size {vocab_size})"
    if banned and not banned.isdisjoint(result.token_ids):
        bad = next(token for token in result.token_ids if token in banned)
        return f"token id {bad} is banned (value tokens and padding are never sampled)"
    if not all(isinstance(lp, numbers.Real) and not isinstance(lp, bool) for lp in result.logprobs):
        return "logprobs must be numbers"
    if not all(math.isfinite(lp) and lp <= 1e-6 for lp in result.logprobs):
        return "logprobs must be finite and <= 0"
    if not isinstance(result.policy_version, int):
        return f"policy_version must be an int, got {result.policy_version!r}"
    return None


def _keep_block_inputs(trajectory: Trajectory, result: GenerationResult, full_history: bool) -> None:
    """Keep the engine's block inputs of the turn just played: full history, the latest result's
    (its prompt holds every earlier turn); per step, one per turn. One turn without them, or from
    another block, leaves the trajectory with none (the learner then runs the full forward)."""
    inputs, layer = result.block_inputs, result.block_inputs_layer
    first_turn = len(trajectory.turns) == 1
    if inputs is None or layer is None or not (first_turn or trajectory.block_inputs is not None and trajectory.block_inputs_layer == layer):
        trajectory.block_inputs = trajectory.block_inputs_layer = None
        return
    trajectory.block_inputs = [inputs] if full_history or first_turn else [*(trajectory.block_inputs or []), inputs]
    trajectory.block_inputs_layer = layer
