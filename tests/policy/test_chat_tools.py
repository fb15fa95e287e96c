"""Chat codec with tools: rendering, bridges after tool calls, replies written as the template
writes them, and the shipped tool-capable templates (tiny, SmolLM2)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.policy import ChatCodec, ChatTemplateError, PolicyLoadError
from streamrl.policy.chat import ChatTemplateCodec
from streamrl.policy.loading import read_chat_template
from streamrl.policy.scripted import CharCodec
from streamrl.policy.tiny import TOOL_MARKUP_TOKENS, VOCAB_SIZE, load_tiny_tokenizer
from streamrl.policy.tool_format import FORMATS, resolve_tool_format

from .conftest import SMALL_TINY
from .tool_templates import (
    LLAMA31_LIKE,
    LLAMA31_SPECIALS,
    QWEN3_LIKE,
    QWEN25_LIKE,
    SMOLLM2_OWN_TEMPLATE,
    TINY_TEMPLATE_BEFORE_TOOLS,
    tiny_tokenizer_with,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "act",
            "description": "Carry out one action in the room.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the action, e.g. 'go to desk 1'"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "inventory",
            "description": "List what you carry.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
OPENING = [
    {"role": "system", "content": "You are an agent in a household."},
    {"role": "user", "content": "Your task is to: put a clean apple in fridge."},
]


def call(call_id: str, name: str, arguments: dict) -> dict:
    return {"type": "function", "id": call_id, "function": {"name": name, "arguments": arguments}}


def tool_result(call_id: str, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def llama_tokenizer():
    """The tiny tokenizer with Llama 3's header tokens, and newline runs kept whole (as Llama 3's
    pre-tokenizer does), so ``...<|end_header_id|>\\n\\n`` tokenises alike with or without a reply."""
    from tokenizers import Regex, pre_tokenizers

    tokenizer = tiny_tokenizer_with(LLAMA31_LIKE, LLAMA31_SPECIALS)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"\n+"), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    return tokenizer


# name -> (tokenizer factory, tool format, append-only, one call per message only)
TEMPLATES = {
    "tiny": (lambda: tiny_tokenizer_with(), "hermes", True, False),
    "smollm2": (lambda: tiny_tokenizer_with(read_chat_template("smollm2")), "hermes", True, False),
    "qwen25": (lambda: tiny_tokenizer_with(QWEN25_LIKE), "hermes", True, False),
    "qwen3": (lambda: tiny_tokenizer_with(QWEN3_LIKE), "qwen3", False, False),
    "llama31": (llama_tokenizer, "llama3_json", True, True),
}


def episode(single_call: bool) -> list[tuple[dict, list[dict]]]:
    """(assistant message, the messages the environment answers with) per turn."""
    first_calls = [call("c1", "act", {"command": "go to fridge 1"})]
    results = [tool_result("c1", "act", "You arrive at fridge 1. The fridge 1 is closed.")]
    if not single_call:
        first_calls.append(call("c2", "inventory", {}))
        results.append(tool_result("c2", "inventory", "You carry: nothing."))
    return [
        ({"role": "assistant", "content": "" if single_call else "I will look around.", "tool_calls": first_calls}, results),
        (
            {"role": "assistant", "content": "", "tool_calls": [call("c3", "act", {"command": "open fridge 1 ✓ \"now\""})]},
            [tool_result("c3", "act", "You open the fridge 1. In it, you see a egg 2.")],
        ),
        ({"role": "assistant", "content": "The apple is not here."}, [{"role": "user", "content": "Keep going."}]),
        (
            {"role": "assistant", "content": "", "tool_calls": [call("c4", "act", {"command": "look"})]},
            [tool_result("c4", "act", "You are in the middle of a room."), {"role": "user", "content": "2 steps left."}],
        ),
    ]


def expected_parse(message: dict) -> tuple[str, list[dict]]:
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message.get("tool_calls", [])]
    return (message.get("content") or "").strip(), calls


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_tool_episode_round_trip(name):
    """render -> scripted reply -> parse -> bridge, turn after turn: an append-only template's
    transcript equals its rendering of the whole conversation at every turn; a template that is not
    (Qwen3-like) still gives bridges that are the tail of that rendering."""
    make, format_name, append_only, single_call = TEMPLATES[name]
    codec = ChatTemplateCodec(make())
    tool_format, _ = resolve_tool_format(codec.tokenizer)
    assert tool_format.name == format_name and codec.renders_tool_calls
    assert codec.append_only is append_only
    encode = lambda text: codec.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731

    messages = list(OPENING)
    transcript = codec.encode_chat(messages, tools=TOOLS)
    for reply, answers in episode(single_call):
        # the scripted model writes the reply exactly as the template writes it, then stops
        generated = encode(codec.render_reply(reply, tools=TOOLS)) + [codec.end_of_turn_id]
        parsed = tool_format.parse(codec.decode(generated))
        assert (parsed["content"], parsed["tool_calls"]) == expected_parse(reply)
        bridge = codec.encode_bridge(answers, tools=TOOLS)
        transcript += generated + bridge
        messages += [reply, *answers]
        whole = codec.encode_chat(messages, tools=TOOLS)
        if append_only:
            assert transcript == whole
        else:
            assert whole[-len(bridge) - 1 :] == [codec.end_of_turn_id, *bridge]
            assert codec.decode(transcript).endswith(codec.decode(whole[-len(bridge) :]))


def test_qwen3_like_is_not_append_only_but_bridges():
    codec = ChatTemplateCodec(tiny_tokenizer_with(QWEN3_LIKE))
    assert not codec.append_only
    assert codec.not_append_only_reason == (
        "user turns: the template adds text between the assistant header and the reply; "
        "tool turns: adding tool results rewrites the assistant turn that called the tool"
    )
    results = [tool_result("c1", "act", "r1"), tool_result("c2", "act", "r2")]
    bridge = codec.tokenizer.decode(codec.encode_bridge(results, tools=TOOLS))
    assert bridge == (
        "\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # what the model writes after the generation prompt: an empty think block, then the call
    reply = codec.render_reply({"role": "assistant", "content": "", "tool_calls": [call("c1", "act", {"command": "look"})]})
    assert reply == '<think>\n\n</think>\n\n<tool_call>\n{"name": "act", "arguments": {"command": "look"}}\n</tool_call>'
    thought = codec.render_reply({"role": "assistant", "content": "<think>\nNear.\n</think>\n\nGo."})
    assert FORMATS["qwen3"].parse(thought) == {"content": "Go.", "reasoning_content": "Near.", "tool_calls": []}


def test_hermes_bridges_group_tool_results_and_open_the_next_turn():
    codec = ChatTemplateCodec(tiny_tokenizer_with())
    assert codec.append_only and codec.not_append_only_reason == ""
    messages = [tool_result("c1", "act", "r1"), tool_result("c2", "inventory", "r2"), {"role": "user", "content": "next"}]
    assert codec.tokenizer.decode(codec.encode_bridge(messages, tools=TOOLS)) == (
        "\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    )
    # the bridge does not depend on the tools (they live in the opening)
    assert codec.encode_bridge(messages, tools=TOOLS) == codec.encode_bridge(messages)


def test_llama_like_writes_ipython_turns_and_one_call_per_message():
    codec = ChatTemplateCodec(llama_tokenizer())
    assert codec.tokenizer.convert_ids_to_tokens(codec.end_of_turn_id) == "<|eot_id|>"
    bridge = codec.tokenizer.decode(codec.encode_bridge([tool_result("c1", "act", "r1")], tools=TOOLS))
    assert bridge == "<|start_header_id|>ipython<|end_header_id|>\n\nr1<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    reply = codec.render_reply({"role": "assistant", "tool_calls": [call("c1", "act", {"command": "look"})]}, tools=TOOLS)
    assert reply == '{"name": "act", "parameters": {"command": "look"}}'
    with pytest.raises(ChatTemplateError, match="only supports single tool-calls"):
        codec.encode_bridge([tool_result("c1", "act", "r1"), tool_result("c2", "act", "r2")], tools=TOOLS)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_render_reply_round_trips_through_parse(name):
    make, format_name, _, single_call = TEMPLATES[name]
    codec = ChatTemplateCodec(make())
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "act", {"command": "take apple 1 from countertop 1"})]},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "act", {"command": "ünïcödé ✓ \"quoted\" \\ back"})]},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "inventory", {})]},
    ]
    if not single_call:  # Llama 3.1 writes a call without content, one per message
        messages += [
            {"role": "assistant", "content": "Two things at once.", "tool_calls": [call("a", "act", {"command": "look"}), call("b", "inventory", {})]},
        ]
    messages.append({"role": "assistant", "content": "Just text, 12 * 7 = 84."})
    for message in messages:
        text = codec.render_reply(message, tools=TOOLS)
        parsed = FORMATS[format_name].parse(text)
        assert (parsed["content"], parsed["tool_calls"]) == expected_parse(message), text


def test_render_reply_needs_the_generation_prompt_as_a_prefix():
    # DeepSeek-R1 style: the generation prompt opens <think>, the rendered turn does not
    template = TINY_TEMPLATE_BEFORE_TOOLS.replace("{{ '<|im_start|>assistant\\n' }}", "{{ '<|im_start|>assistant\\n<think>\\n' }}")
    codec = ChatTemplateCodec(tiny_tokenizer_with(template))
    with pytest.raises(ChatTemplateError, match="does not start with its generation prompt"):
        codec.render_reply({"role": "assistant", "content": "hi"})
    with pytest.raises(ValueError, match="renders an assistant message"):
        codec.render_reply({"role": "user", "content": "hi"})


def test_a_template_without_tools_reports_it():
    codec = ChatTemplateCodec(tiny_tokenizer_with(TINY_TEMPLATE_BEFORE_TOOLS))
    assert codec.append_only and not codec.renders_tool_calls


# -- the shipped templates -------------------------------------------------------------------------

TOOL_FREE_CHATS = [
    [{"role": "user", "content": "hi"}],
    OPENING,
    [
        *OPENING,
        {"role": "assistant", "content": "<think>find the apple</think><action>go to countertop 1</action>"},
        {"role": "user", "content": "Nothing happens. 12 * 7 = 84, 'quotes' and ünïcödé ✓\n\nAdmissible: look"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "{% raw %} <tool_call> is only text here"},
    ],
    [{"role": "user", "content": "a"}, {"role": "system", "content": "late system"}, {"role": "assistant", "content": "b"}],
    [{"role": "assistant", "content": "starts with the reply", "tool_calls": []}],
]


@pytest.mark.parametrize(
    ("shipped", "original"), [("hermes", TINY_TEMPLATE_BEFORE_TOOLS), ("smollm2", SMOLLM2_OWN_TEMPLATE)]
)
@pytest.mark.parametrize("chat", range(len(TOOL_FREE_CHATS)))
def test_shipped_templates_render_tool_free_chats_byte_for_byte(shipped, original, chat):
    new, old = tiny_tokenizer_with(read_chat_template(shipped)), tiny_tokenizer_with(original)
    messages = TOOL_FREE_CHATS[chat]
    for add_generation_prompt in (False, True):
        for tools in (None, []):
            render = lambda t: t.apply_chat_template(  # noqa: E731
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert render(new) == render(old)


def test_tiny_template_with_tools():
    tokenizer = load_tiny_tokenizer()
    assert tokenizer.chat_template == read_chat_template("hermes")
    messages = [
        *OPENING,
        {"role": "assistant", "content": "I will look.", "tool_calls": [call("c1", "act", {"command": "look"}), call("c2", "inventory", {})]},
        tool_result("c1", "act", "You see a fridge 1."),
        tool_result("c2", "inventory", "nothing"),
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    schemas = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in TOOLS)
    assert text == (
        "<|im_start|>system\nYou are an agent in a household.\n\n"
        "You can call these tools (JSON function signatures, one per line):\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "To call a tool, write its name and arguments as one JSON object between <tool_call> and </tool_call>:\n"
        '<tool_call>\n{"name": <tool name>, "arguments": <arguments object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nYour task is to: put a clean apple in fridge.<|im_end|>\n"
        "<|im_start|>assistant\nI will look.\n"
        '<tool_call>\n{"name": "act", "arguments": {"command": "look"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "inventory", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nYou see a fridge 1.\n</tool_response>\n"
        "<tool_response>\nnothing\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # without a system message the tools get a system turn of their own
    alone = tokenizer.apply_chat_template(OPENING[1:], tools=TOOLS, tokenize=False)
    assert alone.startswith("<|im_start|>system\nYou can call these tools") and alone.count("<|im_start|>system") == 1


def test_smollm2_template_keeps_its_default_system_prompt_with_tools():
    tokenizer = tiny_tokenizer_with(read_chat_template("smollm2"))
    text = tokenizer.apply_chat_template(OPENING[1:], tools=TOOLS[:1], tokenize=False, add_generation_prompt=True)
    assert text.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n"
        "You can call these tools (JSON function signatures, one per line):\n<tools>\n"
    )
    with_system = tokenizer.apply_chat_template(OPENING, tools=TOOLS[:1], tokenize=False)
    assert with_system.startswith("<|im_start|>system\nYou are an agent in a household.\n\nYou can call these tools")
    assert "SmolLM" not in with_system


def test_tiny_tokenizer_has_the_tool_markup_as_single_ordinary_tokens():
    tokenizer = load_tiny_tokenizer(["b0entity01"])
    ids = tokenizer.convert_tokens_to_ids(list(TOOL_MARKUP_TOKENS))
    assert ids == list(range(VOCAB_SIZE, VOCAB_SIZE + len(TOOL_MARKUP_TOKENS)))
    assert tokenizer.convert_tokens_to_ids("b0entity01") == VOCAB_SIZE + len(TOOL_MARKUP_TOKENS)
    assert len(tokenizer) == VOCAB_SIZE + len(TOOL_MARKUP_TOKENS) + 1
    assert not set(ids) & set(tokenizer.all_special_ids)
    text = '<tools>\n{}\n</tools><tool_call>\n{"name": "act"}\n</tool_call><tool_response>\nok\n</tool_response>'
    encoded = tokenizer.encode(text, add_special_tokens=False)
    assert [i for i in encoded if i in ids] == [ids[4], ids[5], ids[0], ids[1], ids[2], ids[3]]
    assert tokenizer.decode(encoded, skip_special_tokens=True) == text


# -- load_policy(chat_template=...) ------------------------------------------------------------------


def test_load_policy_replaces_the_chat_template(tmp_path, hf_folder):
    from streamrl.policy import load_policy

    template_file = tmp_path / "qwen3_like.jinja"
    template_file.write_text(QWEN3_LIKE, encoding="utf-8")
    policy = load_policy(SMALL_TINY, chat_template=str(template_file), value_tokens=False)
    assert policy.tokenizer.chat_template == QWEN3_LIKE and not policy.append_only
    assert resolve_tool_format(policy)[0].name == "qwen3"
    assert policy.base_recipe["chat_template"] == str(template_file.resolve())
    folder_policy = load_policy(str(hf_folder), chat_template="smollm2", value_tokens=False)
    assert folder_policy.tokenizer.chat_template == read_chat_template("smollm2")
    opening = folder_policy.tokenizer.decode(folder_policy.encode_chat(OPENING[1:]))
    assert opening.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    with pytest.raises(PolicyLoadError, match="neither a shipped template \\(hermes, smollm2\\) nor a path"):
        load_policy(SMALL_TINY, chat_template="chatml")


# -- the character codec ---------------------------------------------------------------------------


def test_char_codec_tools():
    codec = CharCodec()
    assert isinstance(codec, ChatCodec) and codec.append_only and codec.tool_format == "hermes"
    opening = codec.decode(codec.encode_chat(OPENING, tools=TOOLS[:1]))
    assert opening == (
        f"<|im_start|>system\nYou are an agent in a household.\n\n<tools>\n{json.dumps(TOOLS[0])}\n</tools><|im_end|>\n"
        "<|im_start|>user\nYour task is to: put a clean apple in fridge.<|im_end|>\n<|im_start|>assistant\n"
    )
    reply = {"role": "assistant", "content": "Go.", "tool_calls": [call("c1", "act", {"command": "look"})]}
    assert codec.render_reply(reply) == 'Go.\n<tool_call>{"name": "act", "arguments": {"command": "look"}}</tool_call>'
    assert FORMATS["hermes"].parse(codec.render_reply(reply)) == {
        "content": "Go.", "reasoning_content": None, "tool_calls": [{"name": "act", "arguments": {"command": "look"}}]
    }
    bridge = codec.decode(codec.encode_bridge([tool_result("c1", "act", "ok"), {"role": "user", "content": "more"}]))
    assert bridge == (
        "\n<|im_start|>user\n<tool_response>ok</tool_response><|im_end|>\n"
        "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    )


texts = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12)


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(
        st.tuples(texts, st.lists(texts, max_size=2), st.lists(texts, max_size=2), st.one_of(st.none(), texts)),
        min_size=1,
        max_size=3,
    )
)
def test_char_codec_with_tools_is_append_only(turns):
    """opening | reply eot | bridge | ... == the whole conversation rendered at once."""
    codec = CharCodec()
    messages = list(OPENING)
    ids = codec.encode_chat(messages, tools=TOOLS)
    for index, (content, commands, results, user) in enumerate(turns):
        calls = [call(f"c{index}_{i}", "act", {"command": command}) for i, command in enumerate(commands)]
        reply = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        answers = [tool_result(c["id"], "act", result) for c, result in zip(calls, results)]
        answers += [{"role": "user", "content": user or ""}] if user is not None or not answers else []
        ids += codec.encode_text(codec.render_reply(reply)) + [codec.end_of_turn_id] + codec.encode_bridge(answers)
        messages += [reply, *answers]
        assert ids == codec.encode_chat(messages, tools=TOOLS)
