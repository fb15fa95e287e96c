"""math_tir tool-call parsing and result formatting (environments.md section 6, math_tir items 1-2)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.envs.math_tir.formatting import (
    MAX_RESULT_CHARS,
    NO_OUTPUT,
    describe_execution,
    format_tool_result,
    truncate_middle,
)
from streamrl.envs.math_tir.prompts import MathActionParser
from streamrl.envs.math_tir.tools import BadToolCall, ToolCall, find_tool_calls, last_tool_call
from streamrl.sandbox import SandboxResult


def _code(text: str) -> str:
    call = last_tool_call(text)
    assert isinstance(call, ToolCall), call
    return call.code


def test_fenced_python_block():
    assert _code("Compute it.\n```python\nprint(2 + 2)\n```\nDone.") == "print(2 + 2)\n"
    assert _code("```py\nx = 1\n```") == "x = 1\n"
    assert _code("```Python3\nx = 2\n```") == "x = 2\n"


def test_only_the_last_of_several_blocks_runs():
    turn = "```python\nfirst()\n```\nthen\n```python\nsecond()\n```\nand\n```python\nthird()\n```"
    assert [c.code for c in find_tool_calls(turn)] == ["first()\n", "second()\n", "third()\n"]
    assert _code(turn) == "third()\n"


def test_code_tag_wrapping_and_bare_code_tag():
    assert _code("<code>```python\nprint('wrapped')\n```</code>") == "print('wrapped')\n"
    assert len(find_tool_calls("<code>```python\nprint('wrapped')\n```</code>")) == 1
    assert _code("<code>print('bare')</code>") == "print('bare')"


def test_missing_closing_fence_runs_to_the_end_and_tora_stop_string_is_ignored():
    assert _code("Let me check.\n```python\nimport math\nprint(math.pi)") == "import math\nprint(math.pi)"
    assert _code("```python\nprint(1)\n```output") == "print(1)\n"


def test_non_python_fences_are_not_code():
    assert last_tool_call("```output\n42\n```") is None
    assert last_tool_call("```\nplain text\n```") is None
    assert last_tool_call("no code at all, \\boxed{3}") is None


def test_hermes_tool_call_with_raw_newlines_in_the_code_string():
    turn = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "x = 6\nprint(x * 7)"}}</tool_call>'
    assert _code(turn) == "x = 6\nprint(x * 7)"


def test_hermes_tool_call_variants():
    as_string = json.dumps({"name": "python", "arguments": json.dumps({"code": "print(1)"})})
    assert _code(f"<tool_call>{as_string}</tool_call>") == "print(1)"
    unclosed = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(3)"}}'
    assert _code(unclosed) == "print(3)"
    truncated = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(\\"hi\\")\nx = 1"'
    assert _code(truncated) == 'print("hi")\nx = 1'


def test_undecodable_or_foreign_tool_calls_are_reported_not_run():
    for turn, reason in [
        ("<tool_call>not json</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>', "unknown tool"),
        ('<tool_call>{"name": "code_interpreter", "arguments": {"script": "1"}}</tool_call>', '"code"'),
        ("<tool_call>[1, 2]</tool_call>", "JSON object"),
    ]:
        call = last_tool_call(turn)
        assert isinstance(call, BadToolCall) and reason in call.reason


def test_mixed_syntaxes_pick_the_last_by_position():
    turn = '```python\na()\n```\n<tool_call>{"arguments": {"code": "b()"}}</tool_call>\n<code>c()</code>'
    assert [c.syntax for c in find_tool_calls(turn)] == ["fenced", "tool_call", "code_tag"]
    assert _code(turn) == "c()"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_parsing_never_raises_on_arbitrary_text(text):
    find_tool_calls(text)
    parsed = MathActionParser().parse(text)
    assert parsed.action == text


def test_action_parser_validity():
    parser = MathActionParser()
    assert parser.parse("```python\nprint(1)\n```").format_valid
    assert parser.parse("So the answer is \\boxed{42}.").format_valid
    missing = parser.parse("I think it is 42.")
    assert not missing.format_valid and "boxed" in missing.reason
    broken = parser.parse("<tool_call>{oops</tool_call>")
    assert not broken.format_valid and "JSON" in broken.reason


# ----------------------------------------------------------------------------- formatting
def _result(status="ok", stdout="", error=None, state_reset=False) -> SandboxResult:
    return SandboxResult(status, stdout, "", 0, 0.01, "process", error=error, state_reset=state_reset)


def test_result_wrappers():
    ok = _result(stdout="4\n")
    assert format_tool_result(ok) == "<interpreter>\n4\n</interpreter>"
    assert format_tool_result(ok, "output") == "```output\n4\n```"
    assert format_tool_result(_result()) == f"<interpreter>\n{NO_OUTPUT}\n</interpreter>"


def test_errors_show_printed_output_then_only_the_last_traceback_line():
    failed = _result("error", stdout="partial\n", error="ZeroDivisionError: division by zero")
    assert describe_execution(failed) == "partial\nZeroDivisionError: division by zero"
    reset = _result("timeout", error="TimeoutError: execution exceeded the 5 s time limit", state_reset=True)
    text = describe_execution(reset)
    assert text.startswith("TimeoutError") and "[state reset]" in text


def test_long_output_is_cut_to_2000_characters_with_a_marker():
    long = _result(stdout="".join(f"line {i}\n" for i in range(5000)))
    shown = format_tool_result(long)
    body = shown.removeprefix("<interpreter>\n").removesuffix("\n</interpreter>")
    assert len(body) <= MAX_RESULT_CHARS
    assert "chars truncated]" in body
    assert body.startswith("line 0\n") and body.rstrip().endswith("line 4999")


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=6000), st.integers(min_value=40, max_value=3000))
def test_truncate_middle_bounds_and_keeps_both_ends(text, limit):
    cut = truncate_middle(text, limit)
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
    else:
        assert "chars truncated]" in cut
        head = cut.split("\n...[")[0]
        assert text.startswith(head)
        marker_n = int(cut.split("\n...[")[1].split(" chars")[0])
        assert len(text) - marker_n == len(cut) - len(f"\n...[{marker_n} chars truncated]...\n")
