"""A scripted engine and a character-level chat codec, for tests, benchmarks and dry runs.

``CharCodec`` maps every character to one id (``ord(c) + 3``) after three specials, and renders
chats in a ChatML-like format that is append-only by construction: a whole conversation encodes
to exactly the opening prompt, each assistant reply with its end-of-turn id, and each bridge.
Tools are rendered Hermes style (``tool_format = "hermes"``): the schemas in a first system turn
inside ``<tools>`` (one JSON object per line), an assistant's calls as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` after its content, and each tool result
as its own user turn ``<tool_response>...</tool_response>``.

``ScriptedEngine`` implements ``InferenceEngine`` with a Python function in place of a model:
the function reads the decoded prompt and returns the reply text. It honours the sampling caps
(``max_new_tokens``, stop ids, stop strings), reports deterministic pseudo log-probs, can sleep
to simulate latency, and applies ``update_weights`` between requests like a real engine.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, Callable

from streamrl.policy.chat import check_bridge_messages
from streamrl.policy.protocols import FinishReason, GenerationRequest, GenerationResult

PAD, START, END = 0, 1, 2
_SPECIAL_TEXT = {PAD: "<|pad|>", START: "<|im_start|>", END: "<|im_end|>"}
_OFFSET = 3


class CharCodec:
    """A ``ChatCodec`` with one id per character; ``<|im_end|>`` (id 2) ends a turn."""

    #: the tool-call format its rendering uses (``streamrl.policy.tool_format.FORMATS``)
    tool_format = "hermes"
    append_only = True
    not_append_only_reason = ""

    @property
    def end_of_turn_id(self) -> int:
        return END

    def encode_text(self, text: str) -> list[int]:
        """Plain text to ids (special-token strings are not interpreted)."""
        return [ord(char) + _OFFSET for char in text]

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        messages = list(messages)
        ids: list[int] = []
        if tools:
            system = ""
            if messages and messages[0].get("role") == "system":
                system = f"{messages[0].get('content') or ''}\n\n"
                messages = messages[1:]
            schemas = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
            ids += self._turn("system", f"{system}<tools>\n{schemas}\n</tools>")
        for number, message in enumerate(messages):
            ids += self._message(number, message)
        if add_generation_prompt:
            ids += [START, *self.encode_text("assistant\n")]
        return ids

    def encode_bridge(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """``\n`` after the end-of-turn id, then each message's turn, then the assistant header."""
        messages = check_bridge_messages(messages)
        ids = self.encode_text("\n")
        for number, message in enumerate(messages):
            ids += self._message(number, message)
        return ids + [START, *self.encode_text("assistant\n")]

    def render_reply(self, message: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> str:
        """The assistant turn's text: content, then each call as ``<tool_call>{json}</tool_call>``."""
        parts = [message["content"]] if message.get("content") else []
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            arguments = function.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            name = json.dumps(function.get("name"), ensure_ascii=False)
            parts.append(f'<tool_call>{{"name": {name}, "arguments": {arguments}}}</tool_call>')
        return "\n".join(parts)

    def _message(self, number: int, message: dict[str, Any]) -> list[int]:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            return self._turn("assistant", self.render_reply(message))
        if role is None or "content" not in message:
            missing = "'role'" if role is None else "'content'"
            raise ValueError(f"CharCodec.encode_chat: message {number} lacks {missing}")
        content = message["content"]
        content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        if role == "tool":
            return self._turn("user", f"<tool_response>{content}</tool_response>")
        return self._turn(role, content)

    def _turn(self, role: str, text: str) -> list[int]:
        return [START, *self.encode_text(f"{role}\n{text}"), END, *self.encode_text("\n")]

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
        listener = request.on_token
        if listener is not None:
            for token in ids:
                listener(token)
                await asyncio.sleep(0)  # one id at a time, as an engine samples them
        rng = random.Random(f"{self._seed}:{request.request_id}")
        return GenerationResult(
            request_id=request.request_id,
            token_ids=ids,
            logprobs=[-rng.uniform(0.01, 3.0) for _ in ids],
            finish_reason=finish,
            policy_version=version,
            text=self.codec.decode(ids),
        )

    def _apply_sampling(self, text: str, request: GenerationRequest) -> tuple[list[int], FinishReason]:
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
