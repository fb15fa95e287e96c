"""``HFEngine``: the transformers-based ``InferenceEngine`` (api.py) for CPU (and small GPU) runs.

Many coroutines call ``generate`` at once; requests queue up and one worker thread runs the model,
so the event loop never blocks on a forward pass (torch releases the GIL). The worker drives a
``DecodeLoop``: continuous batching over a slot-major KV slab, requests admitted into free slots
between decode steps, the KV of finished sequences kept so a prompt that extends one (a
full-history episode's next turn) prefills only its new tokens, the common prefix of prompts
admitted together (a system prompt) prefilled once and kept, the engine's own fused forward for
Llama-family models (``fused_forward.py``; transformers' otherwise), logits only at the last position,
our own sampling with behaviour log-probs and banned ids (SAPO value tokens) masked out. Results
come back to each caller's event loop.

Weights: the engine owns its own model copy (``Policy.inference_model``), so a learner can keep
training its model. ``update_weights`` copies the new tensors at once (the caller may modify its
own right after) and the worker swaps them in between batches: admission pauses, live rows finish
under the old weights, the copy is applied, admission resumes. A result is therefore never a mix
of versions, and ``GenerationResult.policy_version`` names the weights that produced it.
``version`` is the newest version received: every request submitted after ``update_weights``
returns is generated with it (or a later one).

Failures stay local: a malformed request gets ``finish_reason="error"``; a failing prefill or decode
step fails only the rows it touched; ``close()`` aborts what is left and joins the worker thread.

Mapping to vLLM (a GPU engine can implement the same protocol): ``generate`` becomes
``AsyncLLMEngine.generate`` with ``TokensPrompt(prompt_token_ids=...)`` and vLLM ``SamplingParams``
(temperature, top_p, max_tokens, stop_token_ids, stop, seed, logprobs=0), a ``logit_bias`` of -inf
(or a logits processor) for the banned ids, and the sampled token's log-prob from each output;
its definition must match ours (after temperature and the banned mask, before top-p; check the
vLLM version's ``logprobs_mode``), otherwise the learner's TIS corrects the difference.
``update_weights`` becomes: pause admission, let running requests finish, load the state dict into
the workers' models (``collective_rpc`` + ``load_weights``), bump the version, resume. ``close`` is
engine shutdown. Continuous batching and the paged KV cache are vLLM's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from streamrl.policy.decode_loop import DecodeLoop, Deliver
from streamrl.policy.kv_cache import ATTENTION_NAME, register_engine_attention
from streamrl.policy.protocols import GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy


class HFEngine:
    """Batched generation over a transformers causal LM (see the module docstring).

    Args:
        model: the engine's own model copy (it is switched to the engine's attention function,
            and a Llama-family model's q/k/v and gate/up weights become views of fused tensors).
        version: the policy version of ``model``'s weights.
        threads: torch intra-op threads of the worker thread only (OpenMP keeps the setting per
            thread; None inherits the default). Measured on the 2-core machine: GNU OpenMP gives
            every thread running parallel ops its own helper pool, and once the pools hold more
            threads than there are cores it stops spinning between ops, so a 2-thread worker is
            ~1.5x slower when the main thread also has a 2-thread pool, and several times slower
            under CPU contention. With a learner training in the same process, give each side 1
            thread; for generation alone, keep the main thread at 1 thread and the engine at 2.
        loop_options: ``DecodeLoop``'s keywords (``decode`` is required; see its docstring).
    """

    def __init__(self, model: Any, *, version: int = 0, threads: int | None = None, **loop_options: Any):
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        _check_full_attention(model)
        register_engine_attention()
        model.set_attn_implementation(ATTENTION_NAME)
        model.eval().requires_grad_(False)
        self._model = model
        #: key -> (shape, dtype, device) of the engine model's own tensors
        self._expected = {key: (tuple(t.shape), t.dtype, t.device) for key, t in model.state_dict().items()}
        self._decode_loop = DecodeLoop(model, **loop_options)
        self._decode_loop.version = version
        self._version = version
        self._cond = threading.Condition()
        self._pending: deque[tuple[GenerationRequest, Deliver]] = deque()
        self._cancelled: list[GenerationRequest] = []
        self._forgotten: list[list[int]] = []
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._threads = threads
        self.last_error: str | None = None
        #: bytes of this engine's weights a policy holds as its own too (``from_policy``'s sharing)
        self.shared_bytes = 0

    @classmethod
    def from_policy(cls, policy: Policy, *, dtype: Any = None, device: Any = None, share_frozen: bool = True,
                    **kwargs: Any) -> HFEngine:
        """An engine over a fresh copy of ``policy``'s model (optionally in another dtype/device).
        ``share_frozen``: a LoRA policy then holds its frozen base weights in the engine's copy
        (``lora.share_frozen_weights``; where dtype and device match), so the process keeps one."""
        from streamrl.policy.loading import resolve_dtype
        from streamrl.policy.lora import share_frozen_weights

        model = policy.inference_model(dtype=None if dtype is None else resolve_dtype(dtype), device=device)
        engine = cls(model, decode=policy.decode, banned_token_ids=policy.banned_token_ids, **kwargs)
        if share_frozen:
            engine.shared_bytes = share_frozen_weights(policy.model, model)
        return engine

    # -- InferenceEngine -----------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def forget(self, token_ids: list[int]) -> None:
        """No prompt will extend ``token_ids`` (an episode's last prompt and its answer but the last
        id, as kept): the KV kept for it is dropped at the worker's next step instead of waiting
        to be evicted."""
        with self._cond:
            self._forgotten.append(list(token_ids))

    def set_threads(self, threads: int | None) -> None:
        """The worker's torch threads from its next step on (an evaluation, with the learner idle,
        can take every core; training hands half back)."""
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        with self._cond:
            self._threads = threads

    @property
    def block_inputs_layer(self) -> int | None:
        """The block whose inputs results carry (``GenerationResult.block_inputs``), or None."""
        return self._decode_loop.capture_layer

    @property
    def stats(self) -> dict[str, int]:
        """Counters of the decode loop (steps, tokens, prefill tokens, slot-steps)."""
        return dict(self._decode_loop.stats)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerationResult] = loop.create_future()
        if request.on_token is not None:  # the decode thread hands each id to the caller's loop
            listener = request.on_token
            def on_loop(token: int) -> None:
                loop.call_soon_threadsafe(listener, token)

            request = dataclasses.replace(request, on_token=on_loop)

        def deliver(result: GenerationResult) -> None:
            try:
                loop.call_soon_threadsafe(_resolve, future, result)
            except RuntimeError:  # the caller's event loop is gone: nobody is waiting
                pass

        with self._cond:
            if self._closed:
                return _aborted(request, self._version, "engine is closed")
            self._pending.append((request, deliver))
            self._start_worker()
            self._cond.notify()
        try:
            return await future
        except asyncio.CancelledError:
            with self._cond:
                waiting = [i for i, (queued, _) in enumerate(self._pending) if queued is request]
                if waiting:  # not started yet: just forget it
                    del self._pending[waiting[0]]
                else:
                    self._cancelled.append(request)
                    self._cond.notify()
            raise

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Stage a copy of ``state_dict`` (plain keys, e.g. ``Policy.state_dict_for_engine()``);
        the worker applies it once the running rows finish. Raises on missing, unexpected or
        mis-shaped tensors."""
        staged = self._stage(state_dict)
        with self._cond:
            if self._closed:
                raise RuntimeError("update_weights on a closed engine")
            self._staged = (staged, version)
            self._version = version
            self._cond.notify()

    async def close(self) -> None:
        thread = self._shutdown()
        if thread is not None:
            await asyncio.to_thread(thread.join)

    def close_sync(self) -> None:
        """``close`` for code without an event loop."""
        thread = self._shutdown()
        if thread is not None:
            thread.join()

    # -- worker --------------------------------------------------------------------------------

    def _start_worker(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="streamrl-hf-engine", daemon=True)
            self._thread.start()

    def _shutdown(self) -> threading.Thread | None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread, self._thread = self._thread, None
        return thread

    def _run(self) -> None:
        applied = None
        loop = self._decode_loop
        while True:
            if self._threads != applied:  # OpenMP settings are per thread: set in the worker itself
                applied = self._threads
                if applied is not None:
                    torch.set_num_threads(applied)
            with self._cond:
                while not (self._closed or self._pending or self._staged or self._cancelled or loop.live):
                    self._cond.wait()
                if self._closed:
                    break
                cancelled, self._cancelled = self._cancelled, []
                forgotten, self._forgotten = self._forgotten, []
                staged = None
                if self._staged is not None and loop.live == 0:
                    staged, self._staged = self._staged, None
                admit: list[tuple[GenerationRequest, Deliver]] = []
                if self._staged is None and staged is None:  # no admission while draining for new weights
                    while self._pending and len(admit) < loop.free_capacity:
                        admit.append(self._pending.popleft())
            try:
                for tokens in forgotten:
                    loop.prefixes.discard(tokens)
                for request in cancelled:
                    loop.cancel(request)
                if staged is not None:
                    self._apply(*staged)
                    continue
                if admit:
                    loop.admit(admit)
                if loop.live:
                    loop.step()
            except Exception as exc:  # keep serving whatever happens
                self.last_error = repr(exc)
                loop.abort_all("error", f"engine worker failed: {exc!r}")
        loop.abort_all("abort", "engine closed")
        with self._cond:
            pending, self._pending = list(self._pending), deque()
        for request, deliver in pending:
            deliver(_aborted(request, loop.version, "engine closed"))

    def _apply(self, staged: dict[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            self._model.load_state_dict(staged, strict=False)  # _stage checked the keys; shared ones are left out
        self._decode_loop.weights_changed()
        self._decode_loop.version = version

    def _stage(self, state_dict: dict) -> dict[str, torch.Tensor]:
        missing = sorted(set(self._expected) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(self._expected))
        if missing or unexpected:
            raise ValueError(
                f"update_weights: state dict does not match the engine model (missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}); pass Policy.state_dict_for_engine()"
            )
        own = self._model.state_dict()
        staged = {}
        for key, tensor in state_dict.items():
            shape, dtype, device = self._expected[key]
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
                found = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise ValueError(f"update_weights: {key!r} is {found}, expected {shape}")
            if _same_tensor(tensor, own[key]):  # a frozen weight the policy holds in this engine's storage
                continue
            staged[key] = tensor.detach().to(device=device, dtype=dtype, copy=True)
        return staged


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same elements of the same storage (a view of it with the same layout)."""
    return (a.device == b.device and a.dtype == b.dtype and a.data_ptr() == b.data_ptr()
            and a.stride() == b.stride() and a.shape == b.shape)


def _resolve(future: asyncio.Future, result: GenerationResult) -> None:
    if not future.done():
        future.set_result(result)


def _aborted(request: GenerationRequest, version: int, message: str) -> GenerationResult:
    return GenerationResult(request.request_id, [], [], "abort", version, error=message)


def _check_full_attention(model: Any) -> None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        raise ValueError(
            f"HFEngine supports full-attention models only; this one has layer types {sorted(set(layer_types))}"
        )
