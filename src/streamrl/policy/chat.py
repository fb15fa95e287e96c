"""``ChatCodec`` over a Hugging Face tokenizer's chat template, with tools.

Full-history rollouts grow a transcript by appending: ``prompt | a1 | bridge(o1) | a2 | ...``, never
re-tokenising. The bridge is whatever the template writes between the model's end-of-turn token and
the opening of the next assistant turn: for ChatML and a user message,
``\\n<|im_start|>user\\n{o1}<|im_end|>\\n<|im_start|>assistant\\n``; for tool results, whatever the
template makes of ``tool`` messages (Qwen groups them in one user turn of ``<tool_response>``
blocks, Llama 3.1 writes ``ipython`` turns). Rather than hard-coding a format, the codec renders a
probe conversation through the template and cuts the bridge out of it: it finds the probe assistant
turn (by a unique marker in its content and call arguments), then the first end-of-turn token after
it, and takes everything after that token. The probe's assistant turn carries tool calls with the
same ids and names as the tool messages, because templates render tool results depending on the
call before them.

Some templates are not append-only: rendering more messages rewrites earlier assistant turns (Qwen3
drops the empty ``<think></think>`` of an earlier turn and strips reasoning across user turns).
streamrl keeps every assistant turn exactly as the model generated it (the "continuous tokens"
choice), so the bridge is still well defined as long as it does not depend on the earlier assistant
turn; ``encode_bridge`` checks that by cutting it after two different probe turns. ``append_only``
and ``not_append_only_reason`` say which case a template is in.

Exactness relies on the end-of-turn token being a special token: tokenisation never merges across
it, so the ids of a rendered conversation split cleanly at every end-of-turn.
"""

from __future__ import annotations

import json
from typing import Any

from streamrl.policy.errors import ChatTemplateError

_PROBE_USER = "probe question 1"
_PROBE_REPLY = "probe reply 1"
_PROBE_FOLLOW_UP = "probe question 2"
_PROBE_TOOL_NAME = "probe_tool"
_PROBE_TOOL_RESULT = "probe tool result 1"
#: two different assistant turns to cut a bridge after: (content marker, argument-marker stem)
_PROBE_VARIANTS = (("probe reply alpha", "probe argument alpha "), ("another probe reply", "another probe argument "))
PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": _PROBE_TOOL_NAME,
        "description": "A probe tool.",
        "parameters": {
            "type": "object",
            "properties": {"probe": {"type": "string", "description": "Any text."}},
            "required": ["probe"],
        },
    },
}

Message = dict[str, Any]
Tools = list[dict[str, Any]] | None


