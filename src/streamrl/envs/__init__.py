"""``streamrl.envs``: multi-turn environments, their tools, action parsers and prompt builders.

Pure Python, no torch. ``make(name)`` builds one; ``list_envs()`` names them all.
"""

from streamrl.envs.base import (
    STANDARD_INFO_KEYS,
    ActionParser,
    AsyncEnv,
    Env,
    EnvSpec,
    ParsedAction,
    PromptBuilder,
    Step,
    StepResult,
)
from streamrl.envs.defaults import ChatPromptBuilder, ReplyParser
from streamrl.envs.registry import (
    UnknownEnvironmentError,
    get_entry,
    list_envs,
    make,
    make_parser,
    make_prompt_builder,
    register,
)
from streamrl.envs.tools import AssistantMessage, ToolCall, tool

__all__ = [
    "STANDARD_INFO_KEYS",
    "ActionParser",
    "AssistantMessage",
    "AsyncEnv",
    "ChatPromptBuilder",
    "Env",
    "EnvSpec",
    "ParsedAction",
    "PromptBuilder",
    "ReplyParser",
    "Step",
    "StepResult",
    "ToolCall",
    "UnknownEnvironmentError",
    "get_entry",
    "list_envs",
    "make",
    "make_parser",
    "make_prompt_builder",
    "register",
    "tool",
]
