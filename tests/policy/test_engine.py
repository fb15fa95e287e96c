"""HFEngine: batching correctness against score, sampling controls, weights, failures, shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from streamrl.policy import GenerationRequest, HFEngine, InferenceEngine, SamplingParams, decode_loop, load_policy
from streamrl.policy.scoring import score

from .conftest import SMALL_TINY

OBSERVATIONS = [
    "hi",
    "Your task is to: put a clean apple in fridge.",
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, a bread 2, and a knife 3.",
    "Nothing happens.",
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 4, a cabinet 3, a "
    "countertop 1, a fridge 1, a microwave 1, a sinkbasin 1, and a toaster 1. Your task is to: heat some egg.",
]


def prompts(policy, count: int) -> list[list[int]]:
    return [
        policy.encode_chat([{"role": "user", "content": OBSERVATIONS[i % len(OBSERVATIONS)] * (1 + i % 3)}])
        for i in range(count)
    ]


def run(coroutine):
    return asyncio.run(coroutine)


async def generate_all(engine, requests):
    return await asyncio.gather(*(engine.generate(r) for r in requests))


def scored_logprobs(model, prompt: list[int], tokens: list[int], excluded, temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    out = score(
        model,
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        excluded_ids=excluded,
        temperature=temperature,
        with_entropy=False,
    )
    return out.logprobs[0, len(prompt) :]


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "streamrl-hf-engine"]


@pytest.fixture()
def engine(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=4)
    yield engine
    engine.close_sync()


def test_engine_implements_the_protocol(engine):
    assert isinstance(engine, InferenceEngine)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_continuous_batching_matches_score(small_policy, monkeypatch, temperature, top_p):
    """Rows of different prompt and answer lengths share few slots; every result must equal what a
    plain forward over its own sequence says, which checks slot refills and slab re-layouts."""
    monkeypatch.setattr(decode_loop, "COLUMN_HEADROOM", 3)  # re-layout often
    engine = HFEngine.from_policy(small_policy, max_batch_size=3)
    requests = [
        GenerationRequest(
            f"r{i}", p, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=3 + 7 * (i % 4))
        )
        for i, p in enumerate(prompts(small_policy, 11))
    ]
    results = run(generate_all(engine, requests))
    engine.close_sync()
    for request, result in zip(requests, results):
        assert result.request_id == request.request_id and result.finish_reason == "length"
        assert len(result.token_ids) == len(result.logprobs) == request.sampling.max_new_tokens
        assert result.text == small_policy.decode(result.token_ids)
        assert result.policy_version == 0
        expected = scored_logprobs(
            small_policy.model, request.prompt_ids, result.token_ids, small_policy.banned_token_ids, temperature
        )
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4), request.request_id
    assert engine.stats["generated_tokens"] == sum(len(r.token_ids) for r in results)


def test_thirty_two_concurrent_coroutines_all_return(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=8)
    requests = [
        GenerationRequest(f"c{i}", p, SamplingParams(max_new_tokens=1 + i % 9))
        for i, p in enumerate(prompts(small_policy, 32))
    ]

    async def main():
        return await asyncio.wait_for(generate_all(engine, requests), timeout=60)

    results = run(main())
    engine.close_sync()
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    assert all(len(r.token_ids) == q.sampling.max_new_tokens for r, q in zip(results, requests))


def test_banned_ids_never_sampled_in_ten_thousand_tokens(small_policy):
    banned = list(small_policy.banned_token_ids)
    prompt = prompts(small_policy, 1)[0]
    # the random model is close to uniform: unbanned, the value tokens would come up ~10 times
    with torch.no_grad():
        probs = small_policy.model(torch.tensor([prompt])).logits[0, -1].softmax(-1)
    assert probs[banned].sum() * 10_000 > 5
    engine = HFEngine.from_policy(small_policy, max_batch_size=40)
    requests = [GenerationRequest(f"b{i}", prompt, SamplingParams(max_new_tokens=250)) for i in range(40)]
    results = run(generate_all(engine, requests))
    engine.close_sync()
    tokens = [t for r in results for t in r.token_ids]
    assert len(tokens) == 10_000 and not set(tokens) & set(banned)


def test_stop_token_and_stop_string(engine, small_policy):
    prompt = prompts(small_policy, 3)[2]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=30)
    reference = run(engine.generate(GenerationRequest("g", prompt, greedy)))
    stop_id = reference.token_ids[5]
    first = reference.token_ids.index(stop_id)
    stopped = run(
        engine.generate(
            GenerationRequest(
                "s", prompt, SamplingParams(temperature=0.0, max_new_tokens=30, stop_token_ids=(stop_id,))
            )
        )
    )
    assert stopped.finish_reason == "stop" and stopped.token_ids == reference.token_ids[: first + 1]

    text = reference.text
    needle = text[len(text) // 2 : len(text) // 2 + 3]
    by_string = run(
        engine.generate(
            GenerationRequest("t", prompt, SamplingParams(temperature=0.0, max_new_tokens=30, stop_strings=(needle,)))
        )
    )
    assert by_string.finish_reason == "stop" and needle in by_string.text
    assert by_string.token_ids == reference.token_ids[: len(by_string.token_ids)]
    assert needle not in small_policy.decode(by_string.token_ids[:-1])  # it stopped at the first match


def test_update_weights_changes_outputs_and_version(small_policy):
    learner = load_policy(SMALL_TINY, seed=0)
    engine = HFEngine.from_policy(learner, max_batch_size=4)
    prompt = prompts(learner, 2)[1]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    before = run(engine.generate(GenerationRequest("a", prompt, greedy)))
    torch.manual_seed(0)
    with torch.no_grad():
        for param in learner.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    reference = load_policy(SMALL_TINY, seed=0).model
    reference.load_state_dict(learner.model.state_dict())
    engine.update_weights(learner.state_dict_for_engine(), version=1)
    with torch.no_grad():  # the engine holds a copy: changing the learner now has no effect
        learner.model.get_input_embeddings().weight.mul_(0)
    assert engine.version == 1
    after = run(engine.generate(GenerationRequest("b", prompt, greedy)))
    engine.close_sync()
    assert before.policy_version == 0 and after.policy_version == 1
    assert after.logprobs != before.logprobs
    expected = scored_logprobs(reference, prompt, after.token_ids, learner.banned_token_ids, 1.0)
    assert torch.allclose(torch.tensor(after.logprobs), expected, atol=1e-4)


def test_weights_swap_between_batches_never_mid_result(small_policy):
    learner = load_policy(SMALL_TINY, seed=0)
    old_model = load_policy(SMALL_TINY, seed=0).model
    engine = HFEngine.from_policy(learner, max_batch_size=4)
    prompt = prompts(learner, 2)[1]

    async def main():
        running = [
            asyncio.ensure_future(
                engine.generate(GenerationRequest(f"o{i}", prompt, SamplingParams(max_new_tokens=300)))
            )
            for i in range(3)
        ]
        while engine.stats["generated_tokens"] < 30:
            await asyncio.sleep(0.002)
        assert not any(future.done() for future in running)  # the update lands mid-generation
        with torch.no_grad():
            for param in learner.model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        engine.update_weights(learner.state_dict_for_engine(), version=7)
        late = await engine.generate(GenerationRequest("n", prompt, SamplingParams(max_new_tokens=20)))
        return await asyncio.gather(*running), late

    old_results, late = run(main())
    engine.close_sync()
    excluded = learner.banned_token_ids
    for result in old_results:
        assert result.policy_version == 0
        expected = scored_logprobs(old_model, prompt, result.token_ids, excluded, 1.0)
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)
    assert late.policy_version == 7
    expected = scored_logprobs(learner.model, prompt, late.token_ids, excluded, 1.0)
    assert torch.allclose(torch.tensor(late.logprobs), expected, atol=1e-4)


def test_update_weights_rejects_a_mismatched_state_dict(engine, small_policy):
    state = small_policy.state_dict_for_engine()
    with pytest.raises(ValueError, match="missing"):
        engine.update_weights({k: v for k, v in state.items() if "norm" not in k}, version=1)
    key = next(iter(state))
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        engine.update_weights({**state, key: torch.zeros(3)}, version=1)
    assert engine.version == 0


def test_bad_requests_fail_alone(engine, small_policy):
    good = prompts(small_policy, 1)[0]
    value_id = small_policy.value_token_ids[0]
    requests = [
        GenerationRequest("ok", good, SamplingParams(max_new_tokens=5)),
        GenerationRequest("empty", [], SamplingParams()),
        GenerationRequest("range", [10**7], SamplingParams()),
        GenerationRequest("banned", [*good, value_id], SamplingParams()),
        GenerationRequest("temp", good, SamplingParams(temperature=-1.0)),
        GenerationRequest("top_p", good, SamplingParams(top_p=0.0)),
        GenerationRequest("zero", good, SamplingParams(max_new_tokens=0)),
    ]
    results = {r.request_id: r for r in run(generate_all(engine, requests))}
    assert results["ok"].finish_reason == "length" and len(results["ok"].token_ids) == 5
    assert results["zero"].finish_reason == "length" and results["zero"].token_ids == []
    for name, needle in [
        ("empty", "empty"),
        ("range", "ints in"),
        ("banned", "banned"),
        ("temp", "temperature"),
        ("top_p", "top_p"),
    ]:
        assert results[name].finish_reason == "error" and needle in results[name].error, name


def test_a_failing_step_errors_its_rows_and_the_engine_recovers(engine, small_policy, monkeypatch):
    prompt = prompts(small_policy, 1)[0]
    loop = engine._decode_loop
    real_forward = loop._forward
    calls = {"n": 0}

    def flaky_forward(*args):
        calls["n"] += 1
        if calls["n"] == 3:  # the prefill, a decode step, then this one
            raise RuntimeError("boom")
        return real_forward(*args)

    monkeypatch.setattr(loop, "_forward", flaky_forward)
    failed = run(
        generate_all(engine, [GenerationRequest(f"f{i}", prompt, SamplingParams(max_new_tokens=8)) for i in range(2)])
    )
    # the rows live at the failing step get the error; a row admitted later may finish normally
    errored = [r for r in failed if r.finish_reason == "error"]
    assert errored and all("boom" in r.error for r in errored)
    assert all(r.finish_reason in ("error", "length", "stop") for r in failed)
    assert all(len(r.token_ids) == len(r.logprobs) for r in failed)
    after = run(engine.generate(GenerationRequest("after", prompt, SamplingParams(max_new_tokens=4))))
    assert after.finish_reason == "length"


def test_cancelled_requests_free_their_slot(engine, small_policy):
    prompt = prompts(small_policy, 1)[0]

    async def main():
        doomed = asyncio.ensure_future(
            engine.generate(GenerationRequest("x", prompt, SamplingParams(max_new_tokens=2000)))
        )
        await asyncio.sleep(0.05)
        doomed.cancel()
        done = await engine.generate(GenerationRequest("y", prompt, SamplingParams(max_new_tokens=3)))
        return doomed, done

    doomed, done = run(main())
    assert doomed.cancelled() and done.finish_reason == "length"
    assert engine.stats["generated_tokens"] < 2000


def test_seeded_requests_repeat_regardless_of_batch_mates(engine, small_policy):
    prompt = prompts(small_policy, 2)[1]
    seeded = GenerationRequest("s", prompt, SamplingParams(max_new_tokens=10, seed=123))
    alone = run(engine.generate(seeded))
    crowd = run(
        generate_all(
            engine, [seeded] + [GenerationRequest(f"n{i}", prompt, SamplingParams(max_new_tokens=10)) for i in range(3)]
        )
    )
    assert crowd[0].token_ids == alone.token_ids


def test_close_joins_the_worker_and_later_calls_abort(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=2)
    prompt = prompts(small_policy, 1)[0]

    async def main():
        first = await engine.generate(GenerationRequest("a", prompt, SamplingParams(max_new_tokens=2)))
        running = asyncio.ensure_future(
            engine.generate(GenerationRequest("b", prompt, SamplingParams(max_new_tokens=5000)))
        )
        await asyncio.sleep(0.05)
        await engine.close()
        late = await engine.generate(GenerationRequest("c", prompt, SamplingParams(max_new_tokens=2)))
        return first, await running, late

    first, running, late = run(main())
    assert first.finish_reason == "length"
    assert running.finish_reason == "abort" and late.finish_reason == "abort"
    assert not worker_threads()


def test_bfloat16_engine_and_lora_policy(small_policy):
    policy = load_policy(SMALL_TINY, lora={"r": 4})
    with torch.no_grad():  # a non-trivial adapter, value rows included
        for name, param in policy.model.named_parameters():
            if "lora_B" in name or "trainable_tokens" in name:
                param.add_(torch.randn_like(param) * 0.05)
    prompt = prompts(policy, 1)[0]
    engine = HFEngine.from_policy(policy)
    result = run(engine.generate(GenerationRequest("l", prompt, SamplingParams(max_new_tokens=8))))
    engine.close_sync()
    expected = scored_logprobs(policy.model, prompt, result.token_ids, policy.banned_token_ids, 1.0)
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)

    half = HFEngine.from_policy(policy, dtype="bfloat16")
    result = run(half.generate(GenerationRequest("h", prompt, SamplingParams(max_new_tokens=8))))
    half.close_sync()
    assert result.finish_reason == "length" and len(result.token_ids) == 8
    expected = scored_logprobs(policy.model, prompt, result.token_ids, policy.banned_token_ids, 1.0)
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=0.1)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_local_model_folders_generate_what_score_says(model_folder, arch):
    policy = load_policy(str(model_folder(arch)))
    engine = HFEngine.from_policy(policy, max_batch_size=3)
    requests = [
        GenerationRequest(f"{arch}{i}", p, SamplingParams(max_new_tokens=4 + 3 * i))
        for i, p in enumerate(prompts(policy, 5))
    ]
    results = run(generate_all(engine, requests))
    engine.close_sync()
    for request, result in zip(requests, results):
        assert not set(result.token_ids) & set(policy.banned_token_ids)
        expected = scored_logprobs(policy.model, request.prompt_ids, result.token_ids, policy.banned_token_ids, 1.0)
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)


def test_engine_model_copy_still_handles_ordinary_padded_forwards(small_policy):
    engine = HFEngine.from_policy(small_policy)
    copy = engine._decode_loop.model
    ids = torch.randint(20, 2000, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[1, 6:] = 0
    with torch.no_grad():
        expected = small_policy.model(ids, attention_mask=mask).logits
        got = copy(ids, attention_mask=mask).logits
    engine.close_sync()
    assert torch.allclose(expected[mask.bool()], got[mask.bool()], atol=1e-5)


def test_malformed_request_objects_get_an_error_result(engine, small_policy):
    broken = GenerationRequest("broken", prompts(small_policy, 1)[0], sampling=None)  # type: ignore[arg-type]
    result = run(engine.generate(broken))
    assert result.finish_reason == "error" and "invalid request" in result.error
    fine = run(
        engine.generate(GenerationRequest("fine", prompts(small_policy, 1)[0], SamplingParams(max_new_tokens=2)))
    )
    assert fine.finish_reason == "length"


def test_identical_prompts_are_prefilled_once(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=8)
    loop = engine._decode_loop  # driven directly: one admission, no worker timing involved
    shared, other = prompts(small_policy, 3)[1:]
    requests = [GenerationRequest(f"g{i}", shared, SamplingParams(max_new_tokens=6)) for i in range(6)]
    requests.append(GenerationRequest("o", other, SamplingParams(max_new_tokens=6)))
    results = {}
    loop.admit([(request, lambda result: results.setdefault(result.request_id, result)) for request in requests])
    while loop.live:
        loop.step()
    assert loop.stats["prefill_tokens"] == len(shared) + len(other)
    assert len({tuple(results[f"g{i}"].token_ids) for i in range(6)}) > 1  # still sampled independently
    for request in requests:
        result = results[request.request_id]
        expected = scored_logprobs(
            small_policy.model, request.prompt_ids, result.token_ids, small_policy.banned_token_ids, 1.0
        )
        assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)


def test_on_token_hears_each_id_as_it_is_sampled_on_the_callers_loop(engine, small_policy):
    """A streamed answer (``GenerationRequest.on_token``): every id, in order, on the caller's event
    loop thread, and the result is the same as without a listener."""
    async def main():
        loop_thread = threading.get_ident()
        heard: list[tuple[int, int]] = []
        sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=5)
        prompt = prompts(small_policy, 1)[0]
        streamed = await engine.generate(GenerationRequest("a", prompt, sampling,
                                                           on_token=lambda token: heard.append((token, threading.get_ident()))))
        plain = await engine.generate(GenerationRequest("b", prompt, sampling))
        return heard, streamed, plain, loop_thread

    heard, streamed, plain, loop_thread = run(main())
    assert [token for token, _ in heard] == streamed.token_ids == plain.token_ids
    assert {thread for _, thread in heard} == {loop_thread}