class ChatTemplateCodec:
    """Implements ``streamrl.policy.protocols.ChatCodec`` for a tokenizer that has a chat template.

    Attributes set on construction: ``append_only`` (rendering more user or tool messages never
    rewrites what was rendered before), ``not_append_only_reason`` (empty when append-only), and
    ``renders_tool_calls`` (the template writes an assistant message's ``tool_calls``).
    """

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {type(tokenizer).__name__} has no chat template; set tokenizer.chat_template "
                "(a Jinja string) or use a model folder that ships chat_template.jinja"
            )
        self.tokenizer = tokenizer
        self._end_of_turn_id, self._end_of_turn_text = self._find_end_of_turn()
        user_reason = self._check_user_turns()
        self.renders_tool_calls, tool_reason = self._check_tool_turns()
        reasons = [f"user turns: {user_reason}"] if user_reason else []
        reasons += [f"tool turns: {tool_reason}"] if tool_reason else []
        self.append_only = not reasons
        self.not_append_only_reason = "; ".join(reasons)

    # -- ChatCodec -------------------------------------------------------------------------------

    @property
    def end_of_turn_id(self) -> int:
        return self._end_of_turn_id

    def encode_chat(self, messages: list[Message], add_generation_prompt: bool = True, tools: Tools = None) -> list[int]:
        """Ids of the whole conversation as the template renders it (``tools``: function schemas)."""
        return self._encode(self._render(messages, add_generation_prompt, tools))

    def encode_bridge(self, messages: list[Message], tools: Tools = None) -> list[int]:
        """Ids following the model's end-of-turn token that append ``messages`` and open the next
        assistant turn. ``messages``: one user message, or one or more ``tool`` messages, possibly
        followed by a user message. Raises ``ChatTemplateError`` when the template gives no bridge
        that is independent of the assistant turn before it."""
        messages = check_bridge_messages(messages)
        taken = json.dumps([messages, tools], ensure_ascii=False, default=str)
        variants = [v for v in _PROBE_VARIANTS if v[0] not in taken and v[1] not in taken]
        if len(variants) < 2:
            raise ChatTemplateError("the messages or tools contain the codec's probe markers; cannot cut a bridge")
        first, second = (self._bridge_text(messages, tools, *variant) for variant in variants)
        if first != second:
            raise ChatTemplateError(
                "the chat template's bridge depends on the content of the assistant turn before it "
                f"({first!r} vs {second!r}), so it cannot be appended to the model's own reply; "
                "use per-step prompts (encode_chat) instead of a growing transcript"
            )
        return self._encode(first)

    def render_reply(self, message: Message, tools: Tools = None) -> str:
        """The text the template writes for assistant ``message`` (content and/or ``tool_calls``)
        between the assistant header (the generation prompt) and the end-of-turn token: what the
        model should generate, without its end-of-turn token, to produce that message."""
        if message.get("role") != "assistant":
            raise ValueError(f"render_reply renders an assistant message, got role {message.get('role')!r}")
        opening = [{"role": "user", "content": _PROBE_USER}]
        prompt = self._render(opening, True, tools)
        closed = self._render([*opening, message], False, tools)
        if not closed.startswith(prompt):
            raise ChatTemplateError(
                "the chat template's rendering of an assistant message does not start with its generation "
                "prompt, so the reply cannot be cut out of it"
            )
        end = closed.rfind(self._end_of_turn_text)
        if end < len(prompt):
            raise ChatTemplateError(
                f"the chat template does not end the assistant message with {self._end_of_turn_text!r}; "
                "the reply cannot be cut out of its rendering"
            )
        return closed[len(prompt) : end]

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` without special tokens (for display and action parsing only)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # -- helpers -------------------------------------------------------------------------------

    def _render(self, messages: list[Message], add_generation_prompt: bool, tools: Tools = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _bridge_text(self, messages: list[Message], tools: Tools, content: str, argument: str) -> str:
        """The text after the probe assistant turn's end-of-turn token in the extended rendering."""
        tool_messages = [m for m in messages if m.get("role") == "tool"]
        reply: Message = {"role": "assistant", "content": content}
        markers = [content]
        if tool_messages:
            # one call per result, with its id and name (templates may render results by the call)
            arguments = [f"{argument}{i}." for i in range(len(tool_messages))]
            reply["tool_calls"] = [
                {
                    "type": "function",
                    "id": str(m.get("tool_call_id") or f"call_{i}"),
                    "function": {"name": str(m.get("name") or _PROBE_TOOL_NAME), "arguments": {"probe": arguments[i]}},
                }
                for i, m in enumerate(tool_messages)
            ]
            markers += arguments
        history = [{"role": "user", "content": _PROBE_USER}, reply]
        try:
            text = self._render([*history, *messages], True, tools)
        except Exception as exc:  # a template may refuse, e.g. Llama 3.1: one tool call per message
            raise ChatTemplateError(
                f"the chat template cannot render these messages after an assistant turn: {_one_line(exc)}"
            ) from exc
        cut = self._turn_end(text, markers)
        return text[cut:]

    def _turn_end(self, text: str, markers: list[str]) -> int:
        """Position after the end-of-turn token that closes the assistant turn holding ``markers``."""
        found = [text.find(marker) + len(marker) for marker in markers if marker in text]
        if not found:
            raise ChatTemplateError(
                "the chat template dropped the probe assistant turn (neither its content nor its tool-call "
                "arguments appear in the rendering), so the bridge cannot be cut"
            )
        end = text.find(self._end_of_turn_text, max(found))
        if end < 0:
            raise ChatTemplateError(
                f"no end-of-turn token {self._end_of_turn_text!r} follows the probe assistant turn, so the bridge "
                "cannot be cut"
            )
        return end + len(self._end_of_turn_text)

    def _reply_end(self, text: str) -> int:
        at = text.find(_PROBE_REPLY)
        if at < 0:
            raise ChatTemplateError("the chat template dropped the assistant reply of a probe conversation")
        return at + len(_PROBE_REPLY)

    def _find_end_of_turn(self) -> tuple[int, str]:
        """The special token the template writes right after an assistant reply."""
        history = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}]
        text = self._render(history, False)
        tail_ids = self._encode(text[self._reply_end(text) :])
        special_ids = set(self.tokenizer.all_special_ids) | {
            i for i, tok in self.tokenizer.added_tokens_decoder.items() if tok.special
        }
        if not tail_ids or tail_ids[0] not in special_ids:
            raise ChatTemplateError(
                "the chat template does not end an assistant turn with a special token right after its "
                f"content (it writes {text[self._reply_end(text) :]!r}); the model could not stop on its own"
            )
        eot_id = tail_ids[0]
        return eot_id, self.tokenizer.convert_ids_to_tokens(eot_id)

    def _check_user_turns(self) -> str:
        """Why appending a user message is not append-only ("" when it is)."""
        opening = [{"role": "user", "content": _PROBE_USER}]
        history = [*opening, {"role": "assistant", "content": _PROBE_REPLY}]
        prompt = self._render(opening, True)
        closed = self._render(history, False)
        if not closed.startswith(prompt):
            return "the rendered prompt is not a prefix of the conversation with the reply"
        if closed[len(prompt) : self._reply_end(closed)] != _PROBE_REPLY:
            return "the template adds text between the assistant header and the reply"
        cut = self._reply_end(closed) + len(self._end_of_turn_text)
        extended = self._render([*history, {"role": "user", "content": _PROBE_FOLLOW_UP}], True)
        if extended[:cut] != closed[:cut]:
            return "adding a user message rewrites the earlier turns"
        return ""

    def _check_tool_turns(self) -> tuple[bool, str]:
        """Whether the template renders tool calls, and why appending tool results is not
        append-only ("" when it is, or when the template renders no tool calls)."""
        tools = [PROBE_TOOL]
        opening = [{"role": "user", "content": _PROBE_USER}]
        marker = f"{_PROBE_VARIANTS[0][1]}0."
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "id": "call_0", "function": {"name": _PROBE_TOOL_NAME, "arguments": {"probe": marker}}}
            ],
        }
        result = {"role": "tool", "tool_call_id": "call_0", "name": _PROBE_TOOL_NAME, "content": _PROBE_TOOL_RESULT}
        try:
            prompt = self._render(opening, True, tools)
            closed = self._render([*opening, call], False, tools)
            extended = self._render([*opening, call, result], True, tools)
        except Exception:  # a template without tool support may fail on tool_calls or the tool role
            return False, ""
        if marker not in closed:
            return False, ""
        if not closed.startswith(prompt):
            return True, "the rendered prompt is not a prefix of the conversation with the tool call"
        try:
            cut = self._turn_end(closed, [marker])
        except ChatTemplateError as exc:
            return True, str(exc)
        if extended[:cut] != closed[:cut]:
            return True, "adding tool results rewrites the assistant turn that called the tool"
        return True, ""


def check_bridge_messages(messages: Any) -> list[Message]:
    """``messages`` as a list, if they are what a bridge can append (one user message, or tool
    messages possibly followed by one user message); TypeError / ValueError otherwise."""
    if isinstance(messages, (str, dict)) or not isinstance(messages, (list, tuple)):
        raise TypeError(
            "encode_bridge takes a list of messages, e.g. [{'role': 'user', 'content': observation}], "
            f"not {type(messages).__name__}"
        )
    messages = list(messages)
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    tools = 0
    while tools < len(roles) and roles[tools] == "tool":
        tools += 1
    rest = roles[tools:]
    if not roles or rest not in ([], ["user"]):
        raise ValueError(
            "encode_bridge appends one user message, or one or more tool messages possibly followed by one "
            f"user message; got roles {roles}"
        )
    return messages


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())
