"""HFEngine reuses the KV of a finished sequence when the next prompt extends it (full-history
turns): only the new tokens are prefilled, and the log-probs still equal what score says."""

from __future__ import annotations

import torch

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams

from .test_engine import OBSERVATIONS, scored_logprobs


def play(loop, requests):
    """Admit ``requests`` at once into the decode loop and step until they are done."""
    results = {}
    loop.admit([(request, lambda result: results.setdefault(result.request_id, result)) for request in requests])
    while loop.live:
        loop.step()
    return [results[request.request_id] for request in requests]


def check(policy, request, result, temperature=1.0):
    expected = scored_logprobs(policy.model, request.prompt_ids, result.token_ids, policy.banned_token_ids, temperature)
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4), request.request_id


def test_growing_transcripts_prefill_only_their_new_tokens(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=4)
    loop = engine._decode_loop  # driven directly: admissions in a known order
    episodes = [small_policy.encode_chat([{"role": "user", "content": OBSERVATIONS[i]}]) for i in range(3)]
    stop = (small_policy.end_of_turn_id,)
    bridge: list[int] = []  # the ids that carried the previous turn's observation
    for turn in range(3):
        # different answer lengths per episode: rows with and without padding share a prefill group
        requests = [
            GenerationRequest(f"e{i}t{turn}", prompt, SamplingParams(max_new_tokens=3 + 4 * i, stop_token_ids=stop))
            for i, prompt in enumerate(episodes)
        ]
        before = dict(loop.stats)
        results = play(loop, requests)
        for request, result in zip(requests, results):
            check(small_policy, request, result)
        reused = loop.stats["reused_tokens"] - before["reused_tokens"]
        if turn:  # each prompt continues its episode's last answer (all but its last token is cached)
            assert reused == sum(len(r.prompt_ids) for r in requests) - len(requests) * len(bridge) - len(requests)
        else:
            assert reused == 0
        bridge = small_policy.encode_bridge([{"role": "user", "content": f"observation {turn}"}])
        episodes = [r.prompt_ids + res.token_ids + bridge for r, res in zip(requests, results)]
    engine.close_sync()


def test_new_weights_drop_the_kept_prefixes(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=2)
    loop = engine._decode_loop
    prompt = small_policy.encode_chat([{"role": "user", "content": OBSERVATIONS[1]}])
    first = play(loop, [GenerationRequest("a", prompt, SamplingParams(max_new_tokens=5))])[0]
    assert loop.prefixes.held == len(prompt) + 4
    loop.version = 1  # what HFEngine does once new weights are loaded
    assert loop.prefixes.held == 0
    bridge = small_policy.encode_bridge([{"role": "user", "content": "ok"}])
    follow = GenerationRequest("b", prompt + first.token_ids + bridge, SamplingParams(max_new_tokens=3))
    check(small_policy, follow, play(loop, [follow])[0])
    assert loop.stats["reused_tokens"] == 0
    engine.close_sync()


def test_identical_continuations_share_one_prefix(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=4)
    loop = engine._decode_loop
    prompt = small_policy.encode_chat([{"role": "user", "content": OBSERVATIONS[2]}])
    first = play(loop, [GenerationRequest("a", prompt, SamplingParams(max_new_tokens=4))])[0]
    follow = prompt + first.token_ids + small_policy.encode_bridge([{"role": "user", "content": "again"}])
    requests = [GenerationRequest(f"g{i}", follow, SamplingParams(max_new_tokens=4, temperature=0.7)) for i in range(3)]
    for request, result in zip(requests, play(loop, requests)):
        check(small_policy, request, result, temperature=0.7)
    assert loop.stats["reused_tokens"] == len(prompt) + 3
    engine.close_sync()


def test_a_common_system_prompt_is_prefilled_once_and_kept(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=4)
    loop = engine._decode_loop
    system = {"role": "system", "content": "You are an agent in a household. Think, then act, briefly."}
    episodes = [small_policy.encode_chat([system, {"role": "user", "content": OBSERVATIONS[i]}]) for i in range(4)]
    common = next(n for n, column in enumerate(zip(*episodes)) if len(set(column)) > 1)
    assert common >= 16
    requests = [GenerationRequest(f"s{i}", p, SamplingParams(max_new_tokens=3 + i)) for i, p in enumerate(episodes[:3])]
    for request, result in zip(requests, play(loop, requests)):
        check(small_policy, request, result)
    assert loop.stats["prefill_tokens"] == common + sum(len(p) - common for p in episodes[:3])
    before = loop.stats["reused_tokens"]
    late = GenerationRequest("late", episodes[3], SamplingParams(max_new_tokens=4, temperature=0.7))
    check(small_policy, late, play(loop, [late])[0], temperature=0.7)
    assert loop.stats["reused_tokens"] - before == common  # the shared prefix stayed in the store
    engine.close_sync()
