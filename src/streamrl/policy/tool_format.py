"""Tool-call formats: how a model writes tool calls in its reply, and how to read them back.

A format is a declarative ``response_template`` for transformers' response parser
(``transformers.utils.chat_parsing``) plus streamrl's checks on each call. Parsing never raises and
never coerces: a call comes back either decoded, ``{"name": str, "arguments": dict}``, or as
``{"raw": <the call's text>, "error": <one-line reason>}``, so an environment sees every call the
model tried to make, ill-typed arguments included, and can charge for the malformed ones.

Shipped formats, written from the formats' published descriptions:

* ``hermes`` (Hermes 2 Pro, Qwen2.5, and streamrl's own tiny and SmolLM2 templates): zero or more
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks; the text outside them
  is the content.
* ``qwen3``: ``hermes`` plus a ``<think>...</think>`` block, read into ``reasoning_content``.
* ``llama3_json`` (Llama 3.1 / 3.2 JSON tool calling): the whole reply is one JSON object
  ``{"name": ..., "parameters": {...}}`` (``"arguments"`` is accepted too), optionally after
  ``<|python_tag|>``; a reply that starts with neither ``{`` nor ``<|python_tag|>`` is content.

``resolve_tool_format`` picks one for a tokenizer: its own ``response_template`` when it has one,
else from the markup its chat template writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from streamrl.policy.errors import ChatTemplateError

#: a call's body is read by the library's JSON parser; text that is not JSON survives as a string
_JSON_CALL = {"content": "json", "content_args": {"allow_non_json": True}}
#: text outside every explicit region, kept verbatim and concatenated (stripped once at the end)
_CONTENT = {"content": "text", "content_args": {"strip": False}, "repeats": True, "join": ""}

HERMES_TEMPLATE: dict[str, Any] = {
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "repeats": True, **_JSON_CALL},
        "content": dict(_CONTENT),
    },
}

QWEN3_TEMPLATE: dict[str, Any] = {
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text", "repeats": True, "join": "\n"},
        "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "repeats": True, **_JSON_CALL},
        "content": dict(_CONTENT),
    },
}

LLAMA3_JSON_TEMPLATE: dict[str, Any] = {
    "start_anchor": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "fields": {
        # only at the very start of the reply: <|python_tag|>, or the "{" of a JSON object (not consumed);
        # the call then runs to the end of the reply
        "tool_calls": {"open_pattern": r"^\s*(?:<\|python_tag\|>|(?=\{))", "repeats": True, **_JSON_CALL},
        "content": dict(_CONTENT),
    },
}

#: the field names streamrl reads from a response template's output
_CALLS, _CONTENT_FIELD, _REASONING = "tool_calls", "content", "reasoning_content"


@dataclass(frozen=True)
class ToolFormat:
    """A named tool-call format: ``parse`` turns a reply's text into content, reasoning and calls."""

    name: str
    response_template: dict = field(repr=False)

    def parse(self, text: str) -> dict[str, Any]:
        """``{"content": str, "reasoning_content": str | None, "tool_calls": [call, ...]}``.

        ``text`` is the decoded generation (special tokens skipped). Each call is
        ``{"name": str, "arguments": dict}`` when it decoded, else ``{"raw": str, "error": str}``;
        a final call cut off before its closing tag is always an error entry. Never raises.
        """
        text = text if isinstance(text, str) else str(text)
        try:
            return _parse(self.response_template, text)
        except Exception as exc:  # a tokenizer's own template can do anything; streamrl's are tested
            reason = _one_line(f"the {self.name} response parser failed: {type(exc).__name__}: {exc}")
            return {"content": text.strip(), "reasoning_content": None, "tool_calls": [{"raw": text, "error": reason}]}


FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", HERMES_TEMPLATE),
    "qwen3": ToolFormat("qwen3", QWEN3_TEMPLATE),
    "llama3_json": ToolFormat("llama3_json", LLAMA3_JSON_TEMPLATE),
}


def tool_format_of(codec: Any) -> ToolFormat:
    """The tool format a codec writes: a ``Policy``'s, resolved once from ``model.tool_format``
    (``Policy.tool_format``), else (a test's ``CharCodec``) the one it declares."""
    resolved = getattr(codec, "tool_format", None)
    return resolved if isinstance(resolved, ToolFormat) else resolve_tool_format(codec)[0]


