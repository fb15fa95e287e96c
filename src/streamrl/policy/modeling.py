"""Small adapters over Hugging Face causal LMs shared by scoring and the engine.

Both split a model into its decoder (hidden states) and its LM head, so logits are computed only
where they are needed (the last position when generating, action tokens when scoring) instead of
materialising ``[B, T, V]``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from streamrl.policy.lora import is_peft_model


def decoder_and_head(model: Any) -> tuple[Any, Any]:
    """``(decoder, lm_head)`` of a causal LM, a peft wrapper included (its adapters stay active)."""
    base = model.get_base_model() if is_peft_model(model) else model
    return base.get_decoder(), base.get_output_embeddings()


def num_blocks(model: Any) -> int | None:
    """The decoder blocks of ``model`` (None for a config without ``num_hidden_layers``)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(config, "num_hidden_layers", None)
    return None if layers is None else int(layers)


def blocks_from(decoder: Any, hidden: torch.Tensor, attention_mask: torch.Tensor, first: int) -> torch.Tensor:
    """The decoder's last hidden states (after the final norm) computed from the input of block
    ``first``: ``hidden [B, T, H]`` for right-padded rows (``attention_mask [B, T]``) goes through
    blocks ``first..`` as the decoder's own forward would send it. Causal attention alone gives
    every real position the result of the padded forward (padding comes after it), so SDPA runs
    its causal kernel without a mask."""
    position_ids = position_ids_from_mask(attention_mask)
    mask = None
    if getattr(decoder.config, "_attn_implementation", "sdpa") != "sdpa":
        mask = as_attention_bias(packed_attention_mask(attention_mask), decoder, hidden.dtype)
    embeddings = decoder.rotary_emb(hidden, position_ids=position_ids)
    for layer in decoder.layers[first : decoder.config.num_hidden_layers]:
        hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=embeddings)
    return decoder.norm(hidden)


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them:
    training memory no longer grows with layers x tokens, at the price of a second forward.
    Only active in training mode with gradients on, so no-grad scoring and generation are unaffected."""
    base = model.get_base_model() if is_peft_model(model) else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"model.gradient_checkpointing: {type(base).__name__} does not support it")
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.2x renamed it
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def cache_argument(decoder: Any) -> str:
    """The decoder's keyword for the KV cache (``cache`` in transformers >= 5.2x, else ``past_key_values``)."""
    parameters = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only real tokens, so left and right padding give the same positions.

    ``[B, T]`` 0/1 mask -> ``[B, T]`` long, ``0`` on leading padding.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 at each new segment of a packed row: ``[B, T]`` -> ``[B, T]``."""
    index = torch.arange(segment_ids.shape[-1], device=segment_ids.device).expand_as(segment_ids)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(-1).values
    return index - first


def packed_attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask for packed rows: ``[B, T]`` segment ids (0 = padding) ->
    ``[B, 1, T, T]`` bool, True where query ``i`` may attend key ``j``.

    Padding queries attend only themselves, so no softmax row is empty (no NaN)."""
    length = segment_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real_key = (segment_ids > 0)[:, None, :]
    diagonal = torch.eye(length, dtype=torch.bool, device=segment_ids.device)
    return ((causal & same & real_key) | diagonal)[:, None]


def as_attention_bias(mask: torch.Tensor, model: Any, dtype: torch.dtype) -> torch.Tensor:
    """A 4D bool mask in the form the model's attention implementation expects: bool for SDPA,
    additive float (0 / most negative) for eager attention."""
    implementation = getattr(model.config, "_attn_implementation", "sdpa")
    if implementation == "sdpa":
        return mask
    if implementation == "eager":
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    raise ValueError(f"attention implementation {implementation!r} is not supported here; load with sdpa or eager")
