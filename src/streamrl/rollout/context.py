"""How the model's input ids are built during an episode, for each layout.

Full history grows one transcript by appending (``prompt | a1 | bridge(o1) | a2 | ...``): the
opening is rendered once with the chat template, and each later observation is tokenised alone
by ``ChatCodec.encode_bridge``: a user message in the text form, the environment's tool messages
in the tool form. Per-step renders a fresh prompt every turn from the prompt builder's last-k
history. In the tool form every rendering carries the environment's tool schemas (``tools``).
Whatever is built here is exactly what the engine sees and what the training sample holds.
"""

from __future__ import annotations

from typing import Any

from streamrl.envs.base import PromptBuilder
from streamrl.policy.protocols import ChatCodec

Tools = list[dict[str, Any]] | None


def opening_ids(
    codec: ChatCodec, builder: PromptBuilder, observation: str, info: dict[str, Any], tools: Tools = None
) -> list[int]:
    """The full-history transcript's first context: system prompt (if any) + first user message."""
    messages = []
    system = builder.system_prompt()
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": builder.first_message(observation, info)})
    return list(codec.encode_chat(messages, add_generation_prompt=True, tools=tools))


def bridge_ids(
    codec: ChatCodec,
    builder: PromptBuilder,
    previous_action_ids: list[int],
    observation: str,
    info: dict[str, Any],
    answer: list[dict[str, Any]] | None = None,
    tools: Tools = None,
) -> list[int]:
    """The ids appended after an action to carry the next observation: ``answer``, the
    environment's messages in the tool form, else a user message.

    The prompt builder writes the observation as the model sees it (``next_message``): the user
    message of the text form, or the first tool result of the tool form (further results, for
    more calls in the turn, stay as the environment wrote them).

    A bridge follows the model's own end-of-turn token. When the action lacks it (cut by
    ``max_new_tokens`` or ended by a stop string) the end-of-turn id is inserted here, as an
    environment token, so the transcript stays well-formed and the model is never trained on it.
    """
    end = codec.end_of_turn_id
    closing = [] if previous_action_ids and previous_action_ids[-1] == end else [end]
    if answer:
        first = answer[0]
        messages = [{**first, "content": builder.next_message(first["content"], info)}, *answer[1:]]
    else:
        messages = [{"role": "user", "content": builder.next_message(observation, info)}]
    return closing + list(codec.encode_bridge(messages, tools=tools))


def step_prompt_ids(
    codec: ChatCodec,
    builder: PromptBuilder,
    initial_observation: str,
    history: list[tuple[str, str]],
    observation: str,
    info: dict[str, Any],
    max_prompt_tokens: int | None,
    tools: Tools = None,
) -> tuple[list[int], bool]:
    """A per-step prompt and whether it was left-truncated to ``max_prompt_tokens``.

    Left truncation keeps the most recent tokens, so the last context token (the pre-action
    boundary where a value is read) is unchanged.
    """
    messages = builder.step_messages(initial_observation, history, observation, info)
    ids = list(codec.encode_chat(messages, add_generation_prompt=True, tools=tools))
    return left_truncate(ids, max_prompt_tokens)


def left_truncate(ids: list[int], max_tokens: int | None) -> tuple[list[int], bool]:
    """Keep the last ``max_tokens`` ids; report whether anything was cut."""
    if max_tokens is None or len(ids) <= max_tokens:
        return ids, False
    return ids[len(ids) - max_tokens :], True
