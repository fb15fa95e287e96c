"""ChatCodec: an append-only transcript equals the chat template's rendering of the whole chat."""

from __future__ import annotations

import pytest

from streamrl.policy import ChatTemplateError
from streamrl.policy.chat import ChatTemplateCodec
from streamrl.policy.tiny import load_tiny_tokenizer

# SmolLM2-135M-Instruct's template (ChatML with a default system prompt), as shipped in its GGUF
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen3-style: earlier assistant turns lose their reasoning, so rendering is not append-only
DROPS_THINKING_TEMPLATE = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{% endif %}"
)
EPISODE = [
    (
        "Your task is to: put a clean apple in fridge.",
        "<think>find the apple</think><action>go to countertop 1</action>",
    ),
    (
        "You arrive at countertop 1. On the countertop 1, you see a apple 1.",
        "<action>take apple 1 from countertop 1</action>",
    ),
    (
        "You pick up the apple 1 from the countertop 1.\n\nAdmissible: go to sinkbasin 1",
        "<action>go to sinkbasin 1</action>",
    ),
    ("Nothing happens. 12 * 7 = 84, 'quotes' and ünïcödé ✓", "I will clean it."),
]


def tokenizer_with(template: str | None):
    tokenizer = load_tiny_tokenizer()
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def assert_transcript_is_exact(codec: ChatTemplateCodec, system: str | None) -> None:
    """prompt | a1 eot | bridge(o2) | a2 eot | ... == encode_chat(whole conversation)."""
    encode = lambda text: codec.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    opening = [{"role": "system", "content": system}] if system else []
    messages = [*opening, {"role": "user", "content": EPISODE[0][0]}]
    transcript = codec.encode_chat(messages)
    for turn, (observation, reply) in enumerate(EPISODE):
        if turn:
            transcript += codec.encode_bridge([{"role": "user", "content": observation}])
            messages.append({"role": "user", "content": observation})
        transcript += encode(reply) + [codec.end_of_turn_id]
        messages.append({"role": "assistant", "content": reply})
        # the growing transcript equals the template's rendering at every turn
        assert transcript == codec.encode_chat(messages, add_generation_prompt=False)[: len(transcript)]
        follow_up = codec.encode_chat([*messages, {"role": "user", "content": "next"}])
        assert follow_up[: len(transcript)] == transcript
    assert codec.decode(transcript).endswith(EPISODE[-1][1])


@pytest.mark.parametrize("system", [None, "You are an agent in a household."])
def test_tiny_template_bridge_is_exact(system):
    assert_transcript_is_exact(ChatTemplateCodec(tokenizer_with(None)), system)


@pytest.mark.parametrize("system", [None, "You are an agent in a household."])
def test_smollm2_template_bridge_is_exact(system):
    codec = ChatTemplateCodec(tokenizer_with(SMOLLM2_TEMPLATE))
    assert codec.append_only
    assert_transcript_is_exact(codec, system)


def test_bridge_text_is_the_chatml_user_turn():
    codec = ChatTemplateCodec(tokenizer_with(None))
    bridge = codec.tokenizer.decode(codec.encode_bridge([{"role": "user", "content": "obs"}]))
    assert bridge == "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"
    assert codec.tokenizer.convert_ids_to_tokens(codec.end_of_turn_id) == "<|im_end|>"


def test_template_that_rewrites_history_is_flagged_and_still_bridged():
    codec = ChatTemplateCodec(tokenizer_with(DROPS_THINKING_TEMPLATE))
    # rendering the history differs from prompt + reply: appending would drift from the template
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>x</think>a"}]
    whole = codec.encode_chat([*messages, {"role": "user", "content": "q2"}])
    appended = codec.encode_chat(messages, add_generation_prompt=False)
    assert whole[: len(appended)] != appended
    assert not codec.append_only
    assert codec.not_append_only_reason.startswith("user turns: ")
    # streamrl keeps the assistant turn as generated; the bridge after it is still well defined
    bridge = codec.tokenizer.decode(codec.encode_bridge([{"role": "user", "content": "obs"}]))
    assert bridge == "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert whole[-len(codec.encode_bridge([{"role": "user", "content": "q2"}])) :] == codec.encode_bridge(
        [{"role": "user", "content": "q2"}]
    )


def test_bridge_that_depends_on_the_reply_is_refused():
    # the next user turn echoes the length of the previous reply: no bridge fits every reply
    template = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
        "{% if message['role'] == 'user' and not loop.first %}{{ ' (' ~ (messages[loop.index0 - 1]['content'] | length) ~ ')' }}"
        "{% endif %}{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    codec = ChatTemplateCodec(tokenizer_with(template))
    with pytest.raises(ChatTemplateError, match="depends on the content of the assistant turn"):
        codec.encode_bridge([{"role": "user", "content": "obs"}])


def test_bridge_messages_are_checked():
    codec = ChatTemplateCodec(tokenizer_with(None))
    with pytest.raises(TypeError, match="list of messages"):
        codec.encode_bridge("obs")
    for roles in ([], ["assistant"], ["user", "user"], ["user", "tool"], ["tool", "user", "tool"], ["system"]):
        with pytest.raises(ValueError, match="got roles"):
            codec.encode_bridge([{"role": role, "content": "x"} for role in roles])


def test_missing_template_is_a_clear_error():
    tokenizer = tokenizer_with(None)
    tokenizer.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplateCodec(tokenizer)


def test_decode_drops_special_tokens_but_keeps_markup():
    codec = ChatTemplateCodec(tokenizer_with(None))
    ids = codec.tokenizer.encode("<think>a</think><action>go to desk 1</action>", add_special_tokens=False)
    assert codec.decode([*ids, codec.end_of_turn_id]) == "<think>a</think><action>go to desk 1</action>"
