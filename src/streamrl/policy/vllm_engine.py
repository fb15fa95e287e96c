"""``VLLMEngine``: the ``InferenceEngine`` protocol (api.py) over vLLM's asynchronous engine, for GPUs.

Token-in/token-out like ``HFEngine``: a request's prompt ids go to vLLM as ``TokensPrompt``; the
result holds the sampled ids and, for each, its log-prob as vLLM's sampler saw it (``logprobs=0``:
the sampled token only, ``logprobs_mode="processed_logprobs"``: after the allowed-ids mask and
temperature, so over the action vocabulary). SAPO's value tokens (and vocabulary padding) are never
sampled: each request's ``allowed_token_ids`` is the vocabulary without them, vLLM's own mask.

Weights: ``update_weights`` copies the trainer's state dict at once and swaps it in between
requests: admission pauses, running requests finish under the old weights, the tensors go to
vLLM's workers (``collective_rpc`` -> ``model.load_weights``, in place: no restart, no disk round
trip), admission resumes. So a result is never a mix of versions, and ``policy_version`` names the
weights that produced it. Continuous batching and the paged KV cache are vLLM's own.

All of vLLM that this module uses sits behind ``VLLMSurface`` (``RealVLLM`` is the real one), so
the adapter logic (request building, log-prob extraction, banned ids, weight mapping, version
switching) is tested against a fake on machines without a GPU; tests marked ``gpu`` run vLLM.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streamrl.policy.errors import MissingDependencyError
from streamrl.policy.protocols import FinishReason, GenerationRequest, GenerationResult, SamplingParams

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy


class VLLMSurface(Protocol):
    """The part of vLLM the engine needs."""

    def sampling_params(self, **kwargs: Any) -> Any:
        """``vllm.SamplingParams(**kwargs)``."""
        ...

    def generate(self, prompt_ids: list[int], params: Any, request_id: str) -> AsyncIterator[Any]:
        """vLLM's ``RequestOutput`` stream for one request (the last one is final)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def load_weights(self, weights: list[tuple[str, Any]]) -> None:
        """Load (name, tensor) pairs, Hugging Face names, into every worker's model in place."""
        ...

    def shutdown(self) -> None: ...


def sampling_kwargs(sampling: SamplingParams, allowed_token_ids: list[int]) -> dict[str, Any]:
    """vLLM ``SamplingParams`` arguments for one of our requests."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_new_tokens,
        "stop_token_ids": list(sampling.stop_token_ids),
        "stop": list(sampling.stop_strings),
        "seed": sampling.seed,
        "logprobs": 0,  # the sampled token's log-prob only
        "allowed_token_ids": allowed_token_ids,
    }


def to_result(request_id: str, output: Any, version: int) -> GenerationResult:
    """Our result from vLLM's final ``RequestOutput`` (an error result when it is unusable)."""
    if output is None or not output.outputs:
        return GenerationResult(request_id, [], [], "error", version, error="vLLM returned no output")
    completion = output.outputs[0]
    token_ids = [int(t) for t in completion.token_ids]
    positions = completion.logprobs or []
    if len(positions) != len(token_ids):
        return GenerationResult(request_id, [], [], "error", version,
                                error=f"vLLM returned {len(positions)} log-prob positions for {len(token_ids)} tokens")
    logprobs = []
    for token, position in zip(token_ids, positions):
        entry = position.get(token)
        if entry is None:
            return GenerationResult(request_id, [], [], "error", version,
                                    error=f"vLLM returned no log-prob for the sampled token {token}")
        logprobs.append(float(entry.logprob))
    reason = completion.finish_reason
    finish: FinishReason = reason if reason in ("stop", "length", "abort") else "error"
    error = None if finish != "error" else f"vLLM finish_reason {reason!r}"
    return GenerationResult(request_id, token_ids, logprobs, finish, version, text=completion.text or "", error=error)


def engine_weights(state_dict: dict[str, Any], expected: set[str]) -> list[tuple[str, Any]]:
    """(name, tensor copy) pairs for ``load_weights``; the names must be exactly the engine's."""
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise ValueError(
            f"update_weights: state dict does not match the engine model (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}); pass Policy.state_dict_for_engine()"
        )
    return [(name, tensor.detach().clone()) for name, tensor in state_dict.items()]


