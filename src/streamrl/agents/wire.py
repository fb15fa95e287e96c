"""The OpenAI chat-completions wire format: a request's messages in the form chat templates render,
a completion as server-sent chunks, and the error a bad request gets."""

import json
from typing import Any


class RequestError(Exception):
    """A bad request: its status and the OpenAI error fields."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


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
                raise RequestError(
                    f"{where}.tool_calls[{index}].function.arguments is not JSON", f"{where}.tool_calls"
                ) from None
        converted.append(
            {
                "type": "function",
                "id": str(call.get("id") or f"call_{index}"),
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
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
            content = "".join(p.get("text", "") for p in content)
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


def stream_chunks(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion as ``chat.completion.chunk`` events: the role, the content, the calls, the finish."""
    choice = response["choices"][0]
    message = choice["message"]
    base = {
        "id": response["id"],
        "object": "chat.completion.chunk",
        "created": response["created"],
        "model": response["model"],
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        chunks.append(chunk({"content": message["content"]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    return chunks
