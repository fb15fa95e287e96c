"""Token-in/token-out trajectory records.

A ``Trajectory`` keeps exactly the ids the model was fed and the ids it sampled, turn by turn, so
training samples are assembled by concatenation and never by re-tokenising text. Records are plain
dataclasses with a JSON round trip (``to_dict``/``from_dict``) for checkpoints and logs.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Layout = Literal["full_history", "per_step"]
LAYOUTS: tuple[str, ...] = get_args(Layout)

EndReason = Literal[
    "terminated",  # the environment reached success or failure
    "truncated",  # the environment hit its own cap (steps, tool calls)
    "max_turns",  # the rollout's turn cap was reached
    "context_limit",  # full history: the next turn would not fit in max_context_tokens
    "env_error",  # reset/step (or the prompt builder) raised
    "env_timeout",  # reset/step did not return within the timeout
    "engine_error",  # generate raised, reported an error, or returned a malformed result
    "engine_timeout",  # generate did not return within the timeout
    "engine_abort",  # the engine aborted the request
    "parser_error",  # the action parser raised (it must not; recorded, not propagated)
    "worker_lost",  # the rollout worker playing it died (or hung) on every attempt
    "agent_error",  # an agent function (streamrl.agents) raised
    "agent_timeout",  # an agent function ran past its timeout
    "no_reward",  # an agent function ended without a reward
    "reward_refused",  # an agent's reward was refused (not a number, not finite, outside agent.reward_range)
]
END_REASONS: tuple[str, ...] = get_args(EndReason)

#: episodes that ended through the environment or a cap: their outcome is the sum of rewards.
#: Every other end reason is a crash and leaves ``outcome`` as ``None``.
OUTCOME_END_REASONS = frozenset({"terminated", "truncated", "max_turns", "context_limit"})
#: episodes cut by a cap rather than finished: a trainer may bootstrap their last value
CUT_END_REASONS = frozenset({"truncated", "max_turns", "context_limit"})
#: the environment failed: it is not reused for another episode
ENV_FAULT_END_REASONS = frozenset({"env_error", "env_timeout"})


@dataclass
class Turn:
    """One model action and what the environment answered.

    ``context_ids`` are the ids fed before this action that the trajectory did not already hold:
    in the full-history layout the delta appended to the transcript (the opening prompt on turn 0,
    then the bridge carrying the previous observation); in the per-step layout the whole prompt.
    """

    context_ids: list[int]
    action_ids: list[int]
    #: behaviour log-probs reported by the engine, one per action id
    logprobs: list[float]
    action_text: str
    #: what the parser extracted and the environment received (tool form: the calls, in one line)
    action: str
    format_valid: bool
    action_effective: bool
    reward: float
    #: the environment terminated on this turn (d_t); a truncation is not a termination
    done: bool
    finish_reason: str
    #: the policy version whose weights generated ``action_ids``
    policy_version: int
    #: the observation the environment returned after this action
    observation: str
    info: dict[str, Any] = field(default_factory=dict)
    #: per-step layout: the prompt was cut on the left to fit the context window
    prompt_truncated: bool = False
    #: why the format was invalid (the parser's or the environment's reason)
    format_reason: str | None = None
    #: tool form: the calls as parsed (``{"id", "name", "arguments"}`` or ``{"id", "raw", "error"}``)
    tool_calls: list[dict[str, Any]] | None = None
    #: tool form: the messages that answered the turn (``tool`` results, or a ``user`` message)
    reply: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if len(self.action_ids) != len(self.logprobs):
            raise ValueError(
                f"Turn: {len(self.action_ids)} action ids but {len(self.logprobs)} logprobs"
            )


@dataclass(frozen=True)
class DispatchRecord:
    """What was fixed when a request was dispatched; re-issued unchanged after a resume."""

    request_id: str
    prompt_id: str
    #: dispatch sequence number (0, 1, 2, ... over the whole run)
    seq: int
    #: policy version k serving at dispatch
    policy_version: int
    group_id: str | None = None
    #: event coordinate z at dispatch (from the prompt source; SPO++)
    z: float | None = None
    #: baseline frozen at dispatch (from the prompt source; SPO++)
    baseline: float | None = None
    #: any further values the prompt source froze
    extra: dict[str, Any] = field(default_factory=dict)
    env_seed: int | None = None
    #: unix time of the dispatch
    dispatched_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DispatchRecord:
        return _build(cls, data)


@dataclass
class Trajectory:
    """One episode: its dispatch record, its turns and how it ended."""

    dispatch: DispatchRecord
    layout: Layout
    turns: list[Turn] = field(default_factory=list)
    initial_observation: str = ""
    #: R: the sum of turn rewards; None when the episode crashed without an outcome
    outcome: float | None = None
    won: bool = False
    task_type: str | None = None
    end_reason: EndReason = "terminated"
    #: what went wrong, for the crash end reasons
    error: str | None = None
    #: full history, episodes cut by a cap: the env ids after the last action (mask 0); their
    #: last position is the pre-action boundary of the turn that was never taken
    trailing_context_ids: list[int] = field(default_factory=list)
    #: the environment's info after the last step (after reset when no step was taken)
    info: dict[str, Any] = field(default_factory=dict)
    finished_at: float = 0.0
    duration_s: float = 0.0
    #: of ``duration_s``, the waits the latency model injected (``rollout/latency.py``)
    injected_delay_s: float = 0.0
    #: set on delivery: learner version minus ``behaviour_version``
    lag: int | None = None
    #: set on delivery: lag above max_staleness; still delivered so trackers see the evidence
    excluded_from_loss: bool = False
    #: group mode: the group timed out and was delivered without its stragglers
    partial_group: bool = False
    #: the engine's inputs of block ``block_inputs_layer`` for each training sample, in
    #: ``to_samples`` order (full history: one; per step: one per turn), each ``[S - 1, H]`` or
    #: longer ``[S_fed, H]`` over the ids the engine fed; None when the engine kept none. Never
    #: serialised: a trajectory read back from JSON is scored with the full forward.
    block_inputs: list[Any] | None = None
    block_inputs_layer: int | None = None

    # -- identity, proxied from the dispatch record ------------------------------------------

    @property
    def request_id(self) -> str:
        return self.dispatch.request_id

    @property
    def prompt_id(self) -> str:
        return self.dispatch.prompt_id

    @property
    def group_id(self) -> str | None:
        return self.dispatch.group_id

    # -- per-turn views --------------------------------------------------------------------

    @property
    def num_action_tokens(self) -> int:
        """L_i: model-generated tokens over all turns."""
        return sum(len(turn.action_ids) for turn in self.turns)

    @property
    def rewards(self) -> list[float]:
        return [turn.reward for turn in self.turns]

    @property
    def dones(self) -> list[bool]:
        return [turn.done for turn in self.turns]

    @property
    def invalid_flags(self) -> list[bool]:
        """Per turn: the action's format was invalid."""
        return [not turn.format_valid for turn in self.turns]

    @property
    def turn_versions(self) -> list[int]:
        return [turn.policy_version for turn in self.turns]

    @property
    def min_policy_version(self) -> int | None:
        return min(self.turn_versions, default=None)

    @property
    def max_policy_version(self) -> int | None:
        return max(self.turn_versions, default=None)

    @property
    def behaviour_version(self) -> int:
        """The oldest policy version behind any of its tokens (the dispatch version if none)."""
        oldest = self.min_policy_version
        return self.dispatch.policy_version if oldest is None else oldest

    @property
    def cut(self) -> bool:
        """The episode was stopped by a cap rather than finished by the environment."""
        return self.end_reason in CUT_END_REASONS

    # -- serialisation ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict; non-JSON values inside ``info`` become strings."""
        data = {
            f.name: to_jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in ("dispatch", "turns", *_IN_MEMORY_ONLY)
        }
        data["dispatch"] = self.dispatch.to_dict()
        data["turns"] = [
            {f.name: to_jsonable(getattr(turn, f.name)) for f in dataclasses.fields(turn)}
            for turn in self.turns
        ]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        try:
            dispatch = DispatchRecord.from_dict(data.pop("dispatch"))
            turns = [_build(Turn, turn) for turn in data.pop("turns", [])]
        except KeyError as missing:
            raise ValueError(f"trajectory dict lacks the field {missing}") from None
        return _build(cls, {**data, "dispatch": dispatch, "turns": turns})


