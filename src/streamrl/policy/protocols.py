"""The typed boundary between rollout code and any generation engine (transformers on CPU, vLLM
on GPU). Token-in/token-out: requests carry prompt token ids, results carry the generated ids and
their behaviour log-probs; text is for display and parsing only, never re-tokenised for training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort", "error"]


#: a reply's most tokens when nothing says otherwise (``rollout.max_new_tokens``' default too)
DEFAULT_MAX_NEW_TOKENS = 48
#: the most tokens a client of the agent endpoint may ask for (``agent.max_tokens``' default)
DEFAULT_MAX_TOKENS_CAP = 256


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    #: generation ends after emitting one of these ids (the id is kept, and trained on)
    stop_token_ids: tuple[int, ...] = ()
    #: generation ends once the decoded text contains one of these strings
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    #: called with each id as it is sampled, on the caller's event loop (a streamed answer); engines
    #: that cannot call it as they go never do, and the caller has the whole result at the end
    on_token: Callable[[int], None] | None = field(default=None, compare=False, repr=False)

    def problem(self, vocab_size: int, max_positions: int, banned: frozenset[int] = frozenset()) -> str | None:
        """Why an engine with ``vocab_size`` ids, ``max_positions`` positions and ``banned`` ids
        cannot run this request, or None."""
        sampling, prompt = self.sampling, self.prompt_ids
        if not prompt:
            return "prompt_ids is empty"
        if any(not isinstance(t, int) or t < 0 or t >= vocab_size for t in prompt):
            return f"prompt_ids must be ints in [0, {vocab_size - 1}]"
        if banned.intersection(prompt):
            return f"prompt_ids contain banned ids {sorted(banned.intersection(prompt))}"
        if len(prompt) >= max_positions:
            return f"prompt of {len(prompt)} tokens leaves no room under max positions {max_positions}"
        if sampling.temperature < 0:
            return f"temperature must be >= 0, got {sampling.temperature}"
        if not 0 < sampling.top_p <= 1:
            return f"top_p must be in (0, 1], got {sampling.top_p}"
        if sampling.max_new_tokens < 0:
            return f"max_new_tokens must be >= 0, got {sampling.max_new_tokens}"
        return None


@dataclass
class GenerationResult:
    request_id: str
    #: exactly the ids the engine sampled (a stop token, when hit, is the last id)
    token_ids: list[int]
    #: log pi_behaviour(token | prefix) over the action vocabulary, one per token id
    logprobs: list[float]
    finish_reason: FinishReason
    #: the policy version whose weights produced every token of this result
    policy_version: int
    text: str = ""
    error: str | None = None
    #: ``[len(prompt_ids) + len(token_ids) - 1, H]`` tensor: the input of decoder block
    #: ``block_inputs_layer`` at every id the engine fed (the prompt, then each sampled id but the
    #: last), when the engine was asked to keep them (``model.train_top_layers``: the learner then
    #: runs only the blocks it trains); None otherwise
    block_inputs: Any = None
    block_inputs_layer: int | None = None


@runtime_checkable
class InferenceEngine(Protocol):
    """What the rollout engine needs from a generator.

    ``generate`` is safe to call from many coroutines at once; the engine batches concurrent
    requests. ``update_weights`` takes effect between batches: a result is never produced by a
    mix of versions. ``banned_token_ids`` (SAPO's value tokens) are never sampled.
    """

    @property
    def version(self) -> int: ...

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def update_weights(self, state_dict: dict, version: int) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class ChatCodec(Protocol):
    """Chat-template tokenisation that rollout layouts need, without re-tokenising history.

    ``encode_chat`` renders a whole conversation once (a per-step prompt, or the opening of a
    full-history transcript), with the environment's tools (OpenAI-style function schemas,
    ``{"type": "function", "function": {"name", "description", "parameters"}}``) when given.
    ``encode_bridge`` gives the ids that follow the model's own end-of-turn token to add messages
    (one user message, or tool results, possibly followed by a user message) and open the next
    assistant turn, so a transcript grows by appending: ``prompt | a1 | bridge(o1) | a2 | ...``.
    ``render_reply`` is the text the template writes for an assistant message (content and/or
    ``tool_calls``) between the assistant header and the end-of-turn token: what a demonstration
    makes the model generate.

    Messages are dicts: ``{"role": "system" | "user" | "assistant", "content": str}``, an assistant
    message may carry ``"tool_calls": [{"type": "function", "id": str, "function": {"name": str,
    "arguments": dict}}]``, and a tool result is ``{"role": "tool", "tool_call_id": str, "name": str,
    "content": str}``.
    """

    @property
    def end_of_turn_id(self) -> int: ...

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None
    ) -> list[int]: ...

    def encode_bridge(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]: ...

    def render_reply(self, message: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> str: ...

    def decode(self, token_ids: list[int]) -> str: ...
