"""Shared fixtures: a small tiny policy (fast) and local Hugging Face model folders."""

from __future__ import annotations

import pytest

SMALL_TINY = "tiny:hidden=64,layers=2,heads=4,kv_heads=2,intermediate=128"


@pytest.fixture(scope="session")
def small_policy():
    from streamrl.policy import load_policy

    return load_policy(SMALL_TINY, seed=0)


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory):
    """``model_folder(arch)``: a random llama / qwen2 / qwen3 model saved with save_pretrained,
    with the tiny tokenizer and its ChatML template (the llama one has 16 padding vocab rows)."""
    import transformers

    from streamrl.policy.tiny import load_tiny_tokenizer

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, 16),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, 0),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, 0),
    }
    made = {}

    def make(arch: str):
        if arch not in made:
            config_class, model_class, padding = classes[arch]
            tokenizer = load_tiny_tokenizer()
            config = config_class(
                vocab_size=len(tokenizer) + padding,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                max_position_embeddings=512,
                tie_word_embeddings=True,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            folder = tmp_path_factory.mktemp(arch)
            model_class(config).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            made[arch] = folder
        return made[arch]

    return make


@pytest.fixture(scope="session")
def hf_folder(model_folder):
    return model_folder("llama")
