"""``streamrl.envs``: multi-turn environments, their action parsers and prompt builders.

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
    StepResult,
)
from streamrl.envs.registry import (
    UnknownEnvironmentError,
    get_entry,
    list_envs,
    make,
    make_parser,
    make_prompt_builder,
    register,
)

__all__ = [
    "STANDARD_INFO_KEYS",
    "ActionParser",
    "AsyncEnv",
    "Env",
    "EnvSpec",
    "ParsedAction",
    "PromptBuilder",
    "StepResult",
    "UnknownEnvironmentError",
    "get_entry",
    "list_envs",
    "make",
    "make_parser",
    "make_prompt_builder",
    "register",
]
