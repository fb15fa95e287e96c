"""One constructor for the generation engines of ``model.engine``: ``hf`` (``HFEngine``, any device)
and ``vllm`` (``VLLMEngine``, a GPU with the ``vllm`` extra installed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.policy.protocols import InferenceEngine

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy

ENGINES = ("hf", "vllm")


def make_engine(
    kind: str, policy: Policy, *, version: int = 0, seed: int = 0, threads: int | None = None
) -> InferenceEngine:
    """An engine over a copy of ``policy``'s weights at ``version`` (``threads``: HF engine only)."""
    if kind == "hf":
        from streamrl.policy.hf_engine import HFEngine

        return HFEngine.from_policy(policy, version=version, seed=seed, threads=threads)
    if kind == "vllm":
        from streamrl.policy.vllm_engine import VLLMEngine

        return VLLMEngine.from_policy(policy, version=version, seed=seed)
    raise ValueError(f"model.engine must be one of {', '.join(ENGINES)}, got {kind!r}")
