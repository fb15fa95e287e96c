"""Optional LoRA adapters through ``peft``, and plain (merged) weights for generation engines.

The engine runs a plain model, so a LoRA policy hands it merged weights ``W + B A * scale`` computed
out of place: the learner's own model is never touched (``merge_adapter``/``unmerge_adapter``
would mutate it under a concurrently training learner and drift by rounding each cycle).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from streamrl.policy.errors import MissingDependencyError, PolicyLoadError

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
_KNOWN_KEYS = {"r", "alpha", "dropout", "target_modules"}
#: state-dict key pieces that exist only in peft-wrapped models
_PEFT_ONLY = ("lora_", "trainable_tokens_delta")
_PEFT_WRAPPERS = (".base_layer", ".token_adapter")


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise MissingDependencyError("LoRA needs the optional package peft: `pip install peft`") from exc
    return peft


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Silence the deprecation warning peft triggers in transformers 5.x on every wrap and load."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def is_peft_model(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def apply_lora(model: Any, options: dict[str, Any], value_token_ids: tuple[int, int] | None) -> Any:
    """Wrap ``model`` with LoRA adapters; only adapter parameters stay trainable.

    ``options``: ``r`` (16), ``alpha`` (2 r), ``dropout`` (0), ``target_modules`` (attention projections).
    The value-token rows of the LM head are made trainable too (peft trainable tokens), so SAPO's
    readout can learn while the rest of the embedding stays frozen.
    """
    unknown = set(options) - _KNOWN_KEYS
    if unknown:
        raise PolicyLoadError(f"unknown LoRA option(s) {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
    peft = _peft()
    rank = int(options.get("r", 16))
    if rank <= 0:
        raise PolicyLoadError(f"LoRA rank r must be positive, got {rank}")
    extra: dict[str, Any] = {}
    if value_token_ids is not None:
        embedding_name = _embedding_module_name(model)
        extra["trainable_token_indices"] = {embedding_name: list(value_token_ids)}
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=float(options.get("alpha", 2 * rank)),
        lora_dropout=float(options.get("dropout", 0.0)),
        target_modules=list(options.get("target_modules", DEFAULT_TARGET_MODULES)),
        task_type="CAUSAL_LM",
        **extra,
    )
    try:
        with quiet_peft():
            return peft.get_peft_model(model, config)
    except ValueError as exc:  # e.g. target modules that do not exist
        raise PolicyLoadError(f"could not apply LoRA {options}: {exc}") from exc


def _embedding_module_name(model: Any) -> str:
    embedding = model.get_input_embeddings()
    for name, module in model.named_modules():
        if module is embedding:
            return name.rsplit(".", 1)[-1]
    raise PolicyLoadError("could not find the model's input embedding module for LoRA value-token training")


def merged_weights(model: Any) -> dict[str, Any]:
    """A plain model's state dict: a peft model's adapters merged in, out of place, detached.

    Tensors of a plain model are returned as detached views (no copy); the receiver copies them.
    """
    if not is_peft_model(model):
        return {key: value.detach() for key, value in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer
    from peft.utils.other import TrainableTokensWrapper

    base = model.get_base_model()
    adapters = list(model.active_adapters)
    merged: dict[str, Any] = {}
    for key in base.state_dict():
        if any(piece in key for piece in _PEFT_ONLY):
            continue
        plain_key = key
        for wrapper in _PEFT_WRAPPERS:
            plain_key = plain_key.replace(wrapper, "")
        module_name, _, param = plain_key.rpartition(".")
        module = base.get_submodule(module_name)
        if isinstance(module, LoraLayer) and param == "weight":
            layer: Any = module.get_base_layer()  # an nn.Module: torch types its .weight as Tensor | Module
            weight = layer.weight.detach()
            for adapter in adapters:
                if adapter in module.lora_A:
                    # peft defines get_delta_weight on each concrete LoraLayer (Linear, Embedding, ...), not the base
                    weight = weight + module.get_delta_weight(adapter).detach()  # type: ignore[attr-defined]
            merged[plain_key] = weight
        elif isinstance(module, TrainableTokensWrapper) and param == "weight":
            merged[plain_key] = module.token_adapter.get_merged_weights(adapters).detach()
        elif isinstance(module, LoraLayer):  # e.g. the bias of an adapted layer
            merged[plain_key] = getattr(module.get_base_layer(), param).detach()
        else:
            merged[plain_key] = _tensor(base, plain_key)
    return merged


def _tensor(model: Any, key: str) -> Any:
    try:
        return model.get_parameter(key).detach()
    except AttributeError:
        return model.get_buffer(key).detach()


def share_frozen_weights(model: Any, engine_model: Any) -> int:
    """Point a peft ``model``'s frozen base parameters at ``engine_model``'s (a plain, merged copy
    of it, as ``inference_model`` makes) wherever they hold the same weights: every parameter
    outside the LoRA-wrapped layers (whose engine copies have the adapters merged in) and the
    trainable-token wrappers, in the same shape, dtype and device. A learner and an engine in one
    process then hold one copy of the frozen base instead of two. Returns the bytes the model no
    longer holds itself (0 for a plain model: all of it trains).

    The engine's parameters may be views in its own layout (``fused_forward``'s fused, input-major
    storage); the model's modules compute the same function on them. Nothing writes to them: the
    learner does not train them, and the engine skips them in ``update_weights``
    (``HFEngine``: a tensor that already is its own is not copied)."""
    if not is_peft_model(model):
        return 0
    from peft.tuners.lora import LoraLayer
    from peft.utils.other import TrainableTokensWrapper

    base = model.get_base_model()
    engine_parameters = dict(engine_model.named_parameters(remove_duplicate=False))
    adapted = [name for name, module in base.named_modules() if isinstance(module, (LoraLayer, TrainableTokensWrapper))]
    freed: dict[int, int] = {}  # by the replaced parameter: a tied embedding and head count once
    for name, module in base.named_modules():
        if any(name == a or name.startswith(a + ".") for a in adapted):
            continue
        for param_name, parameter in list(module.named_parameters(recurse=False)):
            target = engine_parameters.get(f"{name}.{param_name}" if name else param_name)
            if (target is None or parameter.requires_grad or target is parameter or target.shape != parameter.shape
                    or target.dtype != parameter.dtype or target.device != parameter.device):
                continue
            freed[id(parameter)] = parameter.numel() * parameter.element_size()
            setattr(module, param_name, target)
    return sum(freed.values())


def own_storage(model: Any) -> Any:
    """``model`` with every parameter contiguous in a storage of its own: what a copy of a model
    that shares weights with an engine (views into the engine's layout) needs before it is saved
    (safetensors refuses shared storage) or handed to another engine. Returns ``model``."""
    import torch

    for parameter in model.parameters():
        if not parameter.is_contiguous() or parameter.untyped_storage().nbytes() != parameter.nbytes:
            parameter.data = parameter.data.clone(memory_format=torch.contiguous_format)
    return model
