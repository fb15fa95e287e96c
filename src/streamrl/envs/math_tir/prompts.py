"""The model-facing side of math_tir: tool instructions, prompt layouts and the action parser."""

from __future__ import annotations

from typing import Any, Literal

from streamrl.envs.base import ActionParser, ParsedAction, PromptBuilder
from streamrl.envs.math_tir.formatting import RESULT_FORMATS, ResultFormat
from streamrl.envs.math_tir.grading import extract_boxed
from streamrl.envs.math_tir.tools import BadToolCall, last_tool_call

PromptStyle = Literal["full", "compact"]

FORMAT_HINT = (
    "Your message had no ```python code block and no final \\boxed{} answer. "
    "To run code, put it in a ```python block; to finish, write the final answer as \\boxed{...}."
)
#: the tool form's: a turn without a call is read as the answer
TOOL_FORMAT_HINT = (
    "Your message had no tool call and no final \\boxed{} answer. "
    "To run code, call the python tool; to finish, reply without a call and write the answer as \\boxed{...}."
)
#: how the per-step layout shows an empty model turn (chat templates reject empty messages)
EMPTY_TURN = "(empty reply)"
_RESULT_TAGS = {"interpreter": "<interpreter></interpreter> tags", "output": "a ```output block"}


def tool_instructions(
    *, session: bool, max_tool_calls: int, result_format: ResultFormat, style: PromptStyle, tools: bool = False
) -> str:
    """How to use the Python tool and how to answer, for a system prompt or an observation.
    ``tools``: the tool form (a ``python`` tool call instead of a code block)."""
    if result_format not in RESULT_FORMATS:
        raise ValueError(f"unknown math_tir result_format {result_format!r}; choose one of {RESULT_FORMATS}")
    if style == "compact":
        if tools:
            return "Call the python tool for calculations and read its output. Finish, without a call, with \\boxed{answer}."
        return "Use ```python code``` blocks for calculations and read their output. Finish with \\boxed{answer}."
    if style != "full":
        raise ValueError(f"unknown math_tir prompt style {style!r}; choose 'full' or 'compact'")
    state = (
        "Variables persist from one code block to the next."
        if session
        else "Each block runs in a fresh interpreter, so define every variable you use in the same block."
    )
    if tools:
        how = (
            "Solve the problem step by step. For any calculation, call the python tool with your code: it runs "
            f"in a sandbox and returns what it prints. {state.replace('block', 'call')} print() what you need (a "
            f"final bare expression is echoed too). You can run code at most {max_tool_calls} times.\n"
            "When you know the answer, reply without a tool call and end with: Answer: \\boxed{...}\n"
        )
    else:
        how = (
            "Solve the problem step by step. For any calculation, write Python code in a fenced block:\n"
            "```python\nprint(...)\n```\n"
            f"The code runs in a sandbox and its output comes back in {_RESULT_TAGS[result_format]}. {state} "
            "Only the last code block of a message runs; print() what you need (a final bare expression is "
            f"echoed too). You can run code at most {max_tool_calls} times.\n"
            "When you know the answer, reply without code and end with: Answer: \\boxed{...}\n"
        )
    return how + (
        "Give the answer exactly as the question asks: round as stated, leave out units and "
        "currency signs, and write an ordered triple as (x, y, z)."
    )


class MathActionParser(ActionParser):
    """A turn is format-valid when it holds a decodable code block/tool call or a boxed answer.
    The action is the whole turn: the environment finds the code or the answer itself."""

    def parse(self, text: str) -> ParsedAction:
        if not isinstance(text, str):
            return ParsedAction("", False, f"a model turn must be text, got {type(text).__name__}")
        call = last_tool_call(text)
        if isinstance(call, BadToolCall):
            return ParsedAction(text, False, call.reason)
        if call is not None or extract_boxed(text) is not None:
            return ParsedAction(text, True)
        return ParsedAction(text, False, "no code block, tool call or \\boxed{} answer")


class MathPromptBuilder(PromptBuilder):
    """System prompt with the tool instructions; the first user message is the bare problem;
    later ones are the interpreter results. ``history_length`` (None: all) bounds the per-step layout."""

    def __init__(
        self,
        style: PromptStyle = "full",
        session: bool = False,
        max_tool_calls: int = 4,
        result_format: ResultFormat = "interpreter",
        history_length: int | None = None,
        tools: bool = False,
    ):
        if history_length is not None and (not isinstance(history_length, int) or history_length < 0):
            raise ValueError(f"math_tir history_length must be a non-negative int or None, got {history_length!r}")
        self._system = tool_instructions(
            session=session, max_tool_calls=max_tool_calls, result_format=result_format, style=style, tools=tools
        )
        self.history_length = history_length

    def system_prompt(self) -> str:
        return self._system

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        return str(info.get("question") or observation)

    def next_message(self, observation: str, info: dict[str, Any]) -> str:
        return observation

    def step_messages(self, initial_observation, history, observation, info) -> list[dict[str, str]]:
        first = max(0, len(history) - self.history_length) if self.history_length is not None else 0
        problem = self.first_message(initial_observation, info)
        if first:
            problem += f"\n\n({first} earlier step{'s' if first > 1 else ''} omitted.)"
        messages = [{"role": "system", "content": self._system}, {"role": "user", "content": problem}]
        for index in range(first, len(history)):
            seen, action = history[index]
            if index == first and index > 0:  # roles alternate: join it to the problem message
                messages[-1]["content"] += f"\n\n{seen}"
            elif index > 0:  # step 0's observation is the problem itself
                messages.append({"role": "user", "content": seen})
            messages.append({"role": "assistant", "content": action or EMPTY_TURN})
        if history:
            messages.append({"role": "user", "content": observation})
        return messages
