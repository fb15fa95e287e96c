"""Finding the code a model turn asks to run.

Three syntaxes are read (environments.md 2.1):

* a fenced block, ```` ```python ... ``` ```` (``py``/``python3`` too), optionally wrapped in
  ``<code>...</code>`` (ReTool); a missing closing fence runs to the end of the turn, and a
  ToRA-style trailing ```` ```output ```` stop string is ignored;
* bare ``<code>...</code>`` without a fence;
* a Hermes tool call, ``<tool_call>{"name": "code_interpreter", "arguments": {"code": "..."}}</tool_call>``,
  whose JSON may hold raw newlines inside the code string, and whose ``arguments`` may be an
  object or a JSON-encoded string (OpenAI style).

When a turn holds several blocks, only the last one runs (ToRA and slime do the same).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

Syntax = Literal["fenced", "code_tag", "tool_call"]
#: tool names a Hermes call may use for the Python tool
PYTHON_TOOL_NAMES = frozenset(
    {"code_interpreter", "python", "python_interpreter", "run_python", "execute_python", "ipython"}
)

_FENCED = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(?P<code>.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_CODE_TAG = re.compile(r"<code>(?P<code>.*?)(?:</code>|\Z)", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(?P<body>.*?)(?:</tool_call>|\Z)", re.DOTALL)
_CODE_FIELD = re.compile(r'"code"\s*:\s*"(?P<text>(?:[^"\\]|\\.)*)"', re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    code: str
    syntax: Syntax
    start: int  # character offset of the block in the turn


@dataclass(frozen=True)
class BadToolCall:
    """A tool call that was recognised but could not be decoded."""

    reason: str
    start: int


def _decode_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments, strict=False)
        except ValueError:
            return None
    return arguments


def _decode_tool_call(body: str, start: int) -> ToolCall | BadToolCall:
    text = body.strip()
    try:
        call = json.loads(text, strict=False)  # strict=False: raw newlines inside strings
    except ValueError:
        loose = _CODE_FIELD.search(text)  # a truncated or sloppy object: take the code field
        if loose is None:
            return BadToolCall("the <tool_call> body is not valid JSON", start)
        try:
            return ToolCall(json.loads(f'"{loose.group("text")}"', strict=False), "tool_call", start)
        except ValueError:
            return BadToolCall("the code string in <tool_call> is not valid JSON", start)
    if not isinstance(call, dict):
        return BadToolCall("the <tool_call> body must be a JSON object", start)
    name = call.get("name")
    if name is not None and name not in PYTHON_TOOL_NAMES:
        return BadToolCall(f"unknown tool {name!r}; the only tool is 'code_interpreter'", start)
    arguments = _decode_arguments(call.get("arguments", call.get("parameters")))
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str):
        return BadToolCall('the tool call needs "arguments": {"code": "<python source>"}', start)
    return ToolCall(code, "tool_call", start)


def find_tool_calls(text: str) -> list[ToolCall | BadToolCall]:
    """Every code block and tool call in ``text``, in order of appearance."""
    found: list[ToolCall | BadToolCall] = []
    fenced_spans = []
    for match in _FENCED.finditer(text):
        found.append(ToolCall(match.group("code"), "fenced", match.start()))
        fenced_spans.append(match.span())
    for match in _CODE_TAG.finditer(text):
        inner = match.group("code")
        if "```" in inner or any(s <= match.start("code") < e for s, e in fenced_spans):
            continue  # <code>```python ...```</code>: the fenced block already counts
        if inner.strip():
            found.append(ToolCall(inner.strip("\n"), "code_tag", match.start()))
    for match in _TOOL_CALL.finditer(text):
        found.append(_decode_tool_call(match.group("body"), match.start()))
    return sorted(found, key=lambda call: call.start)


def last_tool_call(text: str) -> ToolCall | BadToolCall | None:
    """The block that runs: the last one in the turn (None when the turn has none)."""
    calls = find_tool_calls(text)
    return calls[-1] if calls else None
