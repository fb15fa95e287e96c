"""Per-token log-probs, entropy and SAPO value logits of given sequences, with or without grad.

Alignment: ``logprobs[b, t] = log pi(ids[b, t] | ids[b, :t])`` over the action vocabulary (the
vocabulary without ``excluded_ids``), computed from the logits at position ``t - 1``;
``entropy[b, t]`` is the entropy of that same distribution. Position 0 predicts nothing.

Value logits: ``value_logits[b, t] = (z[w+], z[w-])``, the LM-head logits of the two value tokens at
position ``t`` itself (a causal boundary is the *last* token of a context). Squash them with
``streamrl.algos.values.value_readout(value_logits, 0, 1, r_max, tau)``; the raw difference is
``ScoreOutput.value_logit_diff``.

Rows are right-padded (``attention_mask``), or packed: several sequences per row, told apart by
``segment_ids`` (1, 2, ... per sequence, 0 for padding); positions restart in each segment and
attention never crosses segments.

Memory: the decoder runs once; the LM head runs only on the hidden states of scored positions
(``token_mask``) and value positions, so ``[N, V]`` logits exist for N scored tokens only, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from streamrl.algos.vocab import action_log_probs, action_log_probs_and_entropy
from streamrl.policy.modeling import (
    as_attention_bias,
    blocks_from,
    decoder_and_head,
    packed_attention_mask,
    position_ids_from_mask,
    segment_positions,
)


@dataclass
class ScoreOutput:
    #: ``[B, T]`` float32; 0 where not scored
    logprobs: torch.Tensor
    #: ``[B, T]`` float32 or None; 0 where not scored
    entropy: torch.Tensor | None
    #: ``[B, T, 2]`` float32 ``(z[w+], z[w-])`` at ``value_mask`` positions (0 elsewhere), or None
    value_logits: torch.Tensor | None

    @property
    def value_logit_diff(self) -> torch.Tensor | None:
        """``[B, T]``: ``z[w+] - z[w-]``, SAPO's readout before scaling and squashing."""
        return None if self.value_logits is None else self.value_logits[..., 0] - self.value_logits[..., 1]


