"""The ``tiny`` policy: a small Llama-style model with random (seeded) weights and a ~2k-token
byte-level BPE tokenizer shipped in ``assets/`` (built by ``scripts/build_tiny_tokenizer.py``).

It is the default policy of a 15-minute CPU run, so it is sized for speed: with a 2k vocabulary the
LM head costs about as much as one transformer block, instead of dominating everything as a
49k vocabulary does.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from streamrl.policy.errors import PolicyLoadError

TOKENIZER_ASSET = "tiny_tokenizer.json"
CHAT_TEMPLATE_ASSET = "tiny_chat_template.jinja"

#: special tokens, in id order from 0; reserved ones are unused control tokens (SAPO value tokens)
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|pad|>",
    *(f"<|reserved_{i}|>" for i in range(8)),
)
#: ordinary (non-special) single tokens for the agent markup, so it survives decoding
MARKUP_TOKENS = ("<think>", "</think>", "<action>", "</action>")
#: the shipped vocabulary file's size (specials, BPE merges and the markup tokens above)
VOCAB_SIZE = 2048
#: tool-calling markup of the chat template (Hermes style), added on load as ordinary (non-special)
#: single tokens, as Qwen2.5 has them: ids VOCAB_SIZE.. in this order, before any entity tokens
TOOL_MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>")

#: the default size; every field can be overridden (short names below, or any LlamaConfig field)
DEFAULT_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 768,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}
SHORT_NAMES = {
    "hidden": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "intermediate": "intermediate_size",
    "max_positions": "max_position_embeddings",
}


def parse_overrides(text: str) -> dict[str, Any]:
    """``"hidden=128,layers=2"`` -> ``{"hidden": 128, "layers": 2}`` (ints, floats, true/false)."""
    overrides: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise PolicyLoadError(
                f"bad model override {item!r} in {text!r}; expected key=value pairs like 'hidden=128'"
            )
        overrides[key.strip()] = _parse_value(raw.strip())
    return overrides


def _parse_value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def tiny_config_dict(overrides: dict[str, Any] | None, tokenizer: Any) -> dict[str, Any]:
    """LlamaConfig keyword arguments for the tiny model, with overrides applied and checked."""
    from transformers import LlamaConfig

    config = dict(DEFAULT_CONFIG)
    known = set(LlamaConfig().to_dict()) | set(SHORT_NAMES) | set(DEFAULT_CONFIG)
    for key, value in (overrides or {}).items():
        if key not in known:
            raise PolicyLoadError(
                f"unknown tiny-model override {key!r}; use one of {sorted(SHORT_NAMES)} or a LlamaConfig field"
            )
        config[SHORT_NAMES.get(key, key)] = value
    if config["hidden_size"] % config["num_attention_heads"]:
        raise PolicyLoadError(
            f"tiny model: hidden={config['hidden_size']} is not divisible by heads={config['num_attention_heads']}"
        )
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise PolicyLoadError(
            f"tiny model: heads={config['num_attention_heads']} is not a multiple of "
            f"kv_heads={config['num_key_value_heads']}"
        )
    config.update(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|pad|>"),
    )
    return config


def build_tiny_model(overrides: dict[str, Any] | None, tokenizer: Any, seed: int, dtype: Any) -> Any:
    """A randomly initialised ``LlamaForCausalLM``; the same seed gives the same weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**tiny_config_dict(overrides, tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def load_tiny_tokenizer(entity_tokens: Sequence[str] = ()) -> Any:
    """The shipped tiny tokenizer, with its ChatML template (Hermes-style tools).

    The tool markup (``TOOL_MARKUP_TOKENS``) is always added after the shipped vocabulary, as
    ordinary tokens that survive decoding, so ``len(tokenizer)`` is ``VOCAB_SIZE + 6`` plus the
    entity tokens.

    ``entity_tokens`` (an environment's ``EnvSpec.entity_tokens``) are added as whole tokens after
    the shipped vocabulary, so an action that copies one from the page copies a single token: a
    one-step match for attention, where the byte-level pieces of an ASIN (``b``, ``0``, ``gs``,
    ``9``, ...) occur all over every page and need a multi-token match.
    """
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    assets = resources.files("streamrl.policy") / "assets"
    tokenizer_file = assets / TOKENIZER_ASSET
    if not tokenizer_file.is_file():
        raise PolicyLoadError(
            f"the tiny tokenizer asset {TOKENIZER_ASSET} is missing from streamrl/policy/assets; "
            "rebuild it with `python scripts/build_tiny_tokenizer.py`"
        )
    with resources.as_file(tokenizer_file) as path:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(path),
            eos_token="<|im_end|>",
            pad_token="<|pad|>",
            unk_token="<|endoftext|>",
            bos_token="<|im_start|>",
        )
    tokenizer.chat_template = (assets / CHAT_TEMPLATE_ASSET).read_text(encoding="utf-8")
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in TOOL_MARKUP_TOKENS])
    if entity_tokens:
        # not normalised: matched exactly as written, wherever they occur in the text
        tokenizer.add_tokens([AddedToken(token, normalized=False) for token in dict.fromkeys(entity_tokens)])
    return tokenizer
