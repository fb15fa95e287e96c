"""The prefill side of the decode loop: which prompts go into one forward, where their common
prefixes are, and the left-padded layout (ids, mask, positions, padding) of that forward.

Everything here works on token lists and tensors; ``DecodeLoop`` runs the forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")
#: a prefill group is closed when padding would exceed this share of its tokens
MAX_PADDING_SHARE = 0.25
#: fewest prefill tokens a common prefix of prompts admitted together must save to get a forward
#: of its own (that forward costs about one row's fixed per-call overhead)
MIN_SHARED_SAVING = 32


def prefill_groups(items: Sequence[T], new_tokens: Callable[[T], int], budget: int) -> list[list[T]]:
    """``items`` sorted by ``new_tokens``, cut into groups with little padding and at most
    ``budget`` padded tokens each."""
    groups: list[list[T]] = []
    real = 0  # new tokens of the last group
    for item in sorted(items, key=new_tokens):
        length = new_tokens(item)
        if groups:
            padded = length * (len(groups[-1]) + 1)  # sorted: the new item is the longest
            if padded <= budget and padded - real - length <= MAX_PADDING_SHARE * padded:
                groups[-1].append(item)
                real += length
                continue
        groups.append([item])
        real = length
    return groups


def shared_prefixes(prompts: Sequence[Sequence[int]]) -> list[tuple[int, list[int]]]:
    """``(length, members)`` for each group of distinct prompts worth prefilling their common first
    ``length`` tokens once (a system prompt, an episode's instructions); every member keeps at
    least one token after it. Groups are runs of the sorted prompts, chosen to save the most
    prefill tokens (``(members - 1) x length``, at least ``MIN_SHARED_SAVING`` per group)."""
    distinct = sorted({tuple(p) for p in prompts})
    common = [_common_length(a, b, min(len(a), len(b)) - 1) for a, b in zip(distinct, distinct[1:])]
    # best[j]: most tokens saved by runs covering distinct[:j]; cut[j]: where the last run starts
    best, cut = [0] * (len(distinct) + 1), list(range(len(distinct) + 1))
    for j in range(1, len(distinct) + 1):
        best[j], cut[j], length = best[j - 1], j - 1, None
        for i in range(j - 2, -1, -1):  # the run distinct[i:j]
            length = common[i] if length is None else min(length, common[i])
            if best[i] + (j - i - 1) * length > best[j]:
                best[j], cut[j] = best[i] + (j - i - 1) * length, i
    index: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        index.setdefault(tuple(prompt), []).append(i)
    groups, j = [], len(distinct)
    while j > 0:
        i = cut[j]
        length = min(common[i : j - 1], default=0)
        if (j - i - 1) * length >= MIN_SHARED_SAVING:
            groups.append((length, [k for prompt in distinct[i:j] for k in index[prompt]]))
        j = i
    return groups[::-1]


def layout(news: Sequence[Sequence[int]], lengths: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """Left-padded inputs of one prefill forward: row ``i`` feeds ``news[i]``, the last tokens of a
    sequence of ``lengths[i]`` (the rest is a reused prefix). Returns ``input_ids [B, Q]``, the
    bool ``mask [B, Q, W]`` over ``W = max(lengths)`` columns (row i's sequence ends at the last
    column), ``positions [B, Q]`` and ``pad [B, Q]`` (True at padding queries)."""
    queries, width = max(map(len, news)), max(lengths)
    input_ids = torch.zeros(len(news), queries, dtype=torch.long)
    for i, new in enumerate(news):  # left padding: every sequence ends at the last column
        input_ids[i, queries - len(new) :] = torch.tensor(new)
    # column c of row i holds token c - start[i]; query j sits at column width - queries + j
    start = torch.tensor([width - n for n in lengths])
    query_columns = torch.arange(width - queries, width)
    columns = torch.arange(width)
    pad = query_columns[None, :] < (width - torch.tensor(list(map(len, news))))[:, None]
    mask = (columns[None, None, :] >= start[:, None, None]) & (columns[None, None, :] <= query_columns[None, :, None])
    mask |= columns[None, None, :] == query_columns[None, :, None]  # padding queries see one column
    positions = (query_columns[None, :] - start[:, None]).clamp_min(0)
    return input_ids, mask, positions, pad


def _common_length(a: Sequence[int], b: Sequence[int], most: int) -> int:
    n = 0
    while n < most and a[n] == b[n]:
        n += 1
    return n
