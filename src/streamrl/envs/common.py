"""Helpers shared by several environments: the ``<think>``/``<action>`` projection.

The projection follows verl-agent's: lowercase the model output, take the text between the first
``<action>`` and the ``</action>`` after it; without both tags, send the last ``fallback_chars``
characters (the environment then answers with its no-op) and flag the step invalid. A missing
``<think>``/``</think>`` pair (when required) or any CJK character also flags it invalid.
Admissibility is never checked here: the environment answers inadmissible commands itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from streamrl.envs.base import ActionParser, ParsedAction, PromptBuilder

# CJK ideographs (and extension A, compatibility ideographs), kana and hangul syllables.
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def contains_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


def tagged_text(text: str, tag: str) -> str | None:
    """The text between the first ``<tag>`` and the next ``</tag>``; None if either is missing."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    start = text.find(opening)
    if start < 0:
        return None
    end = text.find(closing, start + len(opening))
    if end < 0:
        return None
    return text[start + len(opening) : end]


def project_think_action(text: str, *, require_think: bool = True, fallback_chars: int = 30) -> ParsedAction:
    """verl-agent's action projection (see the module docstring). Never raises."""
    lowered = text.lower()
    inner = tagged_text(lowered, "action")
    if inner is None:
        return ParsedAction(lowered[-fallback_chars:], False, "missing <action>...</action>")
    action = inner.strip()
    if not action:
        return ParsedAction(action, False, "empty <action></action>")
    if require_think and ("<think>" not in text or "</think>" not in text):
        return ParsedAction(action, False, "missing <think>...</think>")
    if contains_cjk(text):
        return ParsedAction(action, False, "contains CJK characters")
    return ParsedAction(action, True)


class ThinkActionParser(ActionParser):
    """``project_think_action`` as an ``ActionParser``.

    ``require_think=False`` suits a tiny model fine-tuned to answer with the action tag alone.
    ``fallback_chars`` is 30 for ALFWorld and 20 for WebShop in verl-agent.
    """

    def __init__(self, require_think: bool = True, fallback_chars: int = 30):
        if fallback_chars < 0:
            raise ValueError(f"fallback_chars must be >= 0, got {fallback_chars}")
        self.require_think = require_think
        self.fallback_chars = fallback_chars

    def parse(self, text: str) -> ParsedAction:
        return project_think_action(text, require_think=self.require_think, fallback_chars=self.fallback_chars)


PROMPT_STYLES = ("verl", "compact")
COMPACT_THINK_INSTRUCTION = "Think inside <think></think>, then reply <action>one action</action>."
COMPACT_ACTION_INSTRUCTION = "Reply <action>one action</action>."


def prompt_instruction(
    env: str,
    style: str,
    history_length: int,
    require_think: bool,
    instruction: str | None,
    verl: tuple[str, str],
    tool_request: str | None = None,
) -> str:
    """Check the prompt options every verl-style/compact builder shares and return its instruction:
    ``instruction`` when given; in the tool form (``tool_request``, e.g. "call execute with one
    admissible action") that request; else ``verl`` (think, action-only) or the compact texts."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"{env} prompt builder: style must be one of {PROMPT_STYLES}, got {style!r}")
    if history_length < 0:
        raise ValueError(f"{env} prompt builder: history_length must be >= 0, got {history_length}")
    if instruction is not None:
        return instruction
    if tool_request is not None:
        return f"Think inside <think></think>, then {tool_request}." if require_think else f"{tool_request.capitalize()}."
    think, action = verl if style == "verl" else (COMPACT_THINK_INSTRUCTION, COMPACT_ACTION_INSTRUCTION)
    return think if require_think else action


@dataclass(eq=False)
class InstructedPromptBuilder(PromptBuilder):
    """The options every verl-style/compact prompt builder takes, in one signature (the one
    ``env.prompt`` options are checked against); a builder adds its own fields and, in its
    ``__post_init__``, settles the text its prompts end with (``_instruct``)."""

    style: str = "verl"
    history_length: int = 2
    require_think: bool = True
    #: the instruction the prompts end with (None: the style's, ``instruction_text``)
    instruction: str | None = None
    tools: bool = False
    instruction_text: str = field(default="", init=False)

    def _instruct(self, env: str, verl: tuple[str, str], tool_request: str) -> None:
        self.instruction_text = prompt_instruction(env, self.style, self.history_length, self.require_think, self.instruction,
                                                   verl, tool_request if self.tools else None)
