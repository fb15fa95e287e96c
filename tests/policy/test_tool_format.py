"""Tool-call formats: parsing table, never raising, and the automatic choice of a format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.policy import ChatTemplateError
from streamrl.policy.scripted import CharCodec
from streamrl.policy.tool_format import FORMATS, ToolFormat, resolve_tool_format

from .tool_templates import (
    LLAMA31_LIKE,
    LLAMA31_SPECIALS,
    QWEN3_LIKE,
    QWEN25_LIKE,
    SMOLLM2_OWN_TEMPLATE,
    TINY_TEMPLATE_BEFORE_TOOLS,
    tiny_tokenizer_with,
)

GO = {"name": "act", "arguments": {"command": "go to desk 1"}}
LOOK = {"name": "look", "arguments": {}}
CALL_GO = '<tool_call>\n{"name": "act", "arguments": {"command": "go to desk 1"}}\n</tool_call>'
CALL_LOOK = '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>'


def error(raw: str, reason: str) -> dict:
    return {"raw": raw, "error": reason}


# (format, text, content, reasoning, calls); an error entry's reason is matched as a prefix
TABLE = [
    ("hermes", CALL_GO, "", None, [GO]),
    ("hermes", f"{CALL_GO}\n{CALL_LOOK}", "", None, [GO, LOOK]),
    ("hermes", f"I will go to the desk.\n{CALL_GO}", "I will go to the desk.", None, [GO]),
    (
        "hermes",
        f'{CALL_GO}\n<tool_call>\n{{"name": "look", "arguments": {{bad}}}}\n</tool_call>',
        "",
        None,
        [GO, error('{"name": "look", "arguments": {bad}}', "the call is not valid JSON")],
    ),
    ("hermes", "<tool_call>[1, 2]</tool_call>", "", None, [error("[1, 2]", "the call is a JSON array, not an object")]),
    ("hermes", '<tool_call>"go"</tool_call>', "", None, [error('"go"', "the call is a JSON string, not an object")]),
    (
        "hermes",
        '<tool_call>{"arguments": {"command": "look"}}</tool_call>',
        "",
        None,
        [error('{"arguments": {"command": "look"}}', 'the call has no string "name"')],
    ),
    ("hermes", '<tool_call>{"name": 3, "arguments": {}}</tool_call>', "", None, [error('{"name": 3, "arguments": {}}', 'the call has no string "name"')]),
    (
        "hermes",
        '<tool_call>{"name": "act", "arguments": "{\\"command\\": \\"go to desk 1\\"}"}</tool_call>',
        "",
        None,
        [GO],
    ),
    (
        "hermes",
        '<tool_call>{"name": "act", "arguments": "go"}</tool_call>',
        "",
        None,
        [error('{"name": "act", "arguments": "go"}', '"arguments" is a string that is not JSON')],
    ),
    (
        "hermes",
        '<tool_call>{"name": "act", "arguments": [1]}</tool_call>',
        "",
        None,
        [error('{"name": "act", "arguments": [1]}', '"arguments" is a JSON array, not an object')],
    ),
    # ill-typed arguments are not coerced: the environment's validation sees them as written
    ("hermes", '<tool_call>{"name": "wait", "arguments": {"steps": "3"}}</tool_call>', "", None, [{"name": "wait", "arguments": {"steps": "3"}}]),
    ("hermes", '<tool_call>{"name": "look"}</tool_call>', "", None, [LOOK]),
    # cut by max_new_tokens: an error entry, also when what was written happens to be complete JSON
    ("hermes", f'{CALL_GO}\n<tool_call>\n{{"name": "look", "argu', "", None, [GO, error('{"name": "look", "argu', "the call was cut off")]),
    ("hermes", '<tool_call>\n{"name": "look", "arguments": {}}', "", None, [error('{"name": "look", "arguments": {}}', "the call was cut off")]),
    ("hermes", "I am done. <action>look</action>", "I am done. <action>look</action>", None, []),
    ("hermes", "", "", None, []),
    ("hermes", "<think>hm</think>go", "<think>hm</think>go", None, []),  # hermes has no reasoning field
    ("qwen3", f"<think>\nThe desk is near.\n</think>\n\n{CALL_GO}", "", "The desk is near.", [GO]),
    ("qwen3", f"<think>\n\n</think>\n\nGoing.\n{CALL_GO}", "Going.", None, [GO]),
    ("qwen3", "<think>\nstill thinking", "", "still thinking", []),
    ("qwen3", "No reasoning, no call.", "No reasoning, no call.", None, []),
    ("llama3_json", '{"name": "act", "parameters": {"command": "go to desk 1"}}', "", None, [GO]),
    ("llama3_json", '<|python_tag|>{"name": "act", "parameters": {"command": "go to desk 1"}}', "", None, [GO]),
    ("llama3_json", ' {"name": "act", "arguments": {"command": "go to desk 1"}}', "", None, [GO]),
    ("llama3_json", "The desk is to the left.", "The desk is to the left.", None, []),
    ("llama3_json", "Use {braces} later.", "Use {braces} later.", None, []),
    ("llama3_json", '{"name": "act", "parameters": {"comm', "", None, [error('{"name": "act", "parameters": {"comm', "the call is not valid JSON")]),
    ("llama3_json", "<|python_tag|>print(1)", "", None, [error("print(1)", "the call is not valid JSON")]),
]


@pytest.mark.parametrize(("name", "text", "content", "reasoning", "calls"), TABLE)
def test_parse_table(name, text, content, reasoning, calls):
    parsed = FORMATS[name].parse(text)
    assert set(parsed) == {"content", "reasoning_content", "tool_calls"}
    assert parsed["content"] == content
    assert parsed["reasoning_content"] == reasoning
    assert len(parsed["tool_calls"]) == len(calls)
    for got, want in zip(parsed["tool_calls"], calls):
        if "error" in want:
            assert set(got) == {"raw", "error"} and got["raw"] == want["raw"]
            assert got["error"].startswith(want["error"]) and "\n" not in got["error"]
        else:
            assert got == want


ALPHABET = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>", "{", "}", "[", "]", '"', ":", ",", "\n", " ",
     '"name"', '"arguments"', '"parameters"', "act", "1", "null", "\\", "<", ">", "\x01", "\x02", "é"]
)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.one_of(ALPHABET, st.text(max_size=6)), max_size=25), name=st.sampled_from(sorted(FORMATS)))
def test_parse_never_raises(pieces, name):
    parsed = FORMATS[name].parse("".join(pieces))
    assert isinstance(parsed["content"], str)
    assert parsed["reasoning_content"] is None or isinstance(parsed["reasoning_content"], str)
    for call in parsed["tool_calls"]:
        if "error" in call:
            assert set(call) == {"raw", "error"} and isinstance(call["raw"], str)
            assert "response parser failed" not in call["error"]  # the library path handled it
        else:
            assert set(call) == {"name", "arguments"}
            assert isinstance(call["name"], str) and isinstance(call["arguments"], dict)


def test_a_broken_response_template_does_not_raise():
    broken = ToolFormat("broken", {"start_anchor": "x", "fields": {"content": {"content": "nonsense"}}})
    parsed = broken.parse("hello")
    assert parsed["content"] == "hello" and parsed["tool_calls"][0]["error"].startswith("the broken response parser failed")


# -- choosing a format -----------------------------------------------------------------------------


def test_auto_picks_hermes_for_the_tiny_tokenizer():
    tool_format, why = resolve_tool_format(tiny_tokenizer_with())
    assert tool_format is FORMATS["hermes"]
    assert why == "tool format: hermes (the chat template writes <tool_call>)"


def test_auto_picks_hermes_for_the_shipped_smollm2_template():
    from streamrl.policy.loading import read_chat_template

    assert resolve_tool_format(tiny_tokenizer_with(read_chat_template("smollm2")))[0].name == "hermes"
    assert resolve_tool_format(tiny_tokenizer_with(QWEN25_LIKE))[0].name == "hermes"


def test_auto_picks_qwen3_and_llama3_json():
    assert resolve_tool_format(tiny_tokenizer_with(QWEN3_LIKE))[0].name == "qwen3"
    tool_format, why = resolve_tool_format(tiny_tokenizer_with(LLAMA31_LIKE, LLAMA31_SPECIALS))
    assert tool_format.name == "llama3_json" and "llama3_json" in why


@pytest.mark.parametrize("template", [TINY_TEMPLATE_BEFORE_TOOLS, SMOLLM2_OWN_TEMPLATE])
def test_auto_refuses_a_template_without_tools(template):
    with pytest.raises(ChatTemplateError, match="renders no tools; set model.chat_template .* or model.tool_format"):
        resolve_tool_format(tiny_tokenizer_with(template))


def test_explicit_names():
    tokenizer = tiny_tokenizer_with(TINY_TEMPLATE_BEFORE_TOOLS)
    tool_format, why = resolve_tool_format(tokenizer, "llama3_json")
    assert tool_format is FORMATS["llama3_json"] and why == "tool format: llama3_json (set explicitly)"
    with pytest.raises(ValueError, match="unknown tool format 'mistral'; known: auto, hermes, qwen3, llama3_json"):
        resolve_tool_format(tokenizer, "mistral")


def test_auto_prefers_the_tokenizers_own_response_template():
    tokenizer = tiny_tokenizer_with(TINY_TEMPLATE_BEFORE_TOOLS)
    # a template in transformers' style: each call wrapped as {"type": "function", "function": ...}
    tokenizer.response_template = {
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "tool_calls": {
                "open": "<call>",
                "close": "</call>",
                "repeats": True,
                "content": "json",
                "content_args": {"allow_non_json": True},
                "transform": {"type": "function", "function": "{content}"},
            },
            "content": {"content": "text"},
        },
    }
    tool_format, why = resolve_tool_format(tokenizer)
    assert tool_format.name == "tokenizer" and "own response_template" in why
    parsed = tool_format.parse('go <call>{"name": "act", "arguments": {"command": "go to desk 1"}}</call><call>oops</call>')
    assert parsed["tool_calls"] == [GO, {"raw": "oops", "error": parsed["tool_calls"][1]["error"]}]
    assert parsed["tool_calls"][1]["error"].startswith("the call is not valid JSON")
    tokenizer.response_template = {"fields": {}}
    with pytest.raises(ChatTemplateError, match="response_template is invalid"):
        resolve_tool_format(tokenizer)


def test_auto_reads_a_codec_or_a_policy():
    assert resolve_tool_format(CharCodec()) == (FORMATS["hermes"], "tool format: hermes (declared by CharCodec)")

    class PolicyLike:
        tokenizer = tiny_tokenizer_with(QWEN3_LIKE)

    assert resolve_tool_format(PolicyLike())[0].name == "qwen3"
