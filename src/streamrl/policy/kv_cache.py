"""KV storage and attention for the engine's decode loop.

``SlabCache`` keeps, per layer, preallocated buffers ``[S, H_kv, C, D]`` (S slots, C columns).
All slots share one write column ``end``: a decode step writes every slot's new key/value at
``end`` in place (no ``torch.cat`` copy of the whole cache per step, unlike ``DynamicCache``).
Slot ``s`` holds its sequence in columns ``[start[s], end)``, right-aligned, so a new request can
be prefilled separately and dropped into a free slot while the others keep decoding (continuous
batching). Attention reads only columns ``[lo, end]``, ``lo`` being the smallest live start.

Both cache classes implement just the part of the transformers cache protocol the decoder
layers use (``update``, also all the engine's own ``FusedDecoder`` uses); the decode loop always
passes explicit positions and a 4D mask, so no other cache method is needed. ``engine_attention``
(registered with transformers as ``streamrl_engine``) is the attention function of the engine's
model copy: grouped-query attention without repeating K/V (SDPA with each KV head's query heads
folded into the query dimension for single-token decode, SDPA with ``enable_gqa`` for prefill).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

ATTENTION_NAME = "streamrl_engine"


def engine_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``query [B, H, q, D]``, ``key/value [B, H_kv, k, D]``, bool mask ``[B, 1, q, k]`` ->
    ``[B, q, H, D]``."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    scale = head_dim**-0.5 if scaling is None else scaling
    if q_len == 1:
        # each KV head serves `groups` query heads: fold them into SDPA's query dimension (one
        # [groups, k] score block per KV head; with enable_gqa instead, SmolLM2 is ~15% slower)
        groups = heads // kv_heads
        if query.device.type == "cpu" and query.dtype == torch.float32:
            return _decode_attention_bmm(query, key, value, attention_mask, scale, groups), None
        q = query.reshape(batch, kv_heads, groups, head_dim)
        # the slab views are strided (capacity > k columns) and SDPA reads them as they are: a
        # contiguous copy first cost more than it saved in float32, and in bfloat16 where the CPU
        # runs it natively (AMX; 64 rows x 63 columns of SmolLM2: 0.63 ms strided, 1.51 ms copied)
        mask = None if attention_mask is None else attention_mask.reshape(batch, 1, 1, -1)
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)
        out = out.reshape(batch, heads, 1, head_dim)
    else:
        # no mask: transformers skipped a plain causal one (the model used outside the engine);
        # enable_gqa instead of repeating K/V: same result, SmolLM2 prefill 12.5 -> 8 ms per layer
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scale, is_causal=attention_mask is None,
            enable_gqa=kv_heads != heads,
        )
    return out.transpose(1, 2).contiguous(), None


def _decode_attention_bmm(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None, scale: float,
    groups: int,
) -> torch.Tensor:
    """One-token attention as two batched matrix multiplies over ``[B * H_kv]`` small problems
    (``groups`` query rows each): ``query [B, H, 1, D]``, ``key/value [B, H_kv, k, D]`` (strided
    slab views reshape without a copy), bool mask ``[B, 1, 1, k]`` -> ``[B, 1, H, D]``. On CPU in
    float32 this is 2-3x faster than SDPA's flash kernel at the engine's shapes (64 rows: SmolLM2
    at 100 keys 3.4 -> about 1.1 ms a layer, measured on the 2-core EPYC; docs/results/speed.md)."""
    batch, heads, _, head_dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    scores = torch.bmm(query.reshape(batch * kv_heads, groups, head_dim), key.reshape(batch * kv_heads, keys, head_dim).transpose(1, 2))
    scores = scores.view(batch, kv_heads, groups, keys).mul_(scale)
    if attention_mask is not None:
        scores.masked_fill_(~attention_mask.reshape(batch, 1, 1, keys), float("-inf"))
    weights = scores.softmax(-1).view(batch * kv_heads, groups, keys)
    out = torch.bmm(weights, value.reshape(batch * kv_heads, keys, head_dim))
    return out.view(batch, 1, heads, head_dim)


def register_engine_attention() -> None:
    """Register ``engine_attention`` with transformers, with SDPA's mask builder, so a model
    switched to it still handles ordinary 2D padding masks correctly outside the engine."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, engine_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