class VLLMEngine:
    """Generation over a ``VLLMSurface`` (see the module docstring).

    Args:
        surface: vLLM, or a fake of it.
        vocab_size: rows of the LM head; ids at or above it are never sampled.
        banned_token_ids: never sampled (SAPO value tokens, vocabulary padding).
        weight_names: the names ``update_weights`` accepts (``Policy.state_dict_for_engine()``'s).
        version: the policy version of the surface's weights.
    """

    def __init__(self, surface: VLLMSurface, *, vocab_size: int, banned_token_ids: Iterable[int] = (),
                 weight_names: Iterable[str], version: int = 0):
        banned = {int(i) for i in banned_token_ids}
        self._surface = surface
        self._allowed = [i for i in range(vocab_size) if i not in banned]
        self._names = set(weight_names)
        self._version = self._applied = version
        self._running = 0
        self._staged: tuple[list[tuple[str, Any]], int] | None = None
        self._swap: asyncio.Task | None = None
        self._changed = asyncio.Condition()
        self._closed = False

    @classmethod
    def from_policy(cls, policy: Policy, *, version: int = 0, seed: int = 0, **engine_args: Any) -> VLLMEngine:
        """vLLM over ``policy`` exported as a merged Hugging Face folder (LoRA merged in, value-token
        rows kept), in the dtype it runs in (``run_dtype``); ``engine_args`` go to vLLM's ``AsyncEngineArgs``."""
        from streamrl.policy.export import export_policy

        folder = export_policy(policy, Path(tempfile.mkdtemp(prefix="streamrl-vllm-")))
        dtype = str(policy.run_dtype).removeprefix("torch.")
        surface = RealVLLM(folder, seed=seed, dtype=dtype, **engine_args)
        return cls(surface, vocab_size=policy.vocab_size, banned_token_ids=policy.banned_token_ids,
                   weight_names=policy.state_dict_for_engine().keys(), version=version)

    # -- InferenceEngine -----------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The newest version received: requests submitted from now on are generated with it."""
        return self._version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        async with self._changed:
            await self._changed.wait_for(lambda: self._staged is None or self._closed)  # no admission mid-swap
            if self._closed:
                return GenerationResult(request.request_id, [], [], "abort", self._applied, error="engine is closed")
            version = self._applied
            self._running += 1
        try:
            params = self._surface.sampling_params(**sampling_kwargs(request.sampling, self._allowed))
            final, streamed = None, 0
            async for output in self._surface.generate(list(request.prompt_ids), params, request.request_id):
                final = output
                if request.on_token is not None and output.outputs:  # outputs are cumulative
                    ids = output.outputs[0].token_ids
                    for token in ids[streamed:]:
                        request.on_token(int(token))
                    streamed = len(ids)
            return to_result(request.request_id, final, version)
        except asyncio.CancelledError:
            asyncio.ensure_future(self._surface.abort(request.request_id))
            raise
        except Exception as error:  # a bad request fails alone
            return GenerationResult(request.request_id, [], [], "error", version, error=f"vLLM: {error!r}")
        finally:
            async with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Stage a copy of ``state_dict``; it is loaded once the running requests finish. Call it
        from the engine's event loop. Raises on missing or unexpected names."""
        if self._closed:
            raise RuntimeError("update_weights on a closed engine")
        self._staged = (engine_weights(state_dict, self._names), version)
        self._version = version
        if self._swap is None or self._swap.done():
            self._swap = asyncio.get_running_loop().create_task(self._apply())

    async def close(self) -> None:
        async with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._swap is not None:
            await asyncio.gather(self._swap, return_exceptions=True)
        self._surface.shutdown()

    async def _apply(self) -> None:
        async with self._changed:
            while self._staged is not None and not self._closed:
                await self._changed.wait_for(lambda: self._running == 0)
                weights, version = self._staged
                await self._surface.load_weights(weights)
                if self._staged is not None and self._staged[1] == version:
                    self._staged = None
                self._applied = version
            self._changed.notify_all()


class RealVLLM:
    """``VLLMSurface`` over ``vllm.AsyncLLMEngine`` serving the Hugging Face folder ``model``."""

    def __init__(self, model: str | Path, *, seed: int = 0, dtype: str = "auto", **engine_args: Any):
        # collective_rpc ships a function to vLLM's worker processes, which vLLM allows only when asked
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        try:
            from vllm import AsyncEngineArgs, AsyncLLMEngine
            from vllm import SamplingParams as VLLMSamplingParams
        except ImportError as error:
            raise MissingDependencyError(
                f"model.engine=vllm needs vLLM on a CUDA machine: pip install -e '.[vllm]' ({error})"
            ) from None

        self._params = VLLMSamplingParams
        args = {"gpu_memory_utilization": 0.4, "enable_prefix_caching": True, "logprobs_mode": "processed_logprobs",
                **engine_args}
        self._engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=str(model), seed=seed, dtype=dtype, **args))

    def sampling_params(self, **kwargs: Any) -> Any:
        return self._params(**kwargs)

    def generate(self, prompt_ids: list[int], params: Any, request_id: str) -> AsyncIterator[Any]:
        return self._engine.generate({"prompt_token_ids": prompt_ids}, params, request_id)

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def load_weights(self, weights: list[tuple[str, Any]]) -> None:
        await self._engine.collective_rpc(_load_weights, args=([(name, t.cpu()) for name, t in weights],))

    def shutdown(self) -> None:
        self._engine.shutdown()


def _load_weights(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs in each vLLM worker: the model's own loader maps Hugging Face names to its (fused) params."""
    worker.model_runner.model.load_weights(weights=weights)
