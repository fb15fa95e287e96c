"""Next-token sampling for a batch of rows with per-row settings, and behaviour log-probs.

Behaviour log-prob (what ``GenerationResult.logprobs`` reports): ``log_softmax(z / T)`` over the
action vocabulary (banned ids removed), taken *before* top-p truncation; it is the same function
(``streamrl.algos.vocab.action_log_probs``) that ``scoring`` uses, so with equal weights and
temperature the engine's log-probs equal ``score``'s. Top-p changes which tokens can be drawn, not
the reported log-prob. ``temperature == 0`` means greedy; its log-prob is reported at temperature 1.
"""

from __future__ import annotations

import torch

from streamrl.algos.vocab import action_log_probs, mask_excluded_logits


def nucleus_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero every token outside each row's top-p nucleus (the smallest set of most likely tokens
    whose mass reaches ``top_p``). ``probs [n, V]``, ``top_p [n]`` -> ``[n, V]`` (not renormalised)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p[:, None], 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[torch.Generator | None],
    banned: torch.Tensor,
    default_generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; never a banned id.

    Args:
        logits: ``[n, V]`` next-token logits.
        temperature, top_p: ``[n]`` per-row settings (temperature 0 = greedy).
        generators: per-row seeded generators (None = use ``default_generator``).
        banned: ``[k]`` ids that are never sampled.
    Returns:
        ``(ids [n] long, logprobs [n] float32)``.
    """
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.device)
    scaled = logits.float() / scale[:, None]
    allowed = mask_excluded_logits(scaled, banned)
    probs = allowed.softmax(-1)
    if bool((top_p < 1).any()):
        probs = nucleus_filter(probs, top_p.to(probs.device))
    ids = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        ids[shared] = torch.multinomial(probs[shared], 1, generator=default_generator)[:, 0]
    for i, generator in enumerate(generators):
        if generator is not None:
            ids[i] = torch.multinomial(probs[i : i + 1], 1, generator=generator)[0, 0]
    if bool(greedy.any()):
        ids = torch.where(greedy.to(ids.device), allowed.argmax(-1), ids)
    return ids, action_log_probs(scaled, ids, banned)
