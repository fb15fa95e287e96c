"""Errors the policy layer raises for bad input, each naming what is wrong and how to fix it."""

from __future__ import annotations


class PolicyLoadError(ValueError):
    """A policy spec, path or option could not be turned into a model."""


class MissingDependencyError(ImportError):
    """An optional package is needed for the requested feature; the message names the install."""


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot do what was asked (e.g. it is not append-only)."""
