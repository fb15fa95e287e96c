"""One constructor for the generation engines of ``model.engine``: ``hf`` (``HFEngine``, any device)
and ``vllm`` (``VLLMEngine``, a GPU with the ``vllm`` extra installed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrl.policy.protocols import InferenceEngine

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy

ENGINES = ("hf", "vllm")
#: the weights the engine generates with: the policy's own dtype, a bfloat16 copy, or int8 projections
ROLLOUT_DTYPES = ("same", "bfloat16", "int8")


def make_engine(
    kind: str, policy: Policy, *, version: int = 0, seed: int = 0, threads: int | None = None,
    rollout_dtype: str = "same", capture_layer: int | None = None, prefix_cache_tokens: int | None = None,
) -> InferenceEngine:
    """An engine over a copy of ``policy``'s weights at ``version`` (``threads``: HF engine only);
    ``rollout_dtype``: ``same`` as the policy, ``bfloat16`` or ``int8`` (HF engine only);
    ``capture_layer``: results carry that block's inputs (``GenerationResult.block_inputs``; HF
    engine with the policy's own weights only, see ``block_inputs_refusal``); ``prefix_cache_tokens``:
    the most tokens whose KV the HF engine keeps for prompts that extend them (None: its default)."""
    if rollout_dtype not in ROLLOUT_DTYPES:
        raise ValueError(f"model.rollout_dtype must be one of {', '.join(ROLLOUT_DTYPES)}, got {rollout_dtype!r}")
    if kind == "hf":
        from streamrl.policy.hf_engine import HFEngine

        # int8: what is not quantised (embeddings, norms, attention, down_proj) runs in float32, the
        # dtype fbgemm's dynamic int8 linear takes and returns, whatever the policy's own dtype
        dtype = {"bfloat16": "bfloat16", "int8": "float32"}.get(rollout_dtype)
        cache: dict[str, Any] = {} if prefix_cache_tokens is None else {"prefix_cache_tokens": prefix_cache_tokens}
        return HFEngine.from_policy(policy, dtype=dtype, version=version, seed=seed, threads=threads,
                                    int8=rollout_dtype == "int8",
                                    capture_layer=capture_layer if rollout_dtype == "same" else None, **cache)
    if rollout_dtype != "same":
        raise ValueError(f"model.rollout_dtype={rollout_dtype} is the hf engine's (vLLM quantises through its own options)")
    if kind == "vllm":
        from streamrl.policy.vllm_engine import VLLMEngine

        return VLLMEngine.from_policy(policy, version=version, seed=seed)
    raise ValueError(f"model.engine must be one of {', '.join(ENGINES)}, got {kind!r}")


def block_inputs_refusal(engine: InferenceEngine, kind: str, rollout_dtype: str) -> str | None:
    """Why ``engine`` (made with a ``capture_layer``) hands over no block inputs, or None when it
    does. Only the HF engine's own forward keeps them, and only with the policy's own weights: a
    bfloat16 or int8 copy computes other states than the learner's frozen blocks."""
    if getattr(engine, "block_inputs_layer", None) is not None:
        return None
    if kind != "hf":
        return f"the {kind} engine does not expose hidden states"
    if rollout_dtype != "same":
        return f"model.rollout_dtype={rollout_dtype} computes other hidden states than the learner's blocks"
    return "the engine's own forward covers Llama-family models only"
