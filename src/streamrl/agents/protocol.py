"""The chat-completions protocol as OpenAI answers it: which request fields are honoured, ignored or
refused (docs/agents.md lists them), the messages in the form chat templates render, the sampling a
request asks for, and the ``chat.completion`` / ``chat.completion.chunk`` objects sent back. Pure
functions over JSON values; the endpoint (``server.py``) calls them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streamrl.policy.protocols import SamplingParams

MODEL_NAME = "streamrl-policy"
#: deepest JSON nesting a request may have (a chat request needs about 8)
MAX_JSON_DEPTH = 64

#: fields that change the answer and are honoured
HONOURED = frozenset({"model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
                      "max_completion_tokens", "stop", "n", "stream", "stream_options", "logprobs", "top_logprobs", "seed"})
#: fields accepted and ignored: bookkeeping that does not change a completion
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key", "safety_identifier"})
#: fields accepted only at their neutral value (anything else is refused)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}), "modalities": (None, ["text"]),
}


class RequestError(Exception):
    """A bad request: its status and the OpenAI error fields."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.kind, self.code = message, param, status, kind, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def json_depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(raw: bytes) -> Any:
    """A request body -> its JSON value; a ``RequestError`` if it is not JSON or nests too deeply."""
    try:
        value = json.loads(raw or b"null")
    except RecursionError:
        raise RequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:
        raise RequestError("the request body is not valid JSON") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise RequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def check_fields(body: dict[str, Any]) -> None:
    """Refuse fields this endpoint would otherwise have to ignore silently."""
    unknown = sorted(set(body) - HONOURED - IGNORED - set(NEUTRAL))
    if unknown:
        raise RequestError(f"unsupported parameter {unknown[0]!r} (docs/agents.md lists the supported ones)", unknown[0])
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise RequestError(f"{name}={json.dumps(body[name])[:80]} is not supported (only {json.dumps(neutral[-1])})", name)
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise RequestError("tool_choice: only 'auto' and 'none' are supported", "tool_choice")
    if body.get("n") not in (None, 1):
        raise RequestError("n must be 1 (one completion per request)", "n")


def _wire_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI wire ``tool_calls`` (arguments as a JSON string) -> the template's (a dict)."""
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    converted = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}.tool_calls[{index}] needs function.name", f"{where}.tool_calls")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                raise RequestError(f"{where}.tool_calls[{index}].function.arguments is not JSON", f"{where}.tool_calls") from None
        converted.append({"type": "function", "id": str(call.get("id") or f"call_{index}"),
                          "function": {"name": function["name"], "arguments": arguments}})
    return converted


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages in the form chat templates render; a ``RequestError`` naming the first problem."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    converted = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object", where)
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(f"{where}.role must be system, user, assistant or tool, got {role!r}", f"{where}.role")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"{where}.content: only text parts are supported", f"{where}.content")
            content = "".join(str(p.get("text", "")) for p in content)
        if content is not None and not isinstance(content, str):
            raise RequestError(f"{where}.content must be a string", f"{where}.content")
        out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content or ""}
        if role == "assistant" and message.get("tool_calls"):
            out["tool_calls"] = _wire_calls(message["tool_calls"], where)
        if role == "tool":
            out["tool_call_id"] = str(message.get("tool_call_id", ""))
            if message.get("name"):
                out["name"] = str(message["name"])
        converted.append(out)
    return converted


def offered_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's tools (None: none offered, or ``tool_choice`` none)."""
    tools = body.get("tools") or None
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools)):
        raise RequestError("tools must be a list of {type: function, function: {name, ...}}", "tools")
    return None if body.get("tool_choice") == "none" else tools


