"""The engine hands over the input of a decoder block at every id it fed, equal to what the
model's own forward computes there (prefix reuse and shared prompt prefixes included), and the
learner's forward from those inputs gives the full forward's log-probs and gradients."""

from __future__ import annotations

import pytest
import torch

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams, load_policy
from streamrl.policy.scoring import forward_for_loss

from .test_engine_prefix_reuse import play

#: SmolLM2-135M's block shape (576 wide, 9 query and 3 KV heads of 64, 1,536-wide MLP, tied head),
#: with 4 blocks instead of 30 and the tiny vocabulary
SMOLLM2_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                     head_dim=64, num_hidden_layers=4, rope_theta=100000.0, rms_norm_eps=1e-5)


@pytest.fixture(scope="module")
def smollm2_shaped(tmp_path_factory):
    import transformers

    from streamrl.policy.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=2048, tie_word_embeddings=True,
                                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                      **SMOLLM2_SHAPE)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("smollm2_shaped")
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _policy(name, smollm2_shaped, lora=None):
    spec = smollm2_shaped if name == "smollm2_shaped" else "tiny:hidden=64,layers=4,heads=4,kv_heads=2,intermediate=128"
    return load_policy(spec, seed=0, lora=lora, value_tokens=False)


def _block_input(model, ids, block):
    """The model's own input of ``block`` at every position of ``ids`` (transformers' hidden states)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[block][0]


@pytest.mark.parametrize("name", ["tiny", "smollm2_shaped"])
def test_engine_block_inputs_are_the_models_own(name, smollm2_shaped):
    policy = _policy(name, smollm2_shaped)
    engine = HFEngine.from_policy(policy, max_batch_size=4, capture_layer=2)
    assert engine.block_inputs_layer == 2
    loop = engine._decode_loop
    system = "You are in a room with many things in it. " * 4  # a common prefix: prefilled once, shared
    prompts = [policy.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": f"task {i}"}])
               for i in range(3)]
    requests = [GenerationRequest(f"r{i}", p, SamplingParams(max_new_tokens=4 + 3 * i)) for i, p in enumerate(prompts)]
    results = play(loop, requests)
    # the next turn of episode 0 extends its transcript: only the new ids are prefilled
    follow = prompts[0] + results[0].token_ids + policy.encode_chat([{"role": "user", "content": "next"}])[1:]
    results += play(loop, [GenerationRequest("next", follow, SamplingParams(max_new_tokens=5))])
    assert loop.stats["reused_tokens"] > len(prompts[0])  # both kinds of reuse happened
    for request, result in zip([*requests, GenerationRequest("next", follow)], results):
        fed = request.prompt_ids + result.token_ids[:-1]
        assert result.block_inputs_layer == 2
        assert result.block_inputs.shape == (len(fed), policy.model.config.hidden_size)
        expected = _block_input(policy.model, fed, 2)
        scale = float(expected.abs().max())
        assert float((result.block_inputs - expected).abs().max()) <= 1e-5 * max(scale, 1.0), request.request_id


def test_no_block_inputs_unless_asked(small_policy):
    engine = HFEngine.from_policy(small_policy, max_batch_size=2)
    assert engine.block_inputs_layer is None
    (result,) = play(engine._decode_loop, [GenerationRequest("a", small_policy.encode_chat([{"role": "user", "content": "hi"}]),
                                                              SamplingParams(max_new_tokens=3))])
    assert result.block_inputs is None and result.block_inputs_layer is None


@pytest.mark.parametrize("name", ["tiny", "smollm2_shaped"])
def test_forward_from_block_inputs_equals_the_full_forward(name, smollm2_shaped):
    """Log-probs and LoRA gradients of the top blocks, right-padded rows of different lengths,
    block inputs known only at the ids fed (the last id of each row never is)."""
    policy = _policy(name, smollm2_shaped, lora={"r": 4})
    policy.limit_training(top_layers=2, value_rows=False)
    with torch.no_grad():  # adapters away from their zero start, so every LoRA matrix gets a gradient
        for key, parameter in policy.model.named_parameters():
            if "lora_B" in key:
                parameter.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    first = 2
    generator = torch.Generator().manual_seed(0)
    lengths = [23, 17]
    ids = torch.zeros(2, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(10, 400, (n,), generator=generator)
        mask[row, :n] = 1
    token_mask = mask.bool().clone()
    token_mask[:, :5] = False  # a prompt: only later ids are scored
    inputs = torch.zeros(2, ids.shape[1], policy.model.config.hidden_size)
    for row, n in enumerate(lengths):
        inputs[row, : n - 1] = _block_input(policy.model, ids[row, : n - 1].tolist(), first)

    def run(block_inputs):
        policy.model.zero_grad()
        out = forward_for_loss(policy.model, ids, mask, token_mask=token_mask, block_inputs=block_inputs)
        (out.logprobs.sum() + out.entropy.sum()).backward()
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}
        return out.logprobs.detach(), grads

    full_logprobs, full_grads = run(None)
    logprobs, grads = run((first, inputs))
    assert len(full_grads) == 2 * 4 * 2  # A and B of q/k/v/o in the 2 trained blocks
    assert all(float(grad.abs().max()) > 0 for grad in full_grads.values())
    assert torch.allclose(logprobs, full_logprobs, atol=1e-4)
    for key, grad in full_grads.items():
        assert torch.allclose(grads[key], grad, atol=1e-4, rtol=1e-3), key
    # the inputs are what the result is computed from: other inputs, other log-probs
    other, _ = run((first, inputs * 0.5))
    assert not torch.allclose(other, full_logprobs, atol=1e-2)


def test_set_threads_reaches_the_worker(small_policy, monkeypatch):
    """The engine's worker applies a thread count given while it runs (an evaluation takes the
    learner's cores, a learner step hands them back), in its own thread (OpenMP keeps it per thread)."""
    import asyncio
    import threading

    calls = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append((threading.current_thread().name, n)), real(n)))
    engine = HFEngine.from_policy(small_policy, threads=1)
    prompt = small_policy.encode_chat([{"role": "user", "content": "hi"}])

    async def main():
        await engine.generate(GenerationRequest("a", prompt, SamplingParams(max_new_tokens=2)))
        engine.set_threads(2)
        await engine.generate(GenerationRequest("b", prompt, SamplingParams(max_new_tokens=2)))
        await engine.close()

    asyncio.run(main())
    assert calls == [("streamrl-hf-engine", 1), ("streamrl-hf-engine", 2)]
    with pytest.raises(ValueError, match="threads must be >= 1"):
        engine.set_threads(0)