class PrefillCache:
    """Collects each layer's keys/values of one prefill forward (a shared prompt prefix's)."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        self.keys[layer_idx], self.values[layer_idx] = key, value
        return key, value


class SlabPrefill:
    """The cache of a prefill forward that writes straight into ``slab`` slots ``slots`` (no
    separate prefill KV to allocate and copy over: on a VM, fresh memory is slow to touch).

    The forward's ``Q`` new columns end at the slab's write column ``end``, except at padding
    queries (``pad [B, Q]`` True, given when rows reuse a prefix), whose columns keep what the
    slot holds there (a reused prefix, placed by ``SlabCache.place``); attention reads the last
    ``width`` columns. Columns a row does not use are masked, and the slab keeps them finite.
    """

    def __init__(self, slab: SlabCache, slots: list[int], width: int, pad: torch.Tensor | None = None):
        first = slots[0]
        contiguous = slots == list(range(first, first + len(slots)))  # a view, not a gathered copy
        self.rows = slice(first, first + len(slots)) if contiguous else torch.tensor(slots, device=slab.device)
        self.slab, self.width, self.pad = slab, width, pad

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        end, read = self.slab.end, []
        for new, store in ((key, self.slab.keys[layer_idx]), (value, self.slab.values[layer_idx])):
            columns = slice(end - new.shape[2], end)
            new = new.to(store.dtype)
            if self.pad is not None:
                new = torch.where(self.pad[:, None, :, None], store[self.rows, :, columns], new)
            store[self.rows, :, columns] = new
            read.append(store[self.rows, :, end - self.width : end])
        return tuple(read)


class Kept(NamedTuple):
    """A kept sequence's first ``length`` tokens: per-layer keys and values ``[H_kv, n, D]`` and,
    when the engine captures them, its block inputs ``[n, H]``."""

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    inputs: torch.Tensor | None


class PrefixStore:
    """KV of finished sequences, kept so a later prompt that extends one (the next turn of a
    full-history episode: transcript + bridge + observation) prefills only its new tokens.

    Least recently kept entries go first once more than ``budget`` tokens are held; an entry is
    taken (removed) by the prompt that reuses it, except a ``shared`` one (the common prefix of
    many prompts, e.g. a system prompt), which stays and moves to the back of the eviction order.
    Keys and values are ``[H_kv, n, D]`` per layer; ``inputs`` (optional) ``[n, H]``, the engine's
    captured block inputs of the same tokens.
    """

    def __init__(self, budget: int):
        self.budget = budget
        self.held = 0
        self._entries: dict[tuple[int, ...], tuple[list[torch.Tensor], list[torch.Tensor], bool, torch.Tensor | None]] = {}
        self._lengths: dict[int, int] = {}  # prefix length -> entries of that length

    def keep(self, tokens: list[int], keys: list[torch.Tensor], values: list[torch.Tensor], shared: bool = False,
             inputs: torch.Tensor | None = None) -> None:
        key = tuple(tokens)
        if not key or len(key) > self.budget or key in self._entries:
            return
        self._entries[key] = (keys, values, shared, inputs)
        self._lengths[len(key)] = self._lengths.get(len(key), 0) + 1
        self.held += len(key)
        while self.held > self.budget:
            self._drop(next(iter(self._entries)))

    def take(self, prompt: list[int]) -> Kept | None:
        """The longest kept prefix of ``prompt`` that leaves at least one new token, removed."""
        for length in sorted((n for n in self._lengths if n < len(prompt)), reverse=True):
            key = tuple(prompt[:length])
            if key in self._entries:
                entry = self._entries.pop(key)
                if entry[2]:  # shared
                    self._entries[key] = entry
                else:
                    self._forget(key)
                return Kept(length, entry[0], entry[1], entry[3])
        return None

    def discard(self, tokens: list[int]) -> None:
        """Drop the entry of exactly ``tokens`` (not a shared one): no prompt will extend it."""
        key = tuple(tokens)
        entry = self._entries.get(key)
        if entry is not None and not entry[2]:
            self._drop(key)

    def clear(self) -> None:
        self._entries, self._lengths, self.held = {}, {}, 0

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._forget(key)

    def _forget(self, key: tuple[int, ...]) -> None:
        self.held -= len(key)
        self._lengths[len(key)] -= 1
        if not self._lengths[len(key)]:
            del self._lengths[len(key)]


class SlabCache:
    """Slot-major KV buffers with a shared write column (see the module docstring)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: Any):
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots = 0
        self.capacity = 0
        self.end = 0  # next write column, shared by all slots
        self.lo = 0  # first column attention reads (set by the decode loop before each step)
        self.start = torch.zeros(0, dtype=torch.long)  # [S] first valid column per slot

    # -- the transformers cache protocol (decode step) ------------------------------------------

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        """Write the step's ``[S, H_kv, 1, D]`` key/value at column ``end``; return columns ``[lo, end]``."""
        self.keys[layer_idx][:, :, self.end] = key[:, :, 0]
        self.values[layer_idx][:, :, self.end] = value[:, :, 0]
        return self.keys[layer_idx][:, :, self.lo : self.end + 1], self.values[layer_idx][:, :, self.lo : self.end + 1]

    # -- layout management ---------------------------------------------------------------------

    def relayout(self, slots: int, capacity: int, keep: torch.Tensor | None = None, shift: int = 0) -> None:
        """Reallocate to ``slots x capacity`` columns: old slots ``keep`` (default: all) become slots
        ``0..len(keep)-1`` and their columns move by ``shift`` (negative = left; the columns that
        would fall below 0 must be unused). Grows, compacts and shifts with one copy."""
        keep = torch.arange(self.slots) if keep is None else keep
        first = max(0, -shift)
        new_end = self.end + shift
        if new_end > capacity or len(keep) > slots:
            raise ValueError(f"relayout to {slots}x{capacity} cannot hold {len(keep)} slots ending at {new_end}")
        index = keep.to(self.device)

        def moved(old: torch.Tensor | None) -> torch.Tensor:
            # columns before the write column are zeroed: masked ones still enter the probs @ V
            # product, and 0 * NaN = NaN; later ones are written (every slot, every step) before
            # they are read, so they stay untouched (on a VM, first-touched memory is slow)
            fresh = torch.empty(slots, self.kv_heads, capacity, self.head_dim, dtype=self.dtype, device=self.device)
            fresh[:, :, :new_end].zero_()
            if old is not None and len(keep) and self.end > first:
                fresh[: len(keep), :, first + shift : new_end] = old[index, :, first : self.end]
            return fresh

        # one layer at a time, each old buffer dropped once moved: the slab is briefly one layer
        # larger, not twice its size (SmolLM2, 16 rows of 2,048 columns: 1.6 GB more at every growth)
        keys: list[torch.Tensor | None] = list(self.keys) or [None] * self.num_layers
        values: list[torch.Tensor | None] = list(self.values) or [None] * self.num_layers
        self.keys, self.values = [], []
        for layer in range(self.num_layers):
            self.keys.append(moved(keys[layer]))
            keys[layer] = None
            self.values.append(moved(values[layer]))
            values[layer] = None
        start = torch.full((slots,), new_end, dtype=torch.long)
        start[: len(keep)] = (self.start[keep] + shift).clamp_min(0)
        self.start, self.slots, self.capacity, self.end = start, slots, capacity, new_end

    def place(self, slot: int, keys: list[torch.Tensor], values: list[torch.Tensor], stop: int) -> None:
        """Write per-layer ``[H_kv, n, D]`` keys/values (a reused prefix) into ``slot``'s columns
        ``[stop - n, stop)``."""
        n = keys[0].shape[1]
        for store, layers in ((self.keys, keys), (self.values, values)):
            for layer, tensor in enumerate(layers):
                store[layer][slot, :, stop - n : stop] = tensor

    def occupy(self, slot: int, length: int, source: int | None = None) -> None:
        """``slot`` now holds a sequence of ``length`` columns ending at ``end``: the ones a
        prefill wrote there, or (``source``) a copy of another slot's."""
        if source is not None:
            columns = slice(self.end - length, self.end)
            for store in (*self.keys, *self.values):
                store[slot, :, columns] = store[source, :, columns]
        self.start[slot] = self.end - length

    def release(self, slot: int) -> None:
        """Mark ``slot`` empty: its start moves to ``end`` so it never widens the attended range."""
        self.start[slot] = self.end

    def step_mask(self, live: torch.Tensor) -> torch.Tensor:
        """``[S, 1, 1, end + 1 - lo]`` bool mask of the next decode step; empty slots see only
        their own (new) column, so their softmax rows stay finite."""
        columns = torch.arange(self.lo, self.end + 1)
        mask = columns[None, :] >= self.start[:, None]
        mask[~live, :-1] = False
        mask[:, -1] = True
        return mask[:, None, None, :].to(self.device)
