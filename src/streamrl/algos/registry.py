"""Advantage estimators and policy losses registered by name.

Estimators have their own keyword signatures (GRPO needs group ids, SPO needs baselines, GAE needs
values); the registry only gives configuration a single place to turn a name into a function.
Built-ins register themselves when ``streamrl.algos`` is imported.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_ADVANTAGES: dict[str, Callable] = {}
_POLICY_LOSSES: dict[str, Callable] = {}


class UnknownAlgorithmError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def _register(table: dict[str, Callable], kind: str, name: str, overwrite: bool) -> Callable[[F], F]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name must be a non-empty string, got {name!r}")

    def decorator(fn: F) -> F:
        if name in table and not overwrite:
            raise ValueError(f"{kind} {name!r} is already registered (pass overwrite=True)")
        table[name] = fn
        return fn

    return decorator


def _lookup(table: dict[str, Callable], kind: str, name: str) -> Callable:
    if name not in table:
        known = sorted(table)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownAlgorithmError(f"unknown {kind} {name!r}{hint} (known: {', '.join(known)})")
    return table[name]


def register_advantage(name: str, *, overwrite: bool = False) -> Callable[[F], F]:
    """Decorator: register an advantage estimator under ``name``."""
    return _register(_ADVANTAGES, "advantage estimator", name, overwrite)


def get_advantage(name: str) -> Callable:
    """The advantage estimator registered as ``name``; unknown names raise ``UnknownAlgorithmError``."""
    return _lookup(_ADVANTAGES, "advantage estimator", name)


def list_advantages() -> list[str]:
    return sorted(_ADVANTAGES)


def register_policy_loss(name: str, *, overwrite: bool = False) -> Callable[[F], F]:
    """Decorator: register a policy loss ``fn(logp, old_logp, advantages, mask, ...) -> (loss, stats)``."""
    return _register(_POLICY_LOSSES, "policy loss", name, overwrite)


def get_policy_loss(name: str) -> Callable:
    return _lookup(_POLICY_LOSSES, "policy loss", name)


def list_policy_losses() -> list[str]:
    return sorted(_POLICY_LOSSES)