def default_token_mask(attention_mask: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Every token that has a real predecessor in the same sequence: ``[B, T]`` bool."""
    if segment_ids is not None:
        mask = segment_ids > 0
        mask[:, 1:] &= segment_ids[:, 1:] == segment_ids[:, :-1]
    else:
        mask = attention_mask.bool().clone()
        mask[:, 1:] &= attention_mask[:, :-1].bool()
    mask[:, 0] = False
    return mask


def forward_for_loss(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    token_mask: torch.Tensor | None = None,
    excluded_ids: Sequence[int] = (),
    value_token_ids: tuple[int, int] | None = None,
    value_mask: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = True,
    block_inputs: tuple[int, torch.Tensor] | None = None,
) -> ScoreOutput:
    """One differentiable forward pass (what learners call inside their loss).

    Args:
        input_ids, attention_mask: ``[B, T]`` (all inputs are moved to the model's device, and the
            outputs come back on ``input_ids``' device, differentiably: the loss math around a
            GPU model stays on the CPU tensors of the batch).
        token_mask: ``[B, T]``, which tokens to score (default: all with a real predecessor).
            Column 0 must be False: nothing predicts the first token.
        excluded_ids: ids outside the action vocabulary (``Policy.banned_token_ids``).
        value_token_ids, value_mask: read the value logits at ``value_mask`` ``[B, T]`` positions.
        segment_ids: ``[B, T]`` for packed rows (see the module docstring).
        temperature: the sampling temperature the log-probs should match (engine behaviour log-probs).
        block_inputs: ``(first, hidden [B, T, H])``, the input of block ``first`` at every position
            (the engine's, ``GenerationResult.block_inputs``): the blocks below it are not run.
            Right-padded rows only; a position's result depends on the inputs at it and before.
    """
    _check_inputs(input_ids, attention_mask, token_mask, value_mask, segment_ids, value_token_ids, temperature)
    decoder, head = decoder_and_head(model)
    device, origin = next(decoder.parameters()).device, input_ids.device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    token_mask, value_mask, segment_ids = (
        None if t is None else t.to(device) for t in (token_mask, value_mask, segment_ids)
    )
    if block_inputs is not None:
        if segment_ids is not None:
            raise ValueError("block_inputs take right-padded rows, not packed ones (segment_ids)")
        first, inputs = block_inputs
        inputs = inputs.to(device=device, dtype=next(decoder.parameters()).dtype)
        hidden = blocks_from(decoder, inputs, attention_mask, first)  # [B, T, H]
    else:
        if segment_ids is not None:
            position_ids = segment_positions(segment_ids)
            mask_arg: torch.Tensor = as_attention_bias(
                packed_attention_mask(segment_ids), decoder, next(decoder.parameters()).dtype
            )
        else:
            position_ids = position_ids_from_mask(attention_mask)
            mask_arg = attention_mask
        hidden = decoder(input_ids=input_ids, attention_mask=mask_arg, position_ids=position_ids, use_cache=False)
        hidden = hidden.last_hidden_state  # [B, T, H]

    scored = default_token_mask(attention_mask, segment_ids) if token_mask is None else token_mask.bool()
    rows, cols = scored.nonzero(as_tuple=True)
    logits = head(hidden[rows, cols - 1])  # [N, V]
    if temperature != 1.0:
        logits = logits / temperature
    shape = input_ids.shape
    tokens = input_ids[rows, cols]
    if with_entropy:
        token_logprobs, token_entropies = action_log_probs_and_entropy(logits, tokens, excluded_ids)
        entropies = _scatter(shape, rows, cols, token_entropies)
    else:
        token_logprobs, entropies = action_log_probs(logits, tokens, excluded_ids), None
    logprobs = _scatter(shape, rows, cols, token_logprobs)

    value_logits = None
    if value_mask is not None and value_token_ids is not None:
        value_rows, value_cols = value_mask.bool().nonzero(as_tuple=True)
        pair = head(hidden[value_rows, value_cols])[:, list(value_token_ids)].float()  # [M, 2]
        value_logits = pair.new_zeros((*shape, 2)).index_put((value_rows, value_cols), pair)
    return ScoreOutput(
        logprobs.to(origin),
        None if entropies is None else entropies.to(origin),
        None if value_logits is None else value_logits.to(origin),
    )


@torch.no_grad()
def score(
    model: Any,
    batch: Mapping[str, torch.Tensor],
    *,
    micro_batch_size: int = 8,
    excluded_ids: Sequence[int] = (),
    value_token_ids: tuple[int, int] | None = None,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> ScoreOutput:
    """``forward_for_loss`` without grad, in micro-batches of rows (e.g. ``l_old``, ``l_ref``, V_old).

    ``batch``: ``input_ids`` and ``attention_mask`` ``[B, T]``; optional ``token_mask``,
    ``value_mask``, ``segment_ids`` ``[B, T]``. Each micro-batch is cut to its longest row.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    missing = {"input_ids", "attention_mask"} - set(batch)
    if missing:
        raise ValueError(f"score: batch is missing {sorted(missing)}")
    if batch["input_ids"].shape[0] == 0:
        raise ValueError("score: the batch has no rows")
    was_training = model.training
    model.eval()
    try:
        parts = [
            _score_rows(
                model,
                batch,
                slice(start, start + micro_batch_size),
                excluded_ids,
                value_token_ids,
                temperature,
                with_entropy,
            )
            for start in range(0, batch["input_ids"].shape[0], micro_batch_size)
        ]
    finally:
        model.train(was_training)
    length = batch["input_ids"].shape[1]
    # every part was scored with the same options: all have entropies (with_entropy), and value
    # logits when the first has them
    return ScoreOutput(
        torch.cat([_pad_to(p.logprobs, length) for p in parts]),
        torch.cat([_pad_to(cast(torch.Tensor, p.entropy), length) for p in parts]) if with_entropy else None,
        torch.cat([_pad_to(cast(torch.Tensor, p.value_logits), length) for p in parts])
        if parts[0].value_logits is not None
        else None,
    )


def _score_rows(
    model: Any,
    batch: Mapping[str, torch.Tensor],
    rows: slice,
    excluded_ids: Sequence[int],
    value_token_ids: tuple[int, int] | None,
    temperature: float,
    with_entropy: bool,
) -> ScoreOutput:
    attention_mask = batch["attention_mask"][rows]
    used = attention_mask.bool().any(0).nonzero()
    end = int(used.max()) + 1 if used.numel() else 1

    def part(key: str) -> torch.Tensor | None:
        return batch[key][rows, :end] if key in batch and batch[key] is not None else None

    return forward_for_loss(
        model,
        batch["input_ids"][rows, :end],
        attention_mask[:, :end],
        token_mask=part("token_mask"),
        excluded_ids=excluded_ids,
        value_token_ids=value_token_ids,
        value_mask=part("value_mask"),
        segment_ids=part("segment_ids"),
        temperature=temperature,
        with_entropy=with_entropy,
    )


def _scatter(shape: torch.Size, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return values.new_zeros(shape).index_put((rows, cols), values)


def _pad_to(tensor: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - tensor.shape[1]
    if missing == 0:
        return tensor
    return torch.cat([tensor, tensor.new_zeros((tensor.shape[0], missing, *tensor.shape[2:]))], dim=1)


def _check_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_mask: torch.Tensor | None,
    value_mask: torch.Tensor | None,
    segment_ids: torch.Tensor | None,
    value_token_ids: tuple[int, int] | None,
    temperature: float,
) -> None:
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
    for name, tensor in (
        ("attention_mask", attention_mask),
        ("token_mask", token_mask),
        ("value_mask", value_mask),
        ("segment_ids", segment_ids),
    ):
        if tensor is not None and tensor.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, input_ids {tuple(input_ids.shape)}")
    if token_mask is not None and bool(token_mask[:, 0].any()):
        raise ValueError("token_mask marks column 0, but nothing predicts a row's first token")
    if value_mask is not None and value_token_ids is None:
        raise ValueError("value_mask given without value_token_ids")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for scoring, got {temperature}")
