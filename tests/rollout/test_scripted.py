"""The scripted engine and character codec used by tests, benchmarks and dry runs."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.policy.protocols import ChatCodec, GenerationRequest, InferenceEngine, SamplingParams
from streamrl.policy.scripted import CharCodec, ScriptedEngine

texts = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=20)


def test_protocols_are_met():
    assert isinstance(CharCodec(), ChatCodec)
    assert isinstance(ScriptedEngine(lambda p: ""), InferenceEngine)


@settings(max_examples=50, deadline=None)
@given(system=texts, turns=st.lists(st.tuples(texts, texts), min_size=1, max_size=4))
def test_codec_is_append_only(system, turns):
    """Opening + each reply (with end-of-turn) + each bridge == the whole chat rendered at once."""
    codec = CharCodec()
    messages = [{"role": "system", "content": system}, {"role": "user", "content": turns[0][0]}]
    ids = codec.encode_chat(messages)
    for index, (user, reply) in enumerate(turns):
        if index:
            messages.append({"role": "user", "content": user})
            ids += codec.encode_bridge([{"role": "user", "content": user}])
        messages.append({"role": "assistant", "content": reply})
        ids += codec.encode_text(reply) + [codec.end_of_turn_id]
    assert ids + codec.encode_text("\n") == codec.encode_chat(messages, add_generation_prompt=False)
    assert codec.decode(codec.encode_text(system)) == system


def generate(engine, text_sampling):
    return asyncio.run(engine.generate(GenerationRequest("r1", [5, 6], text_sampling)))


def test_sampling_caps():
    codec = CharCodec()
    engine = ScriptedEngine(lambda prompt: "hello world")
    full = generate(engine, SamplingParams())
    assert full.token_ids == codec.encode_text("hello world") + [codec.end_of_turn_id] and full.finish_reason == "stop"
    cut = generate(engine, SamplingParams(max_new_tokens=4))
    assert cut.text == "hell" and cut.finish_reason == "length"
    stopped = generate(engine, SamplingParams(stop_strings=("o w",)))
    assert stopped.text == "hello w" and stopped.finish_reason == "stop"
    stop_id = generate(engine, SamplingParams(stop_token_ids=(codec.encode_text("l")[0],)))
    assert stop_id.text == "hel"
    assert len(full.logprobs) == len(full.token_ids) and all(-3.0 <= lp < 0 for lp in full.logprobs)
    assert generate(engine, SamplingParams()).logprobs == full.logprobs  # deterministic per request id


def test_versions_and_prompts_reach_the_policy():
    seen = []
    engine = ScriptedEngine(lambda prompt: seen.append(prompt) or "x", version=3)
    assert generate(engine, SamplingParams()).policy_version == 3
    engine.update_weights({}, 4)
    assert generate(engine, SamplingParams()).policy_version == 4 and engine.weight_updates == 1
    assert seen == [CharCodec().decode([5, 6])] * 2