#: trajectory fields that live in memory (and cross processes pickled) but are never written out
_IN_MEMORY_ONLY = ("block_inputs", "block_inputs_layer")


def env_seed(run_seed: int, key: object) -> int:
    """The environment seed of an episode: a deterministic function of the run's seed and a key
    (the dispatch sequence, a group id: members of a group share the key, hence the initial state)."""
    return random.Random(f"{run_seed}:{key}").randrange(2**31)


def turn_stats(trajectories: list[Trajectory]) -> tuple[float, float]:
    """(turns per episode, share of format-invalid turns) over ``trajectories`` (0 when empty)."""
    turns = sum(len(t.turns) for t in trajectories)
    invalid = sum(sum(t.invalid_flags) for t in trajectories)
    return turns / max(len(trajectories), 1), invalid / max(turns, 1)


def format_problem_shares(trajectories: list[Trajectory]) -> dict[str, float]:
    """``{"malformed/<kind>": share of turns}`` for each tool-form format problem seen
    (``streamrl.envs.tools.FORMAT_PROBLEMS``: unparseable_call, unknown_tool, bad_arguments, ...)."""
    turns = [turn for t in trajectories for turn in t.turns]
    kinds = Counter(turn.info.get("format_problem") for turn in turns if turn.info.get("format_problem"))
    return {f"malformed/{kind}": count / len(turns) for kind, count in sorted(kinds.items())}


def _build(cls: type, data: dict[str, Any]) -> Any:
    """``cls(**data)`` with a clear error naming unknown or missing fields."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} dict has unknown fields: {', '.join(unknown)}")
    try:
        return cls(**data)
    except TypeError as error:
        raise ValueError(f"cannot build {cls.__name__} from dict: {error}") from None


def to_jsonable(value: Any) -> Any:
    """Deep-convert to JSON types: tuples to lists, other objects to their repr, inf/NaN to None."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    return repr(value)
