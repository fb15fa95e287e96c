"""Sessions: one agent run (an episode) seen through the endpoint, and the trajectory it becomes.

Every completion the endpoint serves in a session is recorded as a ``Call``: the prompt ids the
server rendered, the engine's generated ids, their behaviour log-probs and the policy version. Nothing
is re-tokenised. When a request continues the session's previous one (its messages are the previous
request's, the reply the endpoint returned, and new ``tool``/``user`` messages), its prompt is the
previous prompt and completion plus the template's bridge ids, so consecutive calls merge into one
full-history trajectory with observation masks. A request that does not (the agent rewrote or
dropped history) is rendered afresh; if its ids do not extend the previous ones, the session is
trained as per-step samples sharing the episode's reward, and the break is counted
(``prefix_breaks``).

A retry (the same request body as the previous call, e.g. after a client timeout) is answered
from the record and not recorded twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from streamrl.rollout.trajectory import DispatchRecord, Trajectory, Turn


@dataclass
class Call:
    """One completion served in a session."""

    key: str  # hash of the request body (retries have the same)
    messages: list[dict[str, Any]]  # the request's messages, in the template's form
    reply: dict[str, Any]  # the assistant message returned, in the template's form
    response: dict[str, Any]  # the chat.completion JSON returned (a retry gets it again)
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str
    text: str
    #: calls the reply made that could not be decoded (their errors)
    call_errors: list[str] = field(default_factory=list)
    #: the prompt continued the previous call's prompt + completion (a multi-turn transcript)
    continues: bool = False


#: rewards a session accepts when nothing narrower is configured (``agent.reward_range``)
DEFAULT_REWARD_RANGE = (-1e3, 1e3)


@dataclass
class Session:
    """An episode in progress: its dispatch record, task and the calls served so far."""

    id: str
    record: DispatchRecord
    task: dict[str, Any]
    #: the trainer's sampling for this session (None: the client's own values are used)
    temperature: float | None = None
    top_p: float | None = None
    #: the rewards accepted; anything else (not a number, not finite, outside) is refused
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None
    #: rewards given to single calls (``POST .../reward`` with ``call``), by call index
    call_rewards: dict[int, float] = field(default_factory=dict)
    #: why each refused reward was refused: one refusal keeps the episode out of training
    refused: list[str] = field(default_factory=list)
    #: the session's API key (its id travels in URLs and logs; the key only in a header)
    key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    opened_at: float = field(default_factory=time.time)
    closed: bool = False
    retries: int = 0

    def give_reward(self, value: Any, call: int | None = None) -> None:
        """Record the episode's reward (``call``: one call's). Raises ``ValueError`` saying why a
        reward is refused, after noting the refusal (the episode is then not trained on)."""
        low, high = self.reward_range
        where = "reward" if call is None else f"reward of call {call}"
        shown = repr(value)[:40]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problem = f"{where} must be a number, got {shown}"
        elif not math.isfinite(value if isinstance(value, float) else 0.0):
            problem = f"{where} must be finite, got {shown}"
        elif not low <= value <= high:  # exact for ints of any size
            problem = f"{where} {shown} is outside agent.reward_range [{low:g}, {high:g}]"
        elif call is not None and not 0 <= call < len(self.calls):
            raise ValueError(f"call must index one of the session's {len(self.calls)} calls")
        else:
            if call is None:
                self.reward = float(value)
            else:
                self.call_rewards[call] = float(value)
            return
        self.refused.append(problem)
        raise ValueError(problem)


def request_key(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


class SessionStore:
    """The open sessions of an endpoint, by id (the id is also the session's API key)."""

    #: closed sessions whose keys are remembered, so their agents hear "ended" rather than 401
    REMEMBERED = 4096

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}
        self._closed_keys: dict[str, str] = {}  # id -> key, oldest first

    def open(self, session: Session) -> Session:
        if session.id in self._sessions:
            raise ValueError(f"session {session.id!r} is already open")
        self._sessions[session.id] = self._by_key[session.key] = session
        return session

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def by_key(self, key: str) -> Session | None:
        return self._by_key.get(key)

    def key_of(self, session_id: str) -> str | None:
        """The key of an open or recently closed session."""
        session = self._sessions.get(session_id)
        return session.key if session is not None else self._closed_keys.get(session_id)

    def close(self, session_id: str) -> Session | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._by_key.pop(session.key, None)
            self._closed_keys[session_id] = session.key
            if len(self._closed_keys) > self.REMEMBERED:
                del self._closed_keys[next(iter(self._closed_keys))]
            session.closed = True
        return session

    def __len__(self) -> int:
        return len(self._sessions)


