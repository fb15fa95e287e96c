"""Environments registered by name. Built-ins are imported lazily, so importing ``streamrl.envs``
stays cheap; users add their own with ``register``."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from streamrl.envs.base import ActionParser, Env, PromptBuilder


@dataclass(frozen=True)
class EnvEntry:
    """How to build the three roles of one environment."""

    env: Callable[..., Env]
    parser: Callable[..., ActionParser]
    prompt_builder: Callable[..., PromptBuilder]


_REGISTRY: dict[str, EnvEntry] = {}
# name -> module that calls ``register(name, ...)`` when imported
_BUILTIN_MODULES = {
    "guess_number": "streamrl.envs.guess_number",
    "pick_object": "streamrl.envs.pick_object",
    "alfworld_lite": "streamrl.envs.alfworld_lite",
    "alfworld_real": "streamrl.envs.alfworld_real",
    "math_tir": "streamrl.envs.math_tir",
    "webshop_lite": "streamrl.envs.webshop_lite",
}


class UnknownEnvironmentError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def register(
    name: str,
    env: Callable[..., Env],
    parser: Callable[..., ActionParser],
    prompt_builder: Callable[..., PromptBuilder],
    *,
    overwrite: bool = False,
) -> None:
    """Register an environment under ``name`` (its factory, action parser and prompt builder)."""
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"environment {name!r} is already registered (pass overwrite=True)")
    _REGISTRY[name] = EnvEntry(env, parser, prompt_builder)


def get_entry(name: str) -> EnvEntry:
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _REGISTRY:
        known = list_envs()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownEnvironmentError(f"unknown environment {name!r}{hint} (known: {', '.join(known)})")
    return _REGISTRY[name]


def make(name: str, **options: Any) -> Env:
    """Build environment ``name``; ``options`` go to its constructor."""
    return get_entry(name).env(**options)


def make_parser(name: str, **options: Any) -> ActionParser:
    return get_entry(name).parser(**options)


def make_prompt_builder(name: str, **options: Any) -> PromptBuilder:
    return get_entry(name).prompt_builder(**options)


def list_envs() -> list[str]:
    """Every environment name: built-ins and user registrations."""
    return sorted(set(_REGISTRY) | set(_BUILTIN_MODULES))
