"""Log-probabilities and entropy over the *action* vocabulary (docs/algorithms.md §6.1).

SAPO reserves two token ids (``w+``, ``w-``) for its value readout. The policy must never sample
them, so every policy distribution is normalised over the vocabulary without them:
``log pi(a | c) = z_a - logsumexp_{w not excluded} z_w``. Excluded logits receive exactly zero
gradient from these terms. With no excluded ids this is the ordinary softmax policy.

Memory: logits ``[B, T, V]`` are large (V ~ 150k). Instead of a full ``log_softmax`` (one more
``[B, T, V]`` tensor saved for backward, plus masked copies), both functions work in row chunks
inside custom autograd functions that save only the logits they were given and one or two scalars
per position; the backward pass writes the single ``[B, T, V]`` gradient chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

# Rows per chunk are chosen so a float32 temporary stays near 2**24 elements (64 MiB).
_CHUNK_ELEMENTS = 1 << 24


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


def _row_chunks(rows: int, vocab: int) -> Iterator[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def _excluded_tensor(excluded_ids: Sequence[int] | torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """Excluded ids as a long tensor on ``device``, checked to lie inside the vocabulary."""
    if isinstance(excluded_ids, torch.Tensor):
        ids = excluded_ids.to(device=device, dtype=torch.long).reshape(-1)
    else:
        ids = torch.as_tensor(list(excluded_ids), dtype=torch.long, device=device)
    if ids.numel() and (bool((ids < 0).any()) or bool((ids >= vocab).any())):
        raise ValueError(f"excluded_ids must lie in [0, {vocab - 1}], got {ids.tolist()}")
    return ids


def mask_excluded_logits(logits: torch.Tensor, excluded_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """A copy of ``logits`` ``[..., V]`` with the excluded ids set to ``-inf`` (what a sampler uses)."""
    return mask_excluded_logits_(logits.clone(), excluded_ids)


def mask_excluded_logits_(logits: torch.Tensor, excluded_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """``mask_excluded_logits`` in place (no vocabulary-sized copy); returns ``logits``."""
    ids = _excluded_tensor(excluded_ids, logits.shape[-1], logits.device)
    return logits.index_fill_(-1, ids, float("-inf"))


def _mask_chunk(chunk: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:
    # ``excluded`` was validated once by the caller; chunks skip the per-call check
    return chunk.index_fill(-1, excluded, float("-inf"))


class _ActionLogProbs(torch.autograd.Function):
    """``[N, V]`` logits and ``[N]`` tokens -> ``[N]`` log-probs over the non-excluded ids.

    Computed as ``(z_tok - m) - log sum exp(z - m)`` with ``m`` the row maximum, so no precision is
    lost to a large common offset. Gradient: ``1[w = tok] - p_w``, exactly 0 on excluded ids.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        lse = torch.empty_like(out)
        for rows in _row_chunks(*logits.shape):
            masked = _mask_chunk(logits[rows].to(dtype), excluded)  # a fresh chunk copy
            shift = masked.max(dim=-1).values
            picked = masked.gather(1, tokens[rows, None]).squeeze(1)
            log_sum = masked.sub_(shift[:, None]).exp_().sum(dim=-1).log()  # in place on the copy
            out[rows] = (picked - shift) - log_sum
            lse[rows] = shift + log_sum
        ctx.save_for_backward(logits, tokens, excluded, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, tokens, excluded, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for rows in _row_chunks(*logits.shape):
            local = _mask_chunk(logits[rows].to(lse.dtype), excluded)
            local.sub_(lse[rows, None]).exp_().mul_(-grad_out[rows, None])  # -g * p, in place
            local.scatter_add_(1, tokens[rows, None], grad_out[rows, None])
            grad[rows] = local.to(grad.dtype)
        return grad, None, None


class _ActionEntropy(torch.autograd.Function):
    """``[N, V]`` logits -> ``[N]`` entropy of the softmax over the non-excluded ids.

    ``H = lse - E_p[z]`` and ``dH/dz_k = p_k (E_p[z] - z_k)`` times the incoming gradient, zero
    where ``p_k = 0``. Each chunk is a few in-place passes over one copy (the step is memory-bound).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        dtype = _compute_dtype(logits)
        lse = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        mean_logit = torch.empty_like(lse)
        for rows in _row_chunks(*logits.shape):
            chunk = logits[rows].to(dtype)
            weights = _mask_chunk(chunk, excluded)  # a fresh chunk copy
            shift = weights.amax(dim=-1)
            weights.sub_(shift[:, None]).exp_()  # unnormalised probabilities
            total = weights.sum(dim=-1)
            lse[rows] = shift + total.log()
            mean_logit[rows] = _weighted_sums(weights, chunk) / total
        ctx.save_for_backward(logits, excluded, lse, mean_logit)
        return lse - mean_logit

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, excluded, lse, mean_logit = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for rows in _row_chunks(*logits.shape):
            chunk = logits[rows].to(lse.dtype)
            probs = _mask_chunk(chunk, excluded).sub_(lse[rows, None]).exp_()
            # E[z] - z is +inf at a -inf logit, where p == 0: capped, the product is exactly 0
            spread = (mean_logit[rows, None] - chunk).clamp_(max=torch.finfo(lse.dtype).max)
            grad[rows] = probs.mul_(spread).mul_(grad_out[rows, None]).to(grad.dtype)
        return grad, None


def _weighted_sums(weights: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Row sums of ``weights * logits`` ``[N, V]``, in place on ``weights``; a term whose weight is
    0 counts 0, even at a -inf logit (where the product is nan)."""
    terms = weights.mul_(logits)
    sums = terms.sum(dim=-1)
    if bool(sums.isnan().any()):
        sums = terms.masked_fill_(terms.isnan(), 0.0).sum(dim=-1)
    return sums


def action_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, excluded_ids: Sequence[int] | torch.Tensor = ()
) -> torch.Tensor:
    """``log pi(token | prefix)`` normalised over the action vocabulary.

    Args:
        logits: ``[B, T, V]`` (any leading shape) LM-head logits; ``logits[b, t]`` predicts ``tokens[b, t]``.
        tokens: ``[B, T]`` token ids in ``[0, V)``. Pad masked positions with any action id.
        excluded_ids: ids outside the action vocabulary (SAPO's value tokens), a sequence or tensor.
    Returns:
        ``[B, T]`` log-probs in float32 (float64 for float64 logits).
    Raises:
        ValueError: a token id is out of range or is one of the excluded ids.
    """
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)} but logits has {tuple(logits.shape)}")
    vocab = logits.shape[-1]
    excluded = _excluded_tensor(excluded_ids, vocab, logits.device)
    if tokens.numel() and (bool((tokens < 0).any()) or bool((tokens >= vocab).any())):
        raise ValueError(f"tokens must lie in [0, {vocab - 1}]")
    if excluded.numel() and bool(torch.isin(tokens, excluded).any()):
        raise ValueError(f"tokens contain excluded ids {excluded.tolist()} (value tokens must never be actions)")
    flat_tokens = tokens.reshape(-1).long()
    return _ActionLogProbs.apply(logits.reshape(-1, vocab), flat_tokens, excluded).reshape(tokens.shape)


def entropy(logits: torch.Tensor, excluded_ids: Sequence[int] | torch.Tensor = ()) -> torch.Tensor:
    """Entropy of the action-vocabulary policy at each position: ``[B, T, V]`` -> ``[B, T]``."""
    vocab = logits.shape[-1]
    excluded = _excluded_tensor(excluded_ids, vocab, logits.device)
    return _ActionEntropy.apply(logits.reshape(-1, vocab), excluded).reshape(logits.shape[:-1])
