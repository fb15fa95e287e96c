"""FusedDecoder: the engine's own forward equals transformers' (Llama, Qwen2 with q/k/v bias, Qwen3
with q/k norms), also after new weights are loaded; other structures keep transformers' forward."""

from __future__ import annotations

import copy

import pytest
import torch

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams, fused_forward, load_policy
from streamrl.policy.fused_forward import FusedDecoder
from streamrl.policy.kv_cache import SlabCache, SlabPrefill
from streamrl.policy.modeling import cache_argument, decoder_and_head
from streamrl.policy.prefill import layout

from .conftest import SMALL_TINY


def _model(source, arch):
    policy = load_policy(SMALL_TINY, seed=0) if arch == "tiny" else load_policy(str(source(arch)))
    return copy.deepcopy(policy.model).eval().requires_grad_(False)


def _hf_forward(model, ids, mask, positions, cache):
    decoder, _ = decoder_and_head(model)
    return decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                   **{cache_argument(decoder): cache}).last_hidden_state


def _prefill_then_decode(forward, model):
    """Last hidden states of a left-padded prefill and of one decode step over a slab, and the KV."""
    config = model.config
    ids, mask, positions, _ = layout([[5, 6, 7, 8, 9, 10], [11, 12, 13]], [6, 3])
    head_dim = config.head_dim if getattr(config, "head_dim", None) else config.hidden_size // config.num_attention_heads
    slab = SlabCache(config.num_hidden_layers, config.num_key_value_heads, head_dim, torch.float32, "cpu")
    slab.relayout(2, 16, shift=6)
    first = forward(ids, mask[:, None], positions, SlabPrefill(slab, [0, 1], 6))[:, -1]
    slab.occupy(0, 6)
    slab.occupy(1, 3)
    slab.lo = 0
    step = forward(torch.tensor([[14], [15]]), slab.step_mask(torch.ones(2, dtype=torch.bool)), torch.tensor([[6], [3]]), slab)
    return first, step[:, -1], [kv[:, :, : slab.end + 1] for kv in slab.keys + slab.values]  # columns written


@pytest.mark.parametrize("pack", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("arch", ["tiny", "llama", "qwen2", "qwen3"])
def test_fused_forward_equals_transformers(model_folder, arch, pack, monkeypatch):
    if pack:  # every projection through oneDNN's packed weights (by default only a vocabulary-wide head)
        monkeypatch.setattr(fused_forward, "PACK_MIN_OUTPUTS", 1)
    model = _model(model_folder, arch)
    with torch.no_grad():
        expected = _prefill_then_decode(lambda *a: _hf_forward(model, *a), model)
        fused = FusedDecoder.build(model)
        assert fused is not None
        got = _prefill_then_decode(fused, model)
        for want, have in zip(expected[:2], got[:2]):
            assert torch.allclose(want, have, atol=1e-5)
        for want, have in zip(expected[2], got[2]):
            assert torch.allclose(want, have, atol=1e-5)

        # new weights copied into the parameters (update_weights) reach the fused ones, and the
        # packed copies once refreshed (the engine refreshes after every load)
        other = _model(model_folder, arch)
        for parameter in other.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
        model.load_state_dict(other.state_dict())
        fused.refresh()
        expected = _prefill_then_decode(lambda *a: _hf_forward(other, *a), other)
        got = _prefill_then_decode(fused, model)
        assert torch.allclose(expected[0], got[0], atol=1e-5) and torch.allclose(expected[1], got[1], atol=1e-5)


def test_qwen2_fusion_includes_the_qkv_bias(model_folder):
    model = _model(model_folder, "qwen2")
    layer = FusedDecoder.build(model).layers[0]
    assert layer.qkv.bias is not None and layer.qkv.bias.shape[0] == layer.qkv.weight.shape[0]


def test_other_structures_keep_the_transformers_forward():
    lora = load_policy(SMALL_TINY, lora={"r": 4}).model
    assert FusedDecoder.build(lora) is None


def test_engine_with_and_without_fused_forward_agree(small_policy):
    """Greedy continuous batching (rows finishing at different steps, later ones admitted into
    freed slots) gives the same tokens and log-probs either way."""
    prompts = [small_policy.encode_chat([{"role": "user", "content": f"go north {i} times"}]) for i in range(6)]

    def greedy_run(fused: bool) -> dict:
        engine = HFEngine.from_policy(small_policy, max_batch_size=3)
        loop = engine._decode_loop
        if not fused:
            loop._fused = None
        pending = [GenerationRequest(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=3 + 2 * i))
                   for i, p in enumerate(prompts)]
        results = {}
        while pending or loop.live:
            admitted, pending = pending[: loop.free_capacity], pending[loop.free_capacity :]
            loop.admit([(request, lambda r: results.setdefault(r.request_id, r)) for request in admitted])
            loop.step()
        engine.close_sync()
        return results

    fused, plain = greedy_run(True), greedy_run(False)
    assert len(plain) == 6
    for key, result in plain.items():
        assert fused[key].token_ids == result.token_ids
        assert torch.allclose(torch.tensor(fused[key].logprobs), torch.tensor(result.logprobs), atol=1e-5)


def test_weights_are_stored_input_major_and_a_tied_head_stays_tied():
    model = copy.deepcopy(load_policy(SMALL_TINY, seed=0).model).eval().requires_grad_(False)
    decoder, head = decoder_and_head(model)
    assert decoder.embed_tokens.weight is head.weight  # the tiny model ties them
    before = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    fused = FusedDecoder.build(model)
    assert decoder.embed_tokens.weight is head.weight
    layer = decoder.layers[0]
    for linear in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.down_proj, head):
        assert linear.weight.stride(0) == 1  # [in, out] storage, [out, in] parameter view
    assert fused.layers[0].qkv.weight.t().is_contiguous()
    for key, tensor in model.state_dict().items():  # same values
        assert torch.equal(tensor, before[key]), key


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="packing needs oneDNN")
def test_only_vocabulary_wide_projections_are_packed():
    model = copy.deepcopy(load_policy(SMALL_TINY, seed=0).model).eval().requires_grad_(False)
    fused = FusedDecoder.build(model)
    assert all(p.packed is None for p in fused.projections)  # the layers, and a head of 2k outputs
    big = fused_forward.Projection(torch.randn(fused_forward.PACK_MIN_OUTPUTS, 8), None)
    assert big.packed is not None


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="packing needs oneDNN")
def test_packed_weights_follow_new_weights(monkeypatch):
    monkeypatch.setattr(fused_forward, "PACK_MIN_OUTPUTS", 1)  # pack every projection of the small model
    model = copy.deepcopy(load_policy(SMALL_TINY, seed=0).model).eval().requires_grad_(False)
    fused = FusedDecoder.build(model)
    assert all(p.packed is not None for p in fused.projections)
    x = torch.randn(3, model.config.hidden_size)
    gate_up = fused.layers[0].gate_up
    torch.testing.assert_close(gate_up(x), x @ gate_up.weight.t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gate_up(x[:1]), x[:1] @ gate_up.weight.t(), rtol=1e-5, atol=1e-5)  # unpacked
    model.model.layers[0].mlp.up_proj.weight.mul_(2.0)  # in place, as load_state_dict does
    stale = gate_up(x)
    fused.refresh()
    assert not torch.allclose(stale, x @ gate_up.weight.t(), atol=1e-3)
    torch.testing.assert_close(gate_up(x), x @ gate_up.weight.t(), rtol=1e-5, atol=1e-5)
