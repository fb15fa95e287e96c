"""Environments registered by name. Built-ins are imported lazily, so importing ``streamrl.envs``
stays cheap; users add their own with ``register``, or name one as ``module:attr`` (imported on
first use): ``attr`` is an ``EnvEntry``, or an environment class (or factory), whose optional
attributes ``action_parser`` and ``prompt_builder`` are its parser and prompt-builder classes; without
them it gets ``ReplyParser`` and ``ChatPromptBuilder`` (docs/environments.md)."""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from streamrl.envs.base import ActionParser, Env, PromptBuilder
from streamrl.envs.defaults import ChatPromptBuilder, ReplyParser


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


class EnvOptionError(ValueError):
    """Options an environment, parser or prompt builder cannot be built with: one line naming the field."""


#: what building an environment raises for a bad option value, a missing dependency or missing data
BUILD_ERRORS = (TypeError, ValueError, ImportError, OSError, KeyError)


def register(
    name: str,
    env: Callable[..., Env],
    parser: Callable[..., ActionParser] | None = None,
    prompt_builder: Callable[..., PromptBuilder] | None = None,
    *,
    overwrite: bool = False,
) -> None:
    """Register an environment under ``name``: its factory, and its action parser and prompt builder
    (default: the factory's ``action_parser`` / ``prompt_builder`` attributes, else the defaults)."""
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"environment {name!r} is already registered (pass overwrite=True)")
    _REGISTRY[name] = _entry(env, parser, prompt_builder)


def _entry(env: Callable[..., Env], parser: Any = None, prompt_builder: Any = None) -> EnvEntry:
    parser = parser or getattr(env, "action_parser", None) or ReplyParser
    if prompt_builder is None:
        prompt_builder = getattr(env, "prompt_builder", None)
    if prompt_builder is None:
        spec = getattr(env, "spec", None)  # a class-level spec gives the default builder its instructions
        instructions = getattr(spec, "instructions", None)
        prompt_builder = functools.partial(ChatPromptBuilder, instructions=instructions) if instructions else ChatPromptBuilder
    return EnvEntry(env, parser, prompt_builder)


def get_entry(name: str) -> EnvEntry:
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _REGISTRY and ":" in name:
        _REGISTRY[name] = _load_reference(name)
    if name not in _REGISTRY:
        known = list_envs()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownEnvironmentError(f"unknown environment {name!r}{hint} (known: {', '.join(known)})")
    return _REGISTRY[name]


def _load_reference(name: str) -> EnvEntry:
    """The entry ``module:attr`` names (see the module docstring)."""
    module_name, _, attr = name.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise UnknownEnvironmentError(f"cannot load environment {name!r}: {error}") from None
    if isinstance(target, EnvEntry):
        return target
    if not callable(target):
        raise UnknownEnvironmentError(f"environment {name!r} is a {type(target).__name__}, not an environment class")
    return _entry(target)


def option_problem(factory: Callable[..., Any], options: dict[str, Any]) -> str | None:
    """Why ``factory(**options)`` cannot bind (unknown or missing keywords), or None."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return None
    try:
        signature.bind(**options)
    except TypeError as error:
        known = [p.name for p in signature.parameters.values() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return f"{error} (accepted: {', '.join(known) or 'none'})"
    return None


def build(field: str, factory: Callable[..., Any], options: dict[str, Any]) -> Any:
    """``factory(**options)``, or ``EnvOptionError`` naming ``field`` and what is wrong, in one line."""
    problem = option_problem(factory, options)
    if problem:
        raise EnvOptionError(f"{field}: {problem}")
    try:
        return factory(**options)
    except BUILD_ERRORS as error:
        raise EnvOptionError(f"{field}: {' '.join(str(error).split())}") from None


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
