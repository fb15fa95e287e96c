"""A scripted engine and a character-level chat codec, for tests, benchmarks and dry runs.

``CharCodec`` maps every character to one id (``ord(c) + 3``) after three specials, and renders
chats in a ChatML-like format that is append-only by construction: a whole conversation encodes
to exactly the opening prompt, each assistant reply with its end-of-turn id, and each bridge.

``ScriptedEngine`` implements ``InferenceEngine`` with a Python function in place of a model:
the function reads the decoded prompt and returns the reply text. It honours the sampling caps
(``max_new_tokens``, stop ids, stop strings), reports deterministic pseudo log-probs, can sleep
to simulate latency, and applies ``update_weights`` between requests like a real engine.
"""

from __future__ import annotations

import asyncio
import random
from typing import Callable

from streamrl.policy.api import GenerationRequest, GenerationResult

PAD, START, END = 0, 1, 2
_SPECIAL_TEXT = {PAD: "<|pad|>", START: "<|im_start|>", END: "<|im_end|>"}
_OFFSET = 3


class CharCodec:
    """A ``ChatCodec`` with one id per character; ``<|im_end|>`` (id 2) ends a turn."""

    @property
    def end_of_turn_id(self) -> int:
        return END

    def encode_text(self, text: str) -> list[int]:
        """Plain text to ids (special-token strings are not interpreted)."""
        return [ord(char) + _OFFSET for char in text]

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        ids: list[int] = []
        for number, message in enumerate(messages):
            try:
                role, content = message["role"], message["content"]
            except KeyError as missing:
                raise ValueError(f"CharCodec.encode_chat: message {number} lacks {missing}") from None
            ids += [START, *self.encode_text(f"{role}\n{content}"), END, *self.encode_text("\n")]
        if add_generation_prompt:
            ids += [START, *self.encode_text("assistant\n")]
        return ids

    def encode_bridge(self, user_message: str) -> list[int]:
        return self.encode_text("\n") + self.encode_chat([{"role": "user", "content": user_message}])

    def decode(self, token_ids: list[int]) -> str:
        return "".join(_SPECIAL_TEXT.get(i) or chr(i - _OFFSET) for i in token_ids)


#: reads the decoded prompt, returns the reply text (without the end-of-turn token)
ScriptedPolicy = Callable[[str], str]
#: seconds one request takes, given the request and the number of ids it generates
LatencyFn = Callable[[GenerationRequest, int], float]


class ScriptedEngine:
    """An ``InferenceEngine`` driven by a Python function.

    If ``policy`` raises, ``generate`` raises (an engine error, for fault tests).
    """

    def __init__(
        self,
        policy: ScriptedPolicy,
        codec: CharCodec | None = None,
        *,
        latency_s: float | LatencyFn = 0.0,
        version: int = 0,
        seed: int = 0,
    ):
        self.policy = policy
        self.codec = codec or CharCodec()
        self._latency = latency_s
        self._version = version
        self._seed = seed
        self.requests: list[GenerationRequest] = []
        self.weight_updates = 0
        self.closed = False

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self.closed:
            raise RuntimeError("ScriptedEngine: generate after close")
        version = self._version  # one version per result, like an engine swapping between batches
        self.requests.append(request)
        text = self.policy(self.codec.decode(request.prompt_ids))
        ids, finish = self._apply_sampling(text, request)
        latency = self._latency(request, len(ids)) if callable(self._latency) else self._latency
        if latency > 0:
            await asyncio.sleep(latency)
        rng = random.Random(f"{self._seed}:{request.request_id}")
        return GenerationResult(
            request_id=request.request_id,
            token_ids=ids,
            logprobs=[-rng.uniform(0.01, 3.0) for _ in ids],
            finish_reason=finish,
            policy_version=version,
            text=self.codec.decode(ids),
        )

    def _apply_sampling(self, text: str, request: GenerationRequest) -> tuple[list[int], str]:
        sampling = request.sampling
        for stop in sampling.stop_strings:
            cut = text.find(stop)
            if cut >= 0:  # the stop string is kept, no end-of-turn token follows
                ids = self.codec.encode_text(text[: cut + len(stop)])
                return (ids, "stop") if len(ids) <= sampling.max_new_tokens else (ids[: sampling.max_new_tokens], "length")
        ids = [*self.codec.encode_text(text), self.codec.end_of_turn_id]
        for position, token in enumerate(ids):
            if position >= sampling.max_new_tokens:
                return ids[:position], "length"
            if token in sampling.stop_token_ids:
                return ids[: position + 1], "stop"
        return ids, "stop"

    def update_weights(self, state_dict: dict, version: int) -> None:
        self._version = version
        self.weight_updates += 1

    async def close(self) -> None:
        self.closed = True
