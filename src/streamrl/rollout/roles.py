"""The action parser and prompt builder an episode is played with, for either action form.

Text form: the environment's own parser and prompt builder, built from their options. Tool form: the
model's tool-call format reads the reply (``ToolCallParser``), and the prompt builder is told so with
``tools=True`` when its constructor takes a ``tools`` option (the built-in ones then ask for a call
instead of a tagged action).
"""

from __future__ import annotations

import inspect
from typing import Any

from streamrl.envs import ActionParser, PromptBuilder, get_entry, make_parser, make_prompt_builder
from streamrl.policy.tool_format import ToolFormat
from streamrl.rollout.tool_calls import ToolCallParser


def action_parser(env: str, options: dict[str, Any], tool_format: ToolFormat | None) -> ActionParser:
    """The text form's parser (``tool_format`` None), or the tool form's."""
    return make_parser(env, **options) if tool_format is None else ToolCallParser(tool_format)


def prompt_builder(env: str, options: dict[str, Any], tools: bool) -> PromptBuilder:
    if tools and "tools" not in options and takes_tools_option(get_entry(env).prompt_builder):
        options = {**options, "tools": True}
    return make_prompt_builder(env, **options)


def takes_tools_option(factory: Any) -> bool:
    try:
        return "tools" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False

