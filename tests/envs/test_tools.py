"""Tools in the environment contract: schemas from type hints and docstrings, every kind of bad call
answered (never raised) and counted format-invalid with its reason, and each seed environment's tool
form (alfworld ``execute``, webshop ``search``/``click``, math ``python``, pick_object ``take``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.envs import Env, EnvSpec, Step, make, tool
from streamrl.envs.tools import FORMAT_PROBLEMS, AssistantMessage, ToolCall, ToolSchemaError, tool_schema


class Counter(Env):
    spec = EnvSpec(name="counter", max_steps=4, splits={"train": None}, max_tool_calls_per_turn=2)

    def start(self, task_id):
        self.total = 0
        return "Count to 3."

    @tool
    def add(self, amount: int, note: str = "") -> Step | str:
        """Add to the total.

        Args:
            amount: how much to add
            note: why (optional)
        """
        self.total += amount
        if self.total == 3:
            return Step("Three.", reward=1.0, done=True, won=True)
        return f"Total {self.total}."

    @tool
    def explode(self) -> str:
        """A tool that fails."""
        raise RuntimeError("boom")


def message(*calls: ToolCall, content: str = "") -> AssistantMessage:
    return AssistantMessage(content, tuple(calls))


def ok(call_id: str, name: str, **arguments) -> ToolCall:
    return ToolCall(call_id, name, arguments)


def test_schemas_come_from_type_hints_and_docstrings():
    env = Counter()
    add, explode = env.tools()
    assert add == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add to the total.",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "integer", "description": "how much to add"},
                               "note": {"type": "string", "description": "why (optional)"}},
                "required": ["amount"],
            },
        },
    }
    assert explode["function"]["name"] == "explode" and explode["function"]["parameters"]["properties"] == {}


def test_a_tool_without_documented_arguments_is_refused_by_name():
    class Bad(Env):
        spec = EnvSpec(name="bad", max_steps=1, splits={"train": None})

        def start(self, task_id):
            return ""

        @tool
        def go(self, where: str) -> str:
            return where

    with pytest.raises(ToolSchemaError, match=r"tool Bad.go: cannot build its schema"):
        Bad().tools()
    with pytest.raises(ToolSchemaError, match="Args:"):
        tool_schema(lambda x: x)


# (the calls of one turn, the problem kind or None, a phrase of the agent's message)
BAD_TURNS = {
    "unparseable JSON": ([ToolCall("call_0", raw='{"name": "add", "arguments": {', error="invalid JSON")],
                         "unparseable_call", "could not be read: invalid JSON"),
    "unknown tool": ([ok("call_0", "subtract", amount=1)], "unknown_tool", "unknown tool 'subtract'; the tools are add, explode"),
    "missing argument": ([ok("call_0", "add")], "bad_arguments", "add: missing argument 'amount'"),
    "ill-typed argument": ([ok("call_0", "add", amount="two")], "bad_arguments", "add: argument amount: 'two' is not of type 'integer'"),
    "unexpected argument": ([ok("call_0", "add", amount=1, by="me")], "bad_arguments", "unexpected argument 'by'"),
    "too many calls": ([ok(f"call_{i}", "add", amount=0) for i in range(3)], "too_many_calls", "not run: at most 2 tool call(s)"),
}


@pytest.mark.parametrize("case", sorted(BAD_TURNS))
def test_every_bad_call_is_answered_and_counted_format_invalid(case):
    calls, kind, phrase = BAD_TURNS[case]
    env = Counter()
    env.reset(task_id="train/0")
    result = env.step(message(*calls))
    assert kind in FORMAT_PROBLEMS
    assert not result.info["format_valid"] and result.info["format_problem"] == kind
    assert phrase in result.info["format_reason"]
    # one tool message per call, each naming the call it answers; the episode goes on
    assert [m["role"] for m in result.messages] == ["tool"] * len(calls)
    assert [m["tool_call_id"] for m in result.messages] == [c.id for c in calls]
    assert any(phrase in m["content"] for m in result.messages)
    assert not (result.terminated or result.truncated) and result.reward == 0.0


def test_text_where_a_call_is_required_is_answered_by_a_user_message():
    env = Counter()
    env.reset(task_id="train/0")
    result = env.step(message(content="I think the answer is 3."))
    assert result.info["format_problem"] == "no_tool_call" and not result.info["format_valid"]
    assert result.messages == [{"role": "user", "content": "no tool call; call one of the tools: add, explode"}]


def test_a_tool_that_raises_is_an_ineffective_turn_not_a_crash():
    env = Counter()
    env.reset(task_id="train/0")
    result = env.step(message(ok("call_0", "explode")))
    assert result.messages[0]["content"] == "Error: explode raised RuntimeError: boom"
    assert result.info["format_valid"] and not result.info["action_effective"]


def test_good_calls_run_in_order_and_the_ending_call_ends_the_episode():
    env = Counter()
    env.reset(task_id="train/0")
    first = env.step(message(ok("call_0", "add", amount=1)))
    assert first.messages[0]["content"] == "Total 1." and first.info["format_valid"]
    second = env.step(message(ok("call_0", "add", amount=1), ok("call_1", "add", amount=1)))
    assert [m["content"] for m in second.messages] == ["Total 2.", "Three."]
    assert second.terminated and second.reward == 1.0 and second.info["won"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "explode", "nope", None]),
                          st.dictionaries(st.sampled_from(["amount", "note", "x"]),
                                          st.one_of(st.integers(-3, 3), st.text(max_size=4), st.none()), max_size=3)),
                max_size=4), st.text(max_size=10))
def test_no_message_crashes_a_step(calls, content):
    env = Counter()
    env.reset(task_id="train/0")
    tool_calls = tuple(
        ToolCall(f"call_{i}", raw="?", error="invalid JSON") if name is None else ToolCall(f"call_{i}", name, args)
        for i, (name, args) in enumerate(calls)
    )
    result = env.step(AssistantMessage(content, tool_calls))
    assert isinstance(result.info["format_valid"], bool)
    assert len(result.messages) == (len(tool_calls) or 1)
    if not result.info["format_valid"]:
        assert result.info["format_problem"] in FORMAT_PROBLEMS and result.info["format_reason"]


# each seed environment's tool form: (name, options, the calls of a winning or progressing turn)
def test_pick_object_is_won_by_calling_take_with_the_target():
    env = make("pick_object")
    env.reset(task_id="test/3")
    assert [t["function"]["name"] for t in env.tools()] == ["take"]
    result = env.step(message(ok("call_0", "take", object=env.expert_action())))
    assert result.terminated and result.info["won"]
    env.reset(task_id="test/3")
    lost = env.step(message(content=env.expert_action()))  # the right word, but not as a call
    assert lost.info["format_problem"] == "no_tool_call" and not lost.info["won"]


def test_alfworld_tool_form_runs_its_commands_through_one_execute_tool():
    env = make("alfworld_lite")
    env.reset(task_id="train/0")
    assert [t["function"]["name"] for t in env.tools()] == ["execute"]
    looked = env.step(message(ok("call_0", "execute", command="look")))
    assert looked.info["format_valid"] and looked.messages[0]["role"] == "tool"
    assert looked.messages[0]["content"] == looked.observation


def test_webshop_tool_form_has_search_and_click():
    env = make("webshop_lite")
    env.reset(task_id="train/0")
    assert sorted(t["function"]["name"] for t in env.tools()) == ["click", "search"]
    searched = env.step(message(ok("call_0", "search", query="red shirt")))
    assert searched.info["format_valid"] and "Back to Search" in searched.observation


def test_math_tool_form_runs_python_in_the_sandbox_and_a_plain_turn_answers():
    env = make("math_tir", max_turns=3, max_tool_calls=2)
    env.reset(task_id="test/0")
    assert [t["function"]["name"] for t in env.tools()] == ["python"]
    ran = env.step(message(ok("call_0", "python", code=env.expert_action().split("\n")[1])))
    assert ran.messages[0]["content"].strip() == env.describe()["gt"]
    answered = env.step(message(content=env.expert_action()))
    assert answered.terminated and answered.info["won"]
    env.close()