def resolve_tool_format(tokenizer: Any, requested: str = "auto") -> tuple[ToolFormat, str]:
    """The tool format for ``tokenizer`` and a one-line explanation of the choice.

    ``requested`` is a name from ``FORMATS`` or ``"auto"``. ``auto`` takes, in order: the
    tokenizer's own ``response_template`` (a format named ``"tokenizer"``); the ``tool_format`` a
    codec declares (``CharCodec``); the markup the chat template writes (``<tool_call>`` with
    ``<think>``: qwen3, ``<tool_call>``: hermes, ``<|python_tag|>`` or an ``ipython`` role:
    llama3_json). ``tokenizer`` may also be a ``Policy`` (its ``tokenizer`` is used).
    """
    if requested != "auto":
        if requested not in FORMATS:
            raise ValueError(f"unknown tool format {requested!r}; known: auto, {', '.join(FORMATS)}")
        return FORMATS[requested], f"tool format: {requested} (set explicitly)"
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    own = getattr(tokenizer, "response_template", None)
    if isinstance(own, dict) and own:
        from transformers.utils.chat_parsing.response_templates import load_response_template

        try:
            load_response_template(own)
        except (ValueError, TypeError) as exc:
            raise ChatTemplateError(f"the tokenizer's own response_template is invalid: {_one_line(str(exc))}") from exc
        return ToolFormat("tokenizer", own), "tool format: tokenizer (the tokenizer ships its own response_template)"
    declared = getattr(tokenizer, "tool_format", None)
    if isinstance(declared, str) and declared in FORMATS:
        return FORMATS[declared], f"tool format: {declared} (declared by {type(tokenizer).__name__})"
    template = _template_text(tokenizer)
    if "<tool_call>" in template and "<think>" in template:
        return FORMATS["qwen3"], "tool format: qwen3 (the chat template writes <tool_call> and <think>)"
    if "<tool_call>" in template:
        return FORMATS["hermes"], "tool format: hermes (the chat template writes <tool_call>)"
    if "<|python_tag|>" in template or "ipython" in template:
        why = "tool format: llama3_json (the chat template writes <|python_tag|> or an ipython role)"
        return FORMATS["llama3_json"], why
    raise ChatTemplateError(
        "the chat template of this tokenizer renders no tools; set model.chat_template to a tool-capable "
        f"template or model.tool_format explicitly (one of: {', '.join(FORMATS)})"
    )


# -- parsing -------------------------------------------------------------------------------------


def _parse(template: dict, text: str) -> dict[str, Any]:
    from transformers.utils.chat_parsing import ResponseParser
    from transformers.utils.chat_parsing.response_templates import load_response_template

    spec = load_response_template(template)
    parser = ResponseParser(spec, prefix="")
    bodies: list[str] = []  # the text of each call, as the model wrote it
    # after feeding the whole text (before the end of the stream is declared), a region still open
    # is one whose closing delimiter never came
    still_open = _collect(parser.feed(text), bodies, None)
    message, final_events = parser.finalize()
    _collect(final_events, bodies, still_open)
    calls_field = spec.fields.get(_CALLS)
    cut_off = still_open == _CALLS and calls_field is not None and calls_field.close_re is not None

    raw_calls = message.get(_CALLS) or []
    if not isinstance(raw_calls, list):
        raw_calls = [raw_calls]
    if len(bodies) != len(raw_calls):  # a template whose calls field is not one region per call
        bodies = [_dump(entry) for entry in raw_calls]
    calls = [_check_call(entry, body.strip()) for entry, body in zip(raw_calls, bodies)]
    if cut_off and calls:
        calls[-1] = {"raw": bodies[-1].strip(), "error": "the call was cut off before its closing tag"}
    content = message.get(_CONTENT_FIELD)
    reasoning = message.get(_REASONING)
    return {
        "content": content.strip() if isinstance(content, str) else ("" if content is None else _dump(content)),
        "reasoning_content": reasoning.strip() if isinstance(reasoning, str) and reasoning.strip() else None,
        "tool_calls": calls,
    }


def _collect(events: list[dict], bodies: list[str], open_field: str | None) -> str | None:
    """Append each call's text to ``bodies``; return the field left open after ``events``."""
    for event in events:
        if event["type"] == "region_open":
            open_field = event["field"]
            if open_field == _CALLS:
                bodies.append("")
        elif event["type"] == "region_chunk" and event["field"] == _CALLS and bodies:
            bodies[-1] += event["text"]
        elif event["type"] == "region_close":
            open_field = None
    return open_field


def _check_call(entry: Any, raw: str) -> dict[str, Any]:
    """One parsed call (``raw``: its text) -> ``{"name", "arguments"}`` or ``{"raw", "error"}``."""
    body = entry
    # the shape transformers' own templates produce: {"type": "function", "function": <body>}
    if isinstance(body, dict) and "name" not in body and "function" in body:
        body = body["function"]
    if isinstance(body, str):
        try:
            json.loads(raw)
        except json.JSONDecodeError as exc:
            return {"raw": raw, "error": _one_line(f"the call is not valid JSON ({exc})")}
        return {"raw": raw, "error": "the call is a JSON string, not an object"}
    if not isinstance(body, dict):
        return {"raw": raw, "error": f"the call is a JSON {_json_type(body)}, not an object"}
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        return {"raw": raw, "error": "the call has no string \"name\""}
    key = "arguments" if "arguments" in body else "parameters" if "parameters" in body else None
    arguments = body[key] if key else {}
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return {"raw": raw, "error": f"\"{key}\" is a string that is not JSON"}
    if not isinstance(arguments, dict):
        return {"raw": raw, "error": f"\"{key}\" is a JSON {_json_type(arguments)}, not an object"}
    return {"name": name, "arguments": arguments}


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates ("default", "tool_use", ...)
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else ""


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _dump(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _one_line(text: str) -> str:
    return " ".join(text.split())
