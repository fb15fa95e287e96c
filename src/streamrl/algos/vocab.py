"""Log-probabilities and entropy over the *action* vocabulary (docs/algorithms.md §6.1).

SAPO reserves two token ids (``w+``, ``w-``) for its value readout. The policy must never sample
them, so every policy distribution is normalised over the vocabulary without them:
``log pi(a | c) = z_a - logsumexp_{w not excluded} z_w``. Excluded logits receive exactly zero
gradient from these terms. With no excluded ids this is the ordinary softmax policy.

Memory: logits ``[B, T, V]`` are large (V ~ 150k). Instead of a full ``log_softmax`` (one more
``[B, T, V]`` tensor saved for backward, plus masked copies), log-probs and entropy come from one
custom autograd function working in small row chunks, which saves only the logits it was given and
two or three scalars per position; the backward pass writes the single ``[B, T, V]`` gradient
chunk by chunk (``action_log_probs_and_entropy`` gives both terms from one pass and one gradient).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

# Rows per chunk are chosen so a float32 temporary stays near 2**18 elements (1 MiB): a chunk's
# copies stay in a core's L2 cache across the passes over them, and a small block is reused by
# the allocator instead of fresh pages for each (at 334 x 49,152 logits, forward + backward of
# log-probs and entropy 0.44 s with separate functions and 64 MiB chunks, 0.12 s so).
_CHUNK_ELEMENTS = 1 << 18


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


class _ActionTerms(torch.autograd.Function):
    """``[N, V]`` logits -> ``[N]`` log-probs of ``tokens`` (or None) and ``[N]`` entropies (or
    None), of the softmax over the non-excluded ids; one pass over each chunk serves both.

    Log-prob: ``(z_tok - m) - log sum exp(z - m)`` with ``m`` the row maximum, so no precision is
    lost to a large common offset. Entropy: ``H = lse - E_p[z]``. Gradient, with ``g`` and ``h``
    the incoming gradients of the log-prob and the entropy: ``g (1[w = tok] - p_w) + h p_w (E_p[z]
    - z_w)``, exactly 0 on excluded ids and wherever ``p_w = 0``. Each chunk is a few in-place
    passes over small copies that stay in cache (the step is memory-bound); the backward writes
    the one ``[N, V]`` gradient.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor | None, excluded: torch.Tensor,  # type: ignore[override]
                with_entropy: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        ctx.set_materialize_grads(False)
        dtype = _compute_dtype(logits)
        lse = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        logprobs = None if tokens is None else torch.empty_like(lse)
        mean_logit = torch.empty_like(lse) if with_entropy else None
        for rows in _row_chunks(*logits.shape):
            chunk = logits[rows].to(dtype)
            weights = _mask_chunk(chunk, excluded)  # a fresh chunk copy
            shift = weights.amax(dim=-1)
            picked = None if tokens is None else weights.gather(1, tokens[rows, None]).squeeze(1)
            weights.sub_(shift[:, None]).exp_()  # unnormalised probabilities
            total = weights.sum(dim=-1)
            log_sum = total.log()
            lse[rows] = shift + log_sum
            if logprobs is not None and picked is not None:  # both exist exactly when tokens do
                logprobs[rows] = (picked - shift) - log_sum
            if mean_logit is not None:
                mean_logit[rows] = _weighted_sums(weights, chunk) / total
        ctx.save_for_backward(logits, tokens, excluded, lse, mean_logit)
        return logprobs, None if mean_logit is None else lse - mean_logit

    @staticmethod
    def backward(ctx, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None):  # type: ignore[override]
        logits, tokens, excluded, lse, mean_logit = ctx.saved_tensors
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None
        grad = torch.empty_like(logits)
        for rows in _row_chunks(*logits.shape):
            chunk = logits[rows].to(lse.dtype)
            probs = _mask_chunk(chunk, excluded).sub_(lse[rows, None]).exp_()
            if grad_entropy is not None:
                # E[z] - z is +inf at a -inf logit, where p == 0: capped, the product is exactly 0
                local = (mean_logit[rows, None] - chunk).clamp_(max=torch.finfo(lse.dtype).max)
                local.mul_(probs).mul_(grad_entropy[rows, None])
                if grad_logprobs is not None:
                    local.sub_(probs.mul_(grad_logprobs[rows, None]))
            else:
                assert grad_logprobs is not None  # both None returned above
                local = probs.mul_(-grad_logprobs[rows, None])
            if grad_logprobs is not None:
                local.scatter_add_(1, tokens[rows, None], grad_logprobs[rows, None])
            grad[rows] = local.to(grad.dtype)
        return grad, None, None, None


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
    logprobs, _ = _action_terms(logits, tokens, excluded_ids, with_entropy=False)
    assert logprobs is not None  # tokens were given
    return logprobs


def action_log_probs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, excluded_ids: Sequence[int] | torch.Tensor = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(action_log_probs(...), entropy(logits, excluded_ids))`` from one pass over the logits
    (what a learner's loss takes); same arguments and checks as ``action_log_probs``."""
    logprobs, entropies = _action_terms(logits, tokens, excluded_ids, with_entropy=True)
    assert logprobs is not None and entropies is not None  # tokens were given, with_entropy
    return logprobs, entropies


def entropy(logits: torch.Tensor, excluded_ids: Sequence[int] | torch.Tensor = ()) -> torch.Tensor:
    """Entropy of the action-vocabulary policy at each position: ``[B, T, V]`` -> ``[B, T]``."""
    entropies = _action_terms(logits, None, excluded_ids, with_entropy=True)[1]
    assert entropies is not None  # with_entropy
    return entropies


def _action_terms(
    logits: torch.Tensor, tokens: torch.Tensor | None, excluded_ids: Sequence[int] | torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Checks, flattens to ``[N, V]`` and runs ``_ActionTerms``; ``tokens`` None: entropy only."""
    vocab = logits.shape[-1]
    excluded = _excluded_tensor(excluded_ids, vocab, logits.device)
    if tokens is not None:
        if tokens.shape != logits.shape[:-1]:
            raise ValueError(f"tokens has shape {tuple(tokens.shape)} but logits has {tuple(logits.shape)}")
        if tokens.numel() and (bool((tokens < 0).any()) or bool((tokens >= vocab).any())):
            raise ValueError(f"tokens must lie in [0, {vocab - 1}]")
        if excluded.numel() and bool(torch.isin(tokens, excluded).any()):
            raise ValueError(f"tokens contain excluded ids {excluded.tolist()} (value tokens must never be actions)")
        tokens = tokens.reshape(-1).long()
    logprobs, entropies = _ActionTerms.apply(logits.reshape(-1, vocab), tokens, excluded, with_entropy)
    shape = logits.shape[:-1]
    return (None if logprobs is None else logprobs.reshape(shape)), (None if entropies is None else entropies.reshape(shape))
