"""``streamrl.policy``: models, tokenizers, batched generation with behaviour log-probs, scoring,
and SAPO value tokens.

Heavy imports (torch, transformers) happen on first use of a name, so importing the package is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from streamrl.policy.errors import ChatTemplateError, MissingDependencyError, PolicyLoadError
from streamrl.policy.protocols import (
    ChatCodec,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
)

_LAZY = {
    "load_policy": "streamrl.policy.loading",
    "KNOWN_SPECS": "streamrl.policy.loading",
    "Policy": "streamrl.policy.policy",
    "ChatTemplateCodec": "streamrl.policy.chat",
    "ToolFormat": "streamrl.policy.tool_format",
    "FORMATS": "streamrl.policy.tool_format",
    "resolve_tool_format": "streamrl.policy.tool_format",
    "HFEngine": "streamrl.policy.hf_engine",
    "score": "streamrl.policy.scoring",
    "forward_for_loss": "streamrl.policy.scoring",
    "ScoreOutput": "streamrl.policy.scoring",
}

__all__ = [
    "ChatCodec",
    "ChatTemplateError",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "InferenceEngine",
    "MissingDependencyError",
    "PolicyLoadError",
    "SamplingParams",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'streamrl.policy' has no attribute {name!r}")
