"""SAPO value tokens ``w+`` and ``w-`` (algorithms.md section 6.1).

The value readout is the LM-head logit difference ``z[w+] - z[w-]`` at a causal boundary. Both
tokens are read-only: they are banned from sampling and excluded from the action vocabulary, so
their logits never affect the policy.

Choice: two existing, unused special tokens where the tokenizer has them (no embedding resize);
otherwise two added special tokens with an embedding resize.

Initialisation: both LM-head rows are set to their mean ``m`` plus/minus a small random direction
``u`` (``|u| = 0.01 |m|``), so ``V = z[w+] - z[w-] = 2 h.u`` starts near 0 for every context. The
rows are not made exactly equal: with LoRA the rows stay frozen, and equal rows would pin the
readout at 0 forever. With tied embeddings this also changes the tokens' input embeddings, which
is harmless because value tokens are never fed to the model.
"""

from __future__ import annotations

from typing import Any

from streamrl.policy.errors import PolicyLoadError

#: known unused special-token pairs, tried in order
PREFERRED_PAIRS: tuple[tuple[str, str], ...] = (
    ("<|reserved_0|>", "<|reserved_1|>"),  # the streamrl tiny tokenizer
    ("<reponame>", "<gh_stars>"),  # SmolLM2 / StarCoder-style code markers
    ("<|reserved_special_token_0|>", "<|reserved_special_token_1|>"),  # Llama 3
    ("<|quad_start|>", "<|quad_end|>"),  # Qwen2.5 / Qwen3 vision markers, unused in text
)
ADDED_PAIR = ("<|value_pos|>", "<|value_neg|>")
SPREAD = 0.01


def single_special_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` if it is a special token that encodes to exactly one id."""
    specials = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    if token not in specials:
        return None
    ids = tokenizer.encode(token, add_special_tokens=False)
    return specials[token] if list(ids) == [specials[token]] else None


def choose_value_tokens(tokenizer: Any, requested: bool | tuple[str, str]) -> tuple[tuple[str, str], bool]:
    """The (w+, w-) token strings to use, and whether they must be added to the tokenizer."""
    if isinstance(requested, tuple):
        if len(requested) != 2 or requested[0] == requested[1]:
            raise PolicyLoadError(f"value_tokens must name two different tokens, got {requested!r}")
        missing = [t for t in requested if single_special_id(tokenizer, t) is None]
        return requested, bool(missing)
    for pair in PREFERRED_PAIRS:
        if all(single_special_id(tokenizer, t) is not None for t in pair):
            return pair, False
    return ADDED_PAIR, True


def add_value_tokens(model: Any, tokenizer: Any, pair: tuple[str, str]) -> None:
    """Add ``pair`` as special tokens and grow the embeddings to match."""
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in pair], special_tokens=True)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))


def init_value_rows(model: Any, ids: tuple[int, int], seed: int) -> None:
    """Set the two LM-head rows to ``m +- u`` (see the module docstring)."""
    import torch

    weight = model.get_output_embeddings().weight
    with torch.no_grad():
        mean = (weight[ids[0]].float() + weight[ids[1]].float()) / 2
        scale = mean.norm()
        if scale == 0:  # fresh rows from a resize may be zero; use a typical row norm instead
            scale = weight.float().norm(dim=1).mean()
            mean = torch.zeros_like(mean)
        generator = torch.Generator().manual_seed(seed)
        direction = torch.randn(mean.shape, generator=generator)
        offset = direction / direction.norm() * scale * SPREAD
        weight[ids[0]] = (mean + offset.to(mean.device)).to(weight.dtype)
        weight[ids[1]] = (mean - offset.to(mean.device)).to(weight.dtype)


def unreachable_ids(model_vocab_size: int, tokenizer_size: int) -> range:
    """Ids of embedding rows without a token (vocabularies padded for efficiency): never sampled."""
    return range(tokenizer_size, model_vocab_size)
