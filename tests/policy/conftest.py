"""Shared fixtures: a small tiny policy (fast) and a local Hugging Face model folder."""

from __future__ import annotations

import pytest

SMALL_TINY = "tiny:hidden=64,layers=2,heads=4,kv_heads=2,intermediate=128"


@pytest.fixture(scope="session")
def small_policy():
    from streamrl.policy import load_policy

    return load_policy(SMALL_TINY, seed=0)


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory):
    """A random Llama saved with save_pretrained, plus a tokenizer with a ChatML template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from streamrl.policy.tiny import load_tiny_tokenizer

    folder = tmp_path_factory.mktemp("hf_model")
    tokenizer = load_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer) + 16,  # padded vocabulary: rows without a token
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
