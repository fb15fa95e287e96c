"""``VLLMEngine``'s adapter logic against a fake of the vLLM surface it uses (request building,
log-prob extraction, banned ids, weight-update mapping, version switching between requests); the
real vLLM tests at the end are marked ``gpu``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from streamrl.policy.protocols import GenerationRequest, SamplingParams
from streamrl.policy.vllm_engine import VLLMEngine, engine_weights, sampling_kwargs, to_result

VOCAB, BANNED = 12, (10, 11)
NAMES = ("embed.weight", "head.weight")


def _output(token_ids, logprobs, finish="stop", text=""):
    positions = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(token_ids, logprobs)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=token_ids, logprobs=positions, finish_reason=finish,
                                                    text=text)])


class FakeVLLM:
    """Emits ids from the allowed set, offset by the loaded weights' ``head.weight[0]``; stops at a
    stop id or ``max_tokens``. ``hold`` keeps a request running until it is set."""

    def __init__(self):
        self.offset = 0
        self.loads = []
        self.aborted = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.shut = False

    def sampling_params(self, **kwargs):
        return SimpleNamespace(**kwargs)

    async def generate(self, prompt_ids, params, request_id):
        await self.hold.wait()
        allowed = params.allowed_token_ids
        ids, lps = [], []
        for step in range(params.max_tokens):
            token = allowed[(len(prompt_ids) + step + self.offset) % len(allowed)]
            ids.append(token)
            lps.append(-0.25 * (step + 1))
            yield _output(list(ids), list(lps), None)
            if token in params.stop_token_ids:
                break
        yield _output(ids, lps, "stop" if ids[-1] in params.stop_token_ids else "length", text="x" * len(ids))

    async def abort(self, request_id):
        self.aborted.append(request_id)

    async def load_weights(self, weights):
        await asyncio.sleep(0)
        self.loads.append([name for name, _ in weights])
        self.offset = int(dict(weights)["head.weight"][0])

    def shutdown(self):
        self.shut = True


def _engine(fake):
    return VLLMEngine(fake, vocab_size=VOCAB, banned_token_ids=BANNED, weight_names=NAMES)


def _weights(offset):
    return {"embed.weight": torch.zeros(2), "head.weight": torch.full((2,), float(offset))}


def test_request_building_bans_value_tokens_through_allowed_ids():
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5, stop_token_ids=(3,), stop_strings=("</a>",),
                              seed=4)
    kwargs = sampling_kwargs(sampling, [0, 1, 2])
    assert kwargs == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 5, "stop_token_ids": [3], "stop": ["</a>"],
                      "seed": 4, "logprobs": 0, "allowed_token_ids": [0, 1, 2]}
    engine = _engine(FakeVLLM())
    assert engine._allowed == list(range(10))


def test_log_prob_extraction_and_finish_reasons():
    result = to_result("r", _output([4, 2], [-0.5, -1.5], "length", "ab"), 3)
    assert (result.token_ids, result.logprobs, result.finish_reason, result.policy_version, result.text) == (
        [4, 2], [-0.5, -1.5], "length", 3, "ab")
    missing = _output([4, 2], [-0.5, -1.5])
    missing.outputs[0].logprobs[1] = {7: SimpleNamespace(logprob=-2.0)}  # not the sampled token
    assert to_result("r", missing, 0).finish_reason == "error"
    short = _output([4, 2], [-0.5])
    assert "1 log-prob positions for 2 tokens" in to_result("r", short, 0).error
    assert to_result("r", None, 0).finish_reason == "error"
    assert to_result("r", _output([1], [-0.1], None), 0).finish_reason == "error"


def test_weight_mapping_checks_names_and_copies():
    state = _weights(2)
    pairs = engine_weights(state, set(NAMES))
    state["head.weight"].add_(5)  # the trainer keeps training right after
    assert dict(pairs)["head.weight"].tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="missing \\['embed.weight'\\]"):
        engine_weights({"head.weight": torch.zeros(2)}, set(NAMES))
    with pytest.raises(ValueError, match="unexpected \\['lora_A'\\]"):
        engine_weights({**_weights(0), "lora_A": torch.zeros(1)}, set(NAMES))


def test_generate_token_ids_and_behaviour_logprobs():
    async def main():
        fake = FakeVLLM()
        engine = _engine(fake)
        result = await engine.generate(GenerationRequest("a", [1, 2], SamplingParams(max_new_tokens=4, stop_token_ids=(5,))))
        await engine.close()
        return fake, result

    fake, result = asyncio.run(main())
    assert result.token_ids == [2, 3, 4, 5] and result.finish_reason == "stop"
    assert result.logprobs == [-0.25, -0.5, -0.75, -1.0] and result.policy_version == 0
    assert fake.shut


def test_weights_swap_between_requests_and_versions_per_result():
    async def main():
        fake = FakeVLLM()
        engine = _engine(fake)
        fake.hold.clear()
        running = asyncio.create_task(engine.generate(GenerationRequest("old", [0], SamplingParams(max_new_tokens=2))))
        await asyncio.sleep(0.01)
        engine.update_weights(_weights(3), version=1)
        engine.update_weights(_weights(4), version=2)  # a newer version before the swap: only it is loaded
        assert engine.version == 2
        queued = asyncio.create_task(engine.generate(GenerationRequest("new", [0], SamplingParams(max_new_tokens=2))))
        await asyncio.sleep(0.01)
        assert fake.loads == []  # the running request finishes under the old weights first
        fake.hold.set()
        old, new = await running, await queued
        await engine.close()
        return fake, old, new

    fake, old, new = asyncio.run(main())
    assert old.policy_version == 0 and old.token_ids == [1, 2]
    assert new.policy_version == 2 and new.token_ids == [5, 6]
    assert fake.loads == [list(NAMES)]


def test_cancelled_request_is_aborted_in_vllm():
    async def main():
        fake = FakeVLLM()
        engine = _engine(fake)
        fake.hold.clear()
        task = asyncio.create_task(engine.generate(GenerationRequest("gone", [0], SamplingParams())))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        await engine.close()
        return fake

    assert asyncio.run(main()).aborted == ["gone"]


# -- real vLLM -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real():
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from streamrl.policy.loading import load_policy

    policy = load_policy("tiny", device="cuda", seed=0)
    engine = VLLMEngine.from_policy(policy, seed=0, gpu_memory_utilization=0.2, enforce_eager=True)
    yield policy, engine
    asyncio.run(engine.close())


@pytest.mark.gpu
def test_vllm_logprobs_match_the_policy_and_never_sample_value_tokens(real):
    policy, engine = real
    prompt = policy.encode_chat([{"role": "user", "content": "say ok"}])

    async def main():
        requests = [GenerationRequest(f"g{i}", prompt, SamplingParams(max_new_tokens=16, seed=i)) for i in range(32)]
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    results = asyncio.run(main())
    banned = set(policy.banned_token_ids)
    assert all(r.finish_reason in ("stop", "length") and r.token_ids for r in results)
    assert not any(banned & set(r.token_ids) for r in results)
    with torch.no_grad():
        for result in results[:4]:
            ids = torch.tensor([prompt + result.token_ids], device="cuda")
            logits = policy.model(ids).logits[0, len(prompt) - 1 : -1].float()
            logits[:, list(banned)] = float("-inf")
            expected = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt):, None])[:, 0]
            assert torch.allclose(torch.tensor(result.logprobs, device="cuda"), expected, atol=5e-2)


@pytest.mark.gpu
def test_vllm_update_weights_in_place(real):
    policy, engine = real
    prompt = policy.encode_chat([{"role": "user", "content": "say ok"}])
    request = GenerationRequest("w", prompt, SamplingParams(temperature=0.0, max_new_tokens=8))

    async def main():
        before = await engine.generate(request)
        state = {k: torch.randn_like(v) * 0.5 for k, v in policy.state_dict_for_engine().items()}
        engine.update_weights(state, version=7)
        after = await engine.generate(GenerationRequest("w2", prompt, request.sampling))
        return before, after

    before, after = asyncio.run(main())
    assert before.policy_version == 0 and after.policy_version == 7
    assert before.token_ids != after.token_ids


def test_make_engine_builds_the_configured_engine():
    from streamrl.policy.engines import make_engine
    from streamrl.policy.hf_engine import HFEngine
    from streamrl.policy.loading import load_policy

    policy = load_policy("tiny", model_overrides={"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64})
    engine = make_engine("hf", policy, version=5, threads=1)
    assert isinstance(engine, HFEngine) and engine.version == 5
    engine.close_sync()
    with pytest.raises(ValueError, match="model.engine must be one of hf, vllm, got 'sglang'"):
        make_engine("sglang", policy)


def test_without_vllm_the_error_names_the_install(monkeypatch):
    import sys

    from streamrl.policy.errors import MissingDependencyError
    from streamrl.policy.vllm_engine import RealVLLM

    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without the extra
    with pytest.raises(MissingDependencyError, match=r"pip install -e '\.\[vllm\]'"):
        RealVLLM("some/folder")