def same_reply(returned: dict[str, Any], sent_back: dict[str, Any]) -> bool:
    """Whether the assistant message an agent sends back is the one the endpoint returned."""
    def calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
        return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]

    return (returned.get("content") or "").strip() == (sent_back.get("content") or "").strip() and calls(returned) == calls(sent_back)


def to_trajectory(session: Session, end_reason: str, error: str | None = None) -> Trajectory:
    """The session as a trajectory. Merged (full history) when every call continued the previous
    one, else one per-step sample per call; the reward is the episode's, on its last turn (plus any
    per-call rewards). Each turn's observation is what the agent sent back before its next call
    (tool results, user messages). Without an accepted reward, or with a refused one
    (``reward_refused``), the trajectory has no outcome (not trained on)."""
    if session.refused and end_reason == "terminated":
        end_reason, error = "reward_refused", "; ".join(session.refused)
    merged = all(call.continues for call in session.calls[1:])
    trajectory = Trajectory(dispatch=session.record, layout="full_history" if merged else "per_step")
    trajectory.task_type = str(session.task.get("type", "agent"))
    first = session.calls[0].messages if session.calls else []
    trajectory.initial_observation = transcript(first) or str(session.task.get("prompt", session.task.get("question", "")))
    previous_end = 0
    for index, call in enumerate(session.calls):
        context = call.prompt_ids[previous_end:] if merged else call.prompt_ids
        previous_end = len(call.prompt_ids) + len(call.completion_ids)
        last = index == len(session.calls) - 1
        reward = session.call_rewards.get(index, 0.0) + (session.reward or 0.0 if last else 0.0)
        answered = [] if last else sent_back(call.messages, session.calls[index + 1].messages)
        trajectory.turns.append(Turn(
            context_ids=list(context),
            action_ids=list(call.completion_ids),
            logprobs=list(call.logprobs),
            action_text=call.text,
            action=summary(call.reply),
            format_valid=not call.call_errors,
            action_effective=True,
            reward=reward,
            done=last and session.reward is not None,
            finish_reason=call.finish_reason,
            policy_version=call.policy_version,
            observation=transcript(answered),
            info={"task_id": session.record.prompt_id, "format_valid": not call.call_errors},
            format_reason="; ".join(call.call_errors) or None,
            tool_calls=[{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                        for c in call.reply.get("tool_calls") or []],
            reply=answered,
        ))
    trajectory.end_reason = end_reason  # type: ignore[assignment]
    trajectory.error = error
    if session.reward is not None and end_reason == "terminated":
        trajectory.outcome = session.reward + sum(session.call_rewards.values())
        trajectory.won = session.reward >= float(session.task.get("success_at", 1.0))
    trajectory.info = {"task_id": session.record.prompt_id, "won": trajectory.won,
                       "calls": len(session.calls), "prefix_breaks": prefix_breaks(session), "retries": session.retries}
    return trajectory


def sent_back(before: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the agent sent back after a reply (tool results, user messages), as ``Turn.reply``
    records them: the next request's messages after its last assistant message, or (an agent that
    keeps no assistant messages) those the previous request did not have."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    added = messages[last + 1:] if last is not None else [m for m in messages if m not in before]
    return [{key: message[key] for key in ("role", "name", "content") if key in message} for message in added]


def transcript(messages: list[dict[str, Any]]) -> str:
    """Messages as text, one ``role: content`` block each (a tool result names its tool)."""
    def who(message: dict[str, Any]) -> str:
        return f"tool {message['name']}" if message.get("role") == "tool" and message.get("name") else str(message.get("role"))

    return "\n".join(f"{who(m)}: {m.get('content') or ''}" for m in messages)


def prefix_breaks(session: Session) -> int:
    """Calls whose prompt did not extend the previous call's prompt and completion."""
    return sum(not call.continues for call in session.calls[1:])


def summary(reply: dict[str, Any]) -> str:
    calls = reply.get("tool_calls") or []
    if not calls:
        return (reply.get("content") or "").strip()
    return "; ".join(f"{c['function']['name']}({json.dumps(c['function']['arguments'], ensure_ascii=False)})" for c in calls)
