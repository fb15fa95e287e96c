"""``ChatCodec`` over a Hugging Face tokenizer's chat template.

Full-history rollouts grow a transcript by appending: ``prompt | a1 | bridge(o1) | a2 | ...``. The
bridge is whatever the template writes between the model's end-of-turn token and the content of
the next assistant turn (for ChatML: ``\\n<|im_start|>user\\n{o1}<|im_end|>\\n<|im_start|>assistant\\n``).
Rather than hard-coding ChatML, the codec renders a small probe conversation through the template
and cuts the bridge out of it, so any template works as long as it is append-only: rendering more
messages never rewrites what was rendered before. Templates that are not (Qwen3 drops earlier
``<think>`` blocks, for instance) are detected on construction; ``encode_bridge`` then raises.

Exactness relies on the end-of-turn token being a special token: tokenisation never merges across
it, so the ids of a rendered conversation split cleanly at every end-of-turn.
"""

from __future__ import annotations

from typing import Any

from streamrl.policy.errors import ChatTemplateError

_PROBE_USER = "probe question 1"
_PROBE_REPLY = "probe reply 1"
_PROBE_FOLLOW_UP = "probe question 2"


class ChatTemplateCodec:
    """Implements ``streamrl.policy.api.ChatCodec`` for a tokenizer that has a chat template."""

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {type(tokenizer).__name__} has no chat template; set tokenizer.chat_template "
                "(a Jinja string) or use a model folder that ships chat_template.jinja"
            )
        self.tokenizer = tokenizer
        self._end_of_turn_id, self._end_of_turn_text = self._find_end_of_turn()
        self.append_only, self._not_append_only_reason = self._check_append_only()

    # -- ChatCodec -------------------------------------------------------------------------------

    @property
    def end_of_turn_id(self) -> int:
        return self._end_of_turn_id

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self._encode(self._render(messages, add_generation_prompt))

    def encode_bridge(self, user_message: str) -> list[int]:
        """Ids following the model's end-of-turn token: ``user_message`` as a user turn, then the
        opening of the next assistant turn."""
        if not self.append_only:
            raise ChatTemplateError(
                f"this chat template is not append-only ({self._not_append_only_reason}); "
                "use per-step prompts (encode_chat) instead of a growing transcript"
            )
        history = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}]
        text = self._render([*history, {"role": "user", "content": user_message}], True)
        cut = self._reply_end(text) + len(self._end_of_turn_text)
        if self._render(history, False)[:cut] != text[:cut]:
            raise ChatTemplateError("the chat template rewrote earlier turns when a user message was added")
        return self._encode(text[cut:])

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` without special tokens (for display and action parsing only)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # -- helpers -------------------------------------------------------------------------------

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

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

    def _check_append_only(self) -> tuple[bool, str]:
        opening = [{"role": "user", "content": _PROBE_USER}]
        history = [*opening, {"role": "assistant", "content": _PROBE_REPLY}]
        prompt = self._render(opening, True)
        closed = self._render(history, False)
        if not closed.startswith(prompt):
            return False, "the rendered prompt is not a prefix of the conversation with the reply"
        if closed[len(prompt) : self._reply_end(closed)] != _PROBE_REPLY:
            return False, "the template adds text between the assistant header and the reply"
        cut = self._reply_end(closed) + len(self._end_of_turn_text)
        extended = self._render([*history, {"role": "user", "content": _PROBE_FOLLOW_UP}], True)
        if extended[:cut] != closed[:cut]:
            return False, "adding a user message rewrites the earlier turns"
        return True, ""
