"""A LoRA policy and its engine in one process hold the frozen base weights once: the policy's
frozen parameters become the engine's (views in its fused layout), compute what they computed,
are never copied by ``update_weights``, and a copy of the policy (an export, another engine) gets
storage of its own."""

from __future__ import annotations

import asyncio

import torch
from transformers import AutoModelForCausalLM

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams, load_policy
from streamrl.policy.export import export_policy

SPEC = "tiny:hidden=64,layers=4,heads=4,kv_heads=2,intermediate=128"


def lora_policy():
    policy = load_policy(SPEC, seed=0, lora={"r": 4}, value_tokens=False)
    policy.limit_training(top_layers=2)
    with torch.no_grad():  # adapters that change the weights they wrap
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return policy


def logits(policy, ids):
    with torch.no_grad():
        return policy.model(input_ids=torch.tensor([ids])).logits[0]


def storages(model):
    return {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}


def greedy(engine, prompts):
    async def run():
        requests = [GenerationRequest(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=12)) for i, p in enumerate(prompts)]
        return [r.token_ids for r in await asyncio.gather(*(engine.generate(r) for r in requests))]

    return asyncio.run(run())


def test_the_frozen_base_is_held_once_and_computes_the_same():
    policy = lora_policy()
    ids = policy.encode_chat([{"role": "user", "content": "go to the fridge and open it"}])
    expected = logits(policy, ids)
    base = policy.model.get_base_model()
    frozen = {name: p for name, p in base.named_parameters() if "lora_" not in name and ".base_layer." not in name}
    adapted = {name: p for name, p in base.named_parameters() if ".base_layer." in name}
    engine = HFEngine.from_policy(policy, max_batch_size=2)
    engine_storages = storages(engine._model)
    now = dict(base.named_parameters())
    assert all(now[name].untyped_storage().data_ptr() in engine_storages for name in frozen)
    # the layers LoRA wraps are merged in the engine's copy: the policy keeps its own base for them
    assert not any(now[name].untyped_storage().data_ptr() in engine_storages for name in adapted)
    assert engine.shared_bytes == sum(p.nbytes for p in {id(p): p for p in frozen.values()}.values()) > 0
    assert torch.allclose(logits(policy, ids), expected, atol=1e-5)
    # without sharing, nothing is
    other = lora_policy()
    assert HFEngine.from_policy(other, max_batch_size=2, share_frozen=False).shared_bytes == 0
    assert not storages(other.model) & storages(engine._model)


def test_updates_skip_the_shared_weights_and_generate_what_a_fresh_engine_does(tmp_path):
    policy = lora_policy()
    engine = HFEngine.from_policy(policy, max_batch_size=4)
    trained = [p for p in policy.model.parameters() if p.requires_grad]
    with torch.no_grad():  # what a learner step does: only adapters move
        for parameter in trained:
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(parameter.numel())) * 0.05)
    staged = engine._stage(policy.state_dict_for_engine())
    assert staged and all("proj" in key for key in staged)  # the merged LoRA layers only
    assert not any("mlp" in key or "norm" in key or "embed" in key for key in staged)
    engine.update_weights(policy.state_dict_for_engine(), 1)
    prompts = [policy.encode_chat([{"role": "user", "content": f"task {i}: find the apple"}]) for i in range(3)]
    fresh = HFEngine.from_policy(policy, max_batch_size=4, share_frozen=False)
    assert greedy(engine, prompts) == greedy(fresh, prompts)
    # copies get storage of their own: the exported, merged folder loads and computes the policy
    folder = export_policy(policy, tmp_path / "export")
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = prompts[0]
    with torch.no_grad():
        assert torch.allclose(model(input_ids=torch.tensor([ids])).logits[0], logits(policy, ids), atol=1e-4)
    export_policy(policy, tmp_path / "adapter", adapter=True)  # the tiny base written next to it
