"""The engine's synchronous decode loop: continuous batching over a ``SlabCache``.

``admit`` prefills new requests (grouped by similar prompt length, left-padded, logits only at the
last position, after a reused prefix: a kept sequence they extend, or the common prefix of
prompts admitted together, computed once), samples their first token and drops them into free
slots; ``step`` advances every live row by one token. Finished rows free their slot at once and a
new request can take it at the next ``admit``, so one long answer never holds a batch of short ones
hostage. Results go to each request's ``on_done``. Single-threaded: ``HFEngine`` drives it from
its worker thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from streamrl.policy.fused_forward import FusedDecoder
from streamrl.policy.kv_cache import Kept, PrefillCache, PrefixStore, SlabCache, SlabPrefill
from streamrl.policy.modeling import cache_argument, decoder_and_head
from streamrl.policy.prefill import layout, prefill_groups, shared_prefixes
from streamrl.policy.protocols import FinishReason, GenerationRequest, GenerationResult
from streamrl.policy.sampling import sample_next

Deliver = Callable[[GenerationResult], None]
#: decode steps of free columns kept after a re-layout, so growth copies are rare
COLUMN_HEADROOM = 128


@dataclass(eq=False)  # identity semantics: rows go in sets
class _Row:
    request: GenerationRequest
    deliver: Deliver
    version: int
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    slot: int = -1
    next_position: int = 0  # position id of the last sampled token, fed at the next step
    prefix: Kept | None = None  # a reused prompt prefix (PrefixStore.take)
    #: pieces of the captured block's inputs at every id fed so far (``capture_layer``)
    inputs: list[torch.Tensor] = field(default_factory=list)
    cancelled: bool = False
    delivered: bool = False


class DecodeLoop:
    """Owns a model copy, its KV slab and the live rows (see the module docstring).

    Args:
        model: the engine's model copy (``HFEngine`` prepares it).
        decode: ids -> text, for ``GenerationResult.text`` and stop strings.
        banned_token_ids: never sampled (SAPO value tokens, vocabulary padding).
        max_batch_size: rows decoded together at most.
        prefill_token_budget: most (padded) prompt tokens in one prefill forward.
        prefix_cache_tokens: most tokens of finished sequences (and shared prompt prefixes) whose
            KV is kept, so that a prompt extending one (the next turn of a full-history episode)
            prefills only its new tokens.
        seed: seeds sampling for requests without their own ``SamplingParams.seed``.
        int8: quantised rollouts: the projections (all but the MLP's down projection) multiply by int8
            copies of their weights, made again at each ``update_weights`` (``fused_forward.int8_linear``);
            behaviour log-probs are the quantised policy's, so the learner's importance weights
            correct the mismatch.
        capture_layer: keep the input of this decoder block at every id fed and return it with the
            result (``GenerationResult.block_inputs``); needs the engine's own forward (the
            attribute ``capture_layer`` is None without it).
    """

    def __init__(
        self,
        model: Any,
        *,
        decode: Callable[[list[int]], str],
        banned_token_ids: Sequence[int] = (),
        max_batch_size: int = 64,
        prefill_token_budget: int = 8192,
        prefix_cache_tokens: int = 1 << 16,
        seed: int = 0,
        int8: bool = False,
        capture_layer: int | None = None,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.decoder, self.head = decoder_and_head(model)
        self._cache_arg = cache_argument(self.decoder)
        self._fused = FusedDecoder.build(model, int8=int8)  # None: transformers' forward
        if int8 and self._fused is None:
            raise ValueError("int8 rollouts need the engine's own forward, which covers Llama-family models "
                             "(Llama, SmolLM2, Qwen2, Qwen3) only")
        # the fused forward's head when it holds its own copy of the weight (packed float32 on CPU, or
        # int8): logits go through it
        if self._fused is not None:
            self._fused.capture_layer = capture_layer
        #: the captured block (None: nothing kept, e.g. transformers' forward)
        self.capture_layer = capture_layer if self._fused is not None else None
        head = self._fused.head if self._fused is not None else None
        self._packed_head = head if head is not None and head.own_copy else None
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.vocab_size = self.head.weight.shape[0]
        self.max_positions = int(getattr(config, "max_position_embeddings", 1 << 30))
        self.decode = decode
        self.max_batch_size = max_batch_size
        self.prefill_token_budget = prefill_token_budget
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.banned = torch.tensor(sorted(set(banned_token_ids)), dtype=torch.long, device=self.device)
        self._banned_set = frozenset(int(i) for i in banned_token_ids)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self._slab_shape = (config.num_hidden_layers, config.num_key_value_heads, head_dim)
        self.slab = SlabCache(*self._slab_shape, self.dtype, self.device)
        self.num_layers = config.num_hidden_layers
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.rows: dict[int, _Row] = {}  # slot -> row
        self.prefixes = PrefixStore(prefix_cache_tokens)
        self._logits: torch.Tensor | None = None  # the decode step's logits buffer (_decode_logits)
        self._version = 0
        self.stats = {"decode_steps": 0, "generated_tokens": 0, "prefill_tokens": 0, "reused_tokens": 0, "slot_steps": 0}

    # -- public ------------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @version.setter
    def version(self, version: int) -> None:
        # kept prefixes were computed with the old weights: reusing them would mix versions
        if version != self._version:
            self.prefixes.clear()
        self._version = version

    @property
    def live(self) -> int:
        return len(self.rows)

    @property
    def free_capacity(self) -> int:
        return self.max_batch_size - len(self.rows)

    def admit(self, items: Sequence[tuple[GenerationRequest, Deliver]]) -> None:
        """Prefill ``items`` (at most ``free_capacity``) and give them slots."""
        rows = []
        for request, deliver in items:
            row = _Row(request, deliver, self.version, None)
            try:
                problem = request.problem(self.vocab_size, self.max_positions, self._banned_set)
                row.generator = self._row_generator(request)
            except Exception as exc:  # not even shaped like a GenerationRequest
                problem = f"invalid request: {exc!r}"
            if problem:
                self._finish(row, "error", problem)
            elif request.sampling.max_new_tokens == 0:
                self._finish(row, "length")
            else:
                rows.append(row)
        try:
            with torch.no_grad():
                self._reuse_prefixes(rows)
            if rows:  # one re-layout for the whole admission, not one per prefill group
                self._make_room(len(rows), max(len(r.request.prompt_ids) for r in rows))
            for group in prefill_groups(rows, _new_tokens, self.prefill_token_budget):
                try:
                    with torch.no_grad():
                        self._prefill(group)
                except Exception as exc:  # one bad group must not take the others down
                    self._fail(group, f"prefill failed: {exc!r}")
        except Exception as exc:
            self._fail(rows, f"admission failed: {exc!r}")

    def step(self) -> None:
        """Advance every live row by one token."""
        for row in [r for r in self.rows.values() if r.cancelled]:
            self._free(row)
        if not self.rows:
            self._reset_slab()
            return
        try:
            with torch.no_grad():
                self._decode_step()
        except Exception as exc:
            self.abort_all("error", f"decode step failed: {exc!r}")

    def cancel(self, request: GenerationRequest) -> None:
        """Drop ``request``'s row at the next step, without delivering a result."""
        for row in self.rows.values():
            if row.request is request:
                row.cancelled = True

    def abort_all(self, reason: FinishReason, message: str) -> None:
        """Finish every live row with ``reason`` and start over with an empty slab."""
        rows, self.rows = list(self.rows.values()), {}
        self._reset_slab()
        for row in rows:
            row.slot = -1
            self._finish(row, reason, message)

    # -- prefill ---------------------------------------------------------------------------------

    def _reuse_prefixes(self, rows: list[_Row]) -> None:
        """Give each row the longest kept prefix of its prompt (one per distinct prompt: identical
        prompts are prefilled once and must agree on what is reused). Rows left without one that
        share a long common prefix get it prefilled once and kept as shared (later prompts with
        it, e.g. the same system prompt, reuse it too)."""
        taken: dict[tuple[int, ...], Any] = {}
        for row in rows:
            prompt = tuple(row.request.prompt_ids)
            if prompt not in taken:
                taken[prompt] = self.prefixes.take(row.request.prompt_ids)
            row.prefix = taken[prompt]
        fresh = [row for row in rows if row.prefix is None]
        for length, members in shared_prefixes([row.request.prompt_ids for row in fresh]):
            tokens = fresh[members[0]].request.prompt_ids[:length]
            input_ids, mask, positions, _ = layout([tokens], [length])
            cache = PrefillCache(self.num_layers)
            self._forward(input_ids, mask[:, None], positions, cache)
            # own storage (a view would pin the whole forward's q/k/v output); every layer is filled
            keys = [k[0].clone() for k in cast("list[torch.Tensor]", cache.keys)]
            values = [v[0].clone() for v in cast("list[torch.Tensor]", cache.values)]
            inputs = self._captured(0, length) if self.capture_layer is not None else None
            self.prefixes.keep(tokens, keys, values, shared=True, inputs=inputs)
            self.stats["prefill_tokens"] += length
            for i in members:
                fresh[i].prefix = Kept(length, keys, values, inputs)

    def _prefill(self, group: list[_Row]) -> None:
        """One forward over the group's distinct prompts (identical prompts, e.g. a GRPO group's,
        are computed once) after their reused prefixes, writing their KV straight into free slots,
        then a first token per row; continuing rows take the slots (a copy for a repeated prompt)."""
        distinct: dict[tuple[int, ...], int] = {}
        source = [distinct.setdefault(tuple(r.request.prompt_ids), len(distinct)) for r in group]
        firsts = {index: row for row, index in zip(group, source)}
        prefixes = [firsts[i].prefix for i in range(len(distinct))]
        reused = [prefix.length if prefix else 0 for prefix in prefixes]
        news = [list(prompt[n:]) for prompt, n in zip(distinct, reused)]
        width = max(map(len, distinct))
        input_ids, mask, positions, pad = layout(news, list(map(len, distinct)))
        self._make_room(len(group), width)
        free = iter([s for s in range(self.slab.slots) if s not in self.rows])
        slots = [next(free) for _ in distinct]
        for slot, prefix, new in zip(slots, prefixes, news):
            if prefix:
                self.slab.place(slot, prefix.keys, prefix.values, self.slab.end - len(new))
        cache = SlabPrefill(self.slab, slots, width, pad.to(self.device) if any(prefixes) else None)
        hidden = self._forward(input_ids, mask[:, None], positions, cache)
        if self.capture_layer is not None:
            for row, i in zip(group, source):  # a prefix kept without inputs leaves the row short: none reported
                prefix = prefixes[i]
                kept = None if prefix is None else prefix.inputs
                row.inputs = ([] if kept is None else [kept]) + [self._captured(i, len(news[i]))]
        logits = self._head(hidden[:, -1])[torch.tensor(source, device=self.device)]
        self.stats["prefill_tokens"] += sum(map(len, news))
        self.stats["reused_tokens"] += sum(reused)
        continuing = self._sample_and_check(group, logits, positions=[len(r.request.prompt_ids) for r in group])
        index_of = {id(row): i for i, row in enumerate(group)}
        taken: set[int] = set()
        for row in continuing:
            i = source[index_of[id(row)]]
            row.slot = slots[i] if i not in taken else next(free)
            self.slab.occupy(row.slot, len(row.request.prompt_ids), None if i not in taken else slots[i])
            self.rows[row.slot] = row
            taken.add(i)

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """The decoder's last hidden states over explicit ids, 4D bool mask and positions (only
        the last position's are meaningful, and all ``FusedDecoder`` returns)."""
        if self._fused is not None:
            return self._fused(input_ids.to(self.device), mask.to(self.device), positions.to(self.device), cache)
        return self.decoder(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            use_cache=True,
            **{self._cache_arg: cache},
        ).last_hidden_state

    # -- decode ----------------------------------------------------------------------------------

    def _decode_step(self) -> None:
        slab = self.slab
        self._make_room()
        order = sorted(self.rows)
        rows = [self.rows[slot] for slot in order]
        index = torch.tensor(order)
        live = torch.zeros(slab.slots, dtype=torch.bool)
        live[index] = True
        inputs = torch.zeros(slab.slots, 1, dtype=torch.long)  # empty slots feed a dummy token
        inputs[index, 0] = torch.tensor([row.tokens[-1] for row in rows])
        positions = torch.zeros(slab.slots, 1, dtype=torch.long)
        positions[index, 0] = torch.tensor([row.next_position for row in rows])
        slab.lo = int(slab.start[live].min())
        hidden = self._forward(inputs, slab.step_mask(live), positions, slab)
        if self.capture_layer is not None:
            step_inputs = self._captured(slice(None), 1)  # one copy for the step: rows keep views of it
            for slot, row in zip(order, rows):
                row.inputs.append(step_inputs[slot])
        slab.end += 1
        self.stats["decode_steps"] += 1
        self.stats["slot_steps"] += slab.slots
        logits = self._decode_logits(hidden[index.to(self.device), -1])
        for row in rows:
            row.next_position += 1
        going = set(self._sample_and_check(rows, logits, positions=None))
        for row in rows:
            if row not in going:
                self._free(row)

    def _captured(self, row: int | slice, last: int) -> torch.Tensor:
        """The captured block inputs of the last ``last`` queries of the forward's row(s) ``row`` (own storage)."""
        captured = cast(FusedDecoder, self._fused).captured
        assert captured is not None, "the forward ran the captured block"
        return captured[row, captured.shape[1] - last :].clone()

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, H]`` hidden states -> ``[n, V]`` logits (through the fused forward's packed head if any)."""
        return (self._packed_head or self.head)(hidden)

    def weights_changed(self) -> None:
        """The model's weights were replaced in place: refresh what is derived from them."""
        if self._fused is not None:
            self._fused.refresh()

    def _decode_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's ``[n, V]`` logits of a decode step, written into one buffer kept across steps:
        a fresh vocabulary-sized tensor every step is page-faulted in anew (SmolLM2, 64 rows:
        about 6 ms of a 125 ms bfloat16 step). Valid until the next step. A packed head (float32
        on CPU) writes a fresh tensor: packing outweighs the page faults there."""
        if type(self.head) is not torch.nn.Linear or self.head.bias is not None or self._packed_head is not None:
            return self._head(hidden)
        rows = hidden.shape[0]
        if self._logits is None or self._logits.dtype != hidden.dtype:
            self._logits = torch.empty(self.max_batch_size, self.vocab_size, dtype=hidden.dtype, device=self.device)
        return torch.mm(hidden, self.head.weight.t(), out=self._logits[:rows])

    # -- shared ----------------------------------------------------------------------------------

    def _sample_and_check(self, rows: list[_Row], logits: torch.Tensor, positions: list[int] | None) -> list[_Row]:
        """Sample one token per row, record it and deliver finished rows; returns the rows that go on."""
        params = [r.request.sampling for r in rows]
        ids, logprobs = sample_next(
            logits,
            torch.tensor([p.temperature for p in params], dtype=torch.float32),
            torch.tensor([p.top_p for p in params], dtype=torch.float32),
            [r.generator for r in rows],
            self.banned,
            self.generator,
        )
        going = []
        for i, (row, token, logprob) in enumerate(zip(rows, ids.tolist(), logprobs.tolist())):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if row.request.on_token is not None:
                with contextlib.suppress(Exception):  # a listener's failure is not the row's
                    row.request.on_token(token)
            self.stats["generated_tokens"] += 1
            if positions is not None:
                row.next_position = positions[i]
            reason = self._finish_reason(row)
            if reason is None:
                going.append(row)
            else:
                self._keep_prefix(row)
                self._finish(row, reason)
        return going

    def _keep_prefix(self, row: _Row) -> None:
        """Keep a finished row's KV (all but its last token, never fed) for a prompt continuing it."""
        slot = row.slot
        if self.rows.get(slot) is not row:  # finished at prefill: not in the slab
            return
        first, slab = int(self.slab.start[slot]), self.slab
        self.prefixes.keep(
            row.request.prompt_ids + row.tokens[:-1],
            [k[slot, :, first : slab.end].clone() for k in slab.keys],
            [v[slot, :, first : slab.end].clone() for v in slab.values],
            inputs=_fed_inputs(row),
        )

    def _finish_reason(self, row: _Row) -> FinishReason | None:
        sampling = row.request.sampling
        if row.tokens[-1] in sampling.stop_token_ids:
            return "stop"
        if sampling.stop_strings:
            window = max(map(len, sampling.stop_strings)) + 4
            tail = self.decode(row.tokens[-window:])
            if any(stop in tail for stop in sampling.stop_strings):
                return "stop"
        if len(row.tokens) >= sampling.max_new_tokens or row.next_position >= self.max_positions:
            return "length"
        return None

    def _finish(self, row: _Row, reason: FinishReason, error: str | None = None) -> None:
        """Deliver ``row``'s result (once)."""
        if row.delivered:
            return
        row.delivered = True
        text = ""
        if row.tokens:
            try:
                text = self.decode(row.tokens)
            except Exception as exc:  # a tokenizer failure must not lose the tokens
                error = error or f"decode failed: {exc!r}"
        inputs = _fed_inputs(row) if error is None else None
        row.deliver(
            GenerationResult(
                request_id=getattr(row.request, "request_id", ""),
                token_ids=list(row.tokens),
                logprobs=list(row.logprobs),
                finish_reason=reason,
                policy_version=row.version,
                text=text,
                error=error,
                block_inputs=inputs,
                block_inputs_layer=None if inputs is None else self.capture_layer,
            )
        )

    def _fail(self, rows: list[_Row], message: str) -> None:
        for row in rows:
            self._free(row)
            self._finish(row, "error", message)

    def _free(self, row: _Row) -> None:
        if self.rows.get(row.slot) is row:
            del self.rows[row.slot]
            self.slab.release(row.slot)
        row.slot = -1

    def _make_room(self, new_rows: int = 0, prompt_width: int = 0) -> None:
        """Re-layout the slab when it lacks ``new_rows`` free slots, lacks columns, or (between
        steps, ``new_rows == 0``) is mostly empty slots: live rows are packed into the first
        slots, unused leading columns are dropped, and the write column moves to at least
        ``prompt_width`` so a new prompt fits to its left. One copy of the live cache."""
        slab = self.slab
        live_slots = sorted(self.rows)
        free = slab.slots - len(live_slots)
        # between steps, more empty slots than live ones: worth a compacting copy (halves a step's work)
        compact = new_rows == 0 and free > max(len(live_slots), 4)
        columns_ok = slab.end >= prompt_width and slab.end + 1 <= slab.capacity
        if slab.slots and free >= new_rows and columns_ok and not compact:
            return
        lo = min((int(slab.start[s]) for s in live_slots), default=slab.end)
        new_end = max(slab.end - lo, prompt_width)
        capacity = max(slab.capacity if slab.capacity >= new_end + 1 else 0, new_end + COLUMN_HEADROOM)
        keep = torch.tensor(live_slots, dtype=torch.long)
        slab.relayout(len(live_slots) + new_rows, capacity, keep=keep, shift=new_end - slab.end)
        self.rows = {new_slot: self.rows[old] for new_slot, old in enumerate(live_slots)}
        for new_slot, row in self.rows.items():
            row.slot = new_slot

    def _reset_slab(self) -> None:
        if self.slab.slots:
            self.slab = SlabCache(*self._slab_shape, self.dtype, self.device)

    def _row_generator(self, request: GenerationRequest) -> torch.Generator | None:
        seed = request.sampling.seed
        return None if seed is None else torch.Generator(device=self.device).manual_seed(seed)


def _new_tokens(row: _Row) -> int:
    """Prompt tokens ``row`` must prefill: those after its reused prefix."""
    return len(row.request.prompt_ids) - (row.prefix.length if row.prefix else 0)


def _fed_inputs(row: _Row) -> torch.Tensor | None:
    """The captured block inputs of every id ``row`` fed (its prompt, then each sampled id but the
    last), or None when none were captured or some are missing. Joined once: the kept prefix and
    the result share the tensor."""
    if len(row.inputs) > 1:
        row.inputs = [torch.cat(row.inputs)]
    inputs = row.inputs[0] if row.inputs else None
    return inputs if inputs is not None and inputs.shape[0] == len(row.request.prompt_ids) + len(row.tokens) - 1 else None