def _number(body: dict[str, Any], name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{name} must be a number in [{low}, {high}], got {value!r}", name)
    return float(value)


@dataclass(frozen=True)
class Options:
    """What a request asks for besides its messages and tools."""

    temperature: float
    top_p: float
    #: the ``max_tokens`` the client gave (None: the endpoint's default)
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool
    logprobs: bool


def options_of(body: dict[str, Any], max_tokens_cap: int) -> Options:
    """The request's options; a ``RequestError`` naming the first bad one."""
    temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise RequestError(f"max_tokens must be a positive integer, got {limit!r}", "max_tokens")
    if limit is not None and limit > max_tokens_cap:
        raise RequestError(f"max_tokens={limit} is above this endpoint's cap of {max_tokens_cap} tokens", "max_tokens")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a string or a list of up to 4 non-empty strings", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"seed must be an integer, got {seed!r}", "seed")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage", "include_obfuscation"}:
        raise RequestError("stream_options: only include_usage is supported", "stream_options")
    if body.get("top_logprobs") not in (None, 0):
        raise RequestError("top_logprobs: only 0 is supported (the engine returns the sampled token's log-prob)", "top_logprobs")
    for flag in ("stream", "logprobs"):
        if body.get(flag) not in (None, True, False):
            raise RequestError(f"{flag} must be a boolean", flag)
    return Options(temperature, top_p, limit, tuple(stop), seed, bool(body.get("stream")),
                   bool(stream_options.get("include_usage")), bool(body.get("logprobs")))


def sampling_of(options: Options, max_new_tokens: int, end_id: int, trainer: tuple[float, float] | None) -> SamplingParams:
    """The engine's sampling for a request (``trainer``: the training session's temperature and top_p,
    which win over the client's, as does its seed stream)."""
    temperature, top_p = trainer or (options.temperature, options.top_p)
    return SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, stop_token_ids=(end_id,),
                          stop_strings=options.stop, seed=None if trainer else options.seed)


def context_exceeded(limit: int, prompt_tokens: int, asked: int | None) -> RequestError:
    """OpenAI's answer to a prompt (plus the completion asked for) longer than the context."""
    asked_text = f" ({prompt_tokens} in the messages, {asked} in the completion)" if asked else " in the messages"
    total = prompt_tokens + (asked or 0)
    return RequestError(f"This model's maximum context length is {limit} tokens. However, you requested {total} tokens"
                        f"{asked_text}. Please reduce the length of the messages or completion.",
                        "messages", 400, "invalid_request_error", "context_length_exceeded")


def logprobs_content(pieces: list[str], logprobs: list[float]) -> dict[str, Any]:
    """OpenAI's ``choices[].logprobs``: each generated token's text and log-prob (no alternatives)."""
    return {"content": [{"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8")), "top_logprobs": []}
                        for piece, logprob in zip(pieces, logprobs)]}


def wire_message(reply: dict[str, Any]) -> dict[str, Any]:
    """The assistant message (template form, arguments a dict) as OpenAI sends it (arguments a string)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply["content"] or None}
    if reply.get("tool_calls"):
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
            for c in reply["tool_calls"]
        ]
    return message


def completion(head: dict[str, Any], reply: dict[str, Any], finish: str, prompt_tokens: int, completion_tokens: int,
               logprobs: dict[str, Any] | None) -> dict[str, Any]:
    """A ``chat.completion`` (``head``: its id, created and model)."""
    return {
        "id": head["id"], "object": "chat.completion", "created": head["created"], "model": head["model"],
        "choices": [{"index": 0, "message": wire_message(reply), "finish_reason": finish, "logprobs": logprobs}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def chunk(head: dict[str, Any], delta: dict[str, Any] | None, finish: str | None = None,
          logprobs: dict[str, Any] | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``chat.completion.chunk`` (``head``: the completion's id, created and model; ``delta`` None:
    the usage-only last chunk)."""
    base = {"id": head["id"], "object": "chat.completion.chunk", "created": head["created"], "model": head["model"]}
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]
    return {**base, "choices": choices, **({"usage": usage} if usage is not None else {})}


def closing_chunks(response: dict[str, Any], streamed: str, include_usage: bool) -> list[dict[str, Any]]:
    """The chunks after the content streamed so far: the rest of the content, the calls, the finish
    (with the log-probs, when asked for), and the usage when ``stream_options.include_usage``."""
    choice = response["choices"][0]
    message = choice["message"]
    chunks = []
    content = message.get("content") or ""
    if content[len(streamed):] and content.startswith(streamed):
        chunks.append(chunk(response, {"content": content[len(streamed):]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk(response, {"tool_calls": [{"index": index, **call}]}))
    chunks.append(chunk(response, {}, choice["finish_reason"], choice.get("logprobs")))
    if include_usage:
        chunks.append(chunk(response, None, usage=response["usage"]))
    return chunks
