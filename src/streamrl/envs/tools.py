"""Native tool calls in the environment contract: the assistant message an agent sends, the tools an
environment offers, and how a call is checked and run.

An environment offers tools by decorating methods with ``@tool``. Each method's type hints and
docstring (Google style, an ``Args:`` section naming every parameter) become an OpenAI-style function
schema through transformers' ``get_json_schema``, the convention of TRL's ``environment_factory``. The
rollout renders those schemas with the model's own chat template, parses the calls the model writes
(``streamrl.policy.tool_format``) into an ``AssistantMessage``, and passes it to ``Env.step``; the
environment runs each call and answers with one ``tool`` message per call.

Nothing a model writes can crash a step: a call that could not be decoded, names an unknown tool,
has missing, unexpected or ill-typed arguments, or exceeds the calls allowed per turn is answered with a
``tool`` message naming the problem, and the turn is format-invalid with that problem's kind
(``FORMAT_PROBLEMS``). A tool that raises answers with the error; the turn is then ineffective.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: why a tool-form turn is format-invalid, as counted in metrics (``malformed/<kind>``)
FORMAT_PROBLEMS = ("unparseable_call", "unknown_tool", "bad_arguments", "too_many_calls", "no_tool_call")

_TOOL_MARK = "__streamrl_tool__"


def tool(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark an environment method as a tool the agent can call. It returns the text the agent reads
    (or a ``Step`` when the call also ends the episode, earns reward or is invalid)."""
    setattr(method, _TOOL_MARK, True)
    return method


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it: decoded (``name``, ``arguments``) or not (``error``)."""

    id: str
    name: str | None = None
    arguments: dict[str, Any] | None = None
    #: the call's text when it could not be decoded
    raw: str = ""
    #: why the call could not be decoded (invalid JSON, not an object, no name, ...)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.error is not None:
            return {"id": self.id, "raw": self.raw, "error": self.error}
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class AssistantMessage:
    """A tool-form action: the text the model wrote outside its calls, and the calls in order."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    #: the model's reasoning block (``<think>``), when its format has one
    reasoning: str | None = None

    @classmethod
    def from_parsed(cls, parsed: dict[str, Any]) -> AssistantMessage:
        """From ``ToolFormat.parse``'s dict: ``content``, ``reasoning_content`` and ``tool_calls``,
        each ``{"name", "arguments"}`` or ``{"raw", "error"}``; calls get ids ``call_0``, ``call_1``, ..."""
        calls = []
        for index, call in enumerate(parsed.get("tool_calls") or []):
            call_id = f"call_{index}"
            if call.get("error") is not None:
                calls.append(ToolCall(call_id, raw=str(call.get("raw", "")), error=str(call["error"])))
            else:
                calls.append(ToolCall(call_id, str(call["name"]), dict(call["arguments"])))
        return cls(str(parsed.get("content") or ""), tuple(calls), parsed.get("reasoning_content") or None)

    def summary(self) -> str:
        """One line for histories and logs: ``name(arguments)`` per call, else the text."""
        if not self.tool_calls:
            return self.content.strip()
        parts = []
        for call in self.tool_calls:
            arguments = call.arguments or {}
            if call.error is not None:
                parts.append(f"<unreadable call: {call.error}>")
            elif len(arguments) == 1:
                parts.append(f"{call.name}({_shown(next(iter(arguments.values())))})")
            else:
                parts.append(f"{call.name}({', '.join(f'{k}={_shown(v)}' for k, v in arguments.items())})")
        return "; ".join(parts)

    def to_openai(self) -> dict[str, Any]:
        """The message in the OpenAI chat format a chat template renders (undecodable calls stay as text)."""
        unreadable = [call.raw for call in self.tool_calls if call.error is not None]
        content = "\n".join(part for part in (self.content, *unreadable) if part)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        calls = [call for call in self.tool_calls if call.error is None]
        if calls:
            message["tool_calls"] = [
                {"type": "function", "id": call.id, "function": {"name": call.name, "arguments": call.arguments}}
                for call in calls
            ]
        return message


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class Problem:
    """Why a call (or a turn) is format-invalid: one of ``FORMAT_PROBLEMS`` and a message for the agent."""

    kind: str
    message: str


class ToolSchemaError(ValueError):
    """A tool method whose schema cannot be built (no docstring, an undocumented parameter, ...)."""


@dataclass
class Toolbox:
    """The tools of one environment instance: bound methods, their schemas and argument checks."""

    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    schemas: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, owner: object) -> Toolbox:
        """Every ``@tool`` method of ``owner``'s class, in definition order (base classes first)."""
        box = cls()
        names: list[str] = []
        for klass in reversed(type(owner).__mro__):
            names += [name for name, member in vars(klass).items() if getattr(member, _TOOL_MARK, False) and name not in names]
        for name in names:
            method = getattr(owner, name)
            box.functions[name] = method
            box.schemas.append(tool_schema(method, owner_name=type(owner).__name__))
        return box

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def problem(self, call: ToolCall) -> Problem | None:
        """Why ``call`` cannot run, or None."""
        if call.error is not None:
            return Problem("unparseable_call", f"the tool call could not be read: {call.error}")
        if call.name not in self.functions:
            return Problem("unknown_tool", f"unknown tool {call.name!r}; the tools are {', '.join(self.names)}")
        schema = self.schemas[self.names.index(call.name)]["function"]["parameters"]
        message = argument_problem(call.arguments or {}, schema)
        return Problem("bad_arguments", f"{call.name}: {message}") if message else None


def tool_schema(method: Callable[..., Any], owner_name: str = "") -> dict[str, Any]:
    """The OpenAI function schema of ``method`` (transformers' ``get_json_schema``), or a
    ``ToolSchemaError`` naming the method and what its docstring lacks."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(method)
    except Exception as error:  # transformers raises several exception types for a bad docstring
        where = f"{owner_name}.{method.__name__}" if owner_name else method.__name__
        raise ToolSchemaError(
            f"tool {where}: cannot build its schema ({' '.join(str(error).split())}); a tool needs type hints "
            "and a docstring with an Args: section describing every parameter"
        ) from None


def argument_problem(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the JSON schema ``parameters`` (one line), or None."""
    import jsonschema

    known = parameters.get("properties", {})
    unexpected = sorted(set(arguments) - set(known))
    if unexpected:
        return f"unexpected argument {unexpected[0]!r} (takes: {', '.join(known) or 'nothing'})"
    missing = [name for name in parameters.get("required", []) if name not in arguments]
    if missing:
        return f"missing argument {missing[0]!r}"
    for error in sorted(jsonschema.Draft202012Validator(parameters).iter_errors(arguments), key=lambda e: list(e.path)):
        where = ".".join(str(part) for part in error.path) or "arguments"
        return f"argument {where}: {error.message}"
    return None
