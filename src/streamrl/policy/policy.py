"""``Policy``: a causal LM, its tokenizer and chat codec, and SAPO's value tokens, in one object.

``Policy`` implements ``streamrl.policy.protocols.ChatCodec``. It gives engines their own plain copy of
the model (``inference_model``) and the weights to refresh it with (``state_dict_for_engine``),
and saves to a folder that ``load_policy`` reads back (a ``save_pretrained`` folder, or a peft
adapter folder plus the recipe of its base model).

Mixed precision (``compute_dtype``): a policy that is trained keeps its weights in float32 while
its matrix multiplies run in bfloat16 (``autocast``) and its engines get bfloat16 copies. Adam's
updates are often below bfloat16's resolution (8 bits of mantissa: a step of 3e-4 on a weight of
0.05 rounds away), so training the bfloat16 weights themselves loses much of what RL learns
(measured on the ``pick_object`` toy: docs/results/speed.md, "Mixed precision").
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrl.policy.chat import ChatTemplateCodec
from streamrl.policy.lora import is_peft_model, merged_weights, own_storage
from streamrl.policy.tool_format import ToolFormat, resolve_tool_format

#: written next to the weights; records value tokens and, for LoRA, how to rebuild the base model
POLICY_FILE = "streamrl_policy.json"
POLICY_FORMAT = 1


@dataclass
class Policy:
    model: Any
    tokenizer: Any
    #: (w+, w-), or None when value tokens are disabled
    value_token_ids: tuple[int, int] | None
    #: never sampled and excluded from the action vocabulary: value tokens and rows without a token
    banned_token_ids: tuple[int, ...]
    #: how to rebuild the base weights, e.g. {"spec": "tiny", "model_overrides": {...}, "seed": 0}
    base_recipe: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] | None = None
    #: the dtype engines and the learner's matrix multiplies run in, when it differs from the
    #: weights' (float32 weights, bfloat16 compute); None: the weights' dtype
    compute_dtype: Any = None
    codec: ChatTemplateCodec = field(init=False, repr=False)
    #: ``model.tool_format``: a format name or "auto" (``tool_format`` resolves it once)
    tool_format_request: str = "auto"
    #: names of the parameters the model trains without ``limit_training`` (set by its first call)
    _trainable_names: set[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.codec = ChatTemplateCodec(self.tokenizer)

    # -- ChatCodec -------------------------------------------------------------------------------

    @property
    def end_of_turn_id(self) -> int:
        return self.codec.end_of_turn_id

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        return self.codec.encode_chat(messages, add_generation_prompt, tools)

    def encode_bridge(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.codec.encode_bridge(messages, tools)

    def render_reply(self, message: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> str:
        return self.codec.render_reply(message, tools)

    def decode(self, token_ids: list[int]) -> str:
        return self.codec.decode(token_ids)

    @functools.cached_property
    def _resolved_tool_format(self) -> tuple[ToolFormat, str]:
        return resolve_tool_format(self.tokenizer, self.tool_format_request)

    @property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (``tool_format_request`` resolved, once, on first use:
        a model whose template renders no tools never asks)."""
        return self._resolved_tool_format[0]

    @property
    def tool_format_reason(self) -> str:
        """One line: the format, and why it was chosen."""
        return self._resolved_tool_format[1]

    @property
    def append_only(self) -> bool:
        """Whether the chat template only appends when user or tool messages are added."""
        return self.codec.append_only

    @property
    def not_append_only_reason(self) -> str:
        return self.codec.not_append_only_reason

    # -- model facts -------------------------------------------------------------------------------

    @property
    def is_lora(self) -> bool:
        return is_peft_model(self.model)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    def describe(self) -> dict[str, Any]:
        """What the model is, for a run's first line and its summary: parameters (and trained
        ones), hidden size, layers, dtype."""
        config = self.model.config
        return {
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "trained_parameters": sum(p.numel() for p in self.trainable_parameters()),
            "hidden_size": getattr(config, "hidden_size", None),
            "layers": getattr(config, "num_hidden_layers", None),
            "dtype": str(self.run_dtype).removeprefix("torch."),
        }

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head: every id a generation engine can return lies below this."""
        head = self.model.get_output_embeddings()
        return int(head.weight.shape[0]) if head is not None else int(self.model.config.vocab_size)

    @property
    def run_dtype(self) -> Any:
        """The dtype the model computes in: ``compute_dtype``, else the weights'."""
        return self.compute_dtype or self.dtype

    def autocast(self) -> Any:
        """A context in which forward passes of ``model`` compute in ``compute_dtype`` (torch's
        autocast: matrix multiplies in bfloat16, gradients reaching the float32 weights); a no-op
        context without mixed precision."""
        import torch

        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def trainable_parameters(self) -> list[Any]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def limit_training(self, *, top_layers: int | None = None, value_rows: bool = True) -> None:
        """Freeze what a run need not train, so that the backward pass stops early.

        ``top_layers``: only parameters of the top ``top_layers`` transformer blocks (and those
        after them: final norm, an untied head) stay trainable; LoRA adapters of lower blocks keep
        acting, frozen. The backward pass then ends at the lowest trained block instead of the
        embedding (about a third less learner time with half the blocks). ``value_rows=False``
        freezes LoRA's trainable value-token rows: an algorithm that never reads values gives them
        no gradient, yet training them drags every backward pass down to the embedding.
        """
        layers = getattr(self.model.config, "num_hidden_layers", None)
        first_trained: int | None = None
        if top_layers is not None:
            if layers is None or not 1 <= top_layers <= layers:
                raise ValueError(f"top_layers must be between 1 and the model's {layers} layers, got {top_layers}")
            first_trained = layers - top_layers
        if self._trainable_names is None:  # what the model trains unlimited; later calls start from it
            self._trainable_names = {name for name, p in self.model.named_parameters() if p.requires_grad}
        seen_block = False
        for name, parameter in self.model.named_parameters():
            block = _block_index(name)
            seen_block |= block is not None
            if "trainable_tokens_delta" in name:  # the value rows
                frozen = not value_rows
            else:  # a lower block, or the embedding below the blocks
                frozen = first_trained is not None and (not seen_block or block is not None and block < first_trained)
            parameter.requires_grad_(name in self._trainable_names and not frozen)

    # -- engines -------------------------------------------------------------------------------

    def state_dict_for_engine(self) -> dict[str, Any]:
        """Plain (LoRA-merged) weights for ``InferenceEngine.update_weights``.

        Tensors may share storage with the live model; engines copy them on receipt, so the learner
        may keep training as soon as ``update_weights`` returns.
        """
        return merged_weights(self.model)

    def inference_model(self, dtype: Any = None, device: Any = None) -> Any:
        """A separate, frozen, plain copy of the model (LoRA merged in) for a generation engine, in
        ``dtype`` (default: ``run_dtype``)."""
        clone = own_storage(copy.deepcopy(self.model))
        if is_peft_model(clone):
            clone = clone.merge_and_unload()
        clone.requires_grad_(False)
        for parameter in clone.parameters():
            parameter.grad = None
        clone.eval()
        return clone.to(device=self.device if device is None else device, dtype=self.run_dtype if dtype is None else dtype)

    # -- persistence -------------------------------------------------------------------------------

    def base_model_folder(self) -> str | None:
        """The absolute path of a LoRA policy's base model as a Hugging Face folder on disk, when
        there is one that PEFT can load the adapter onto (same vocabulary rows); None for a
        generated base (``tiny``) or when value tokens were added to the vocabulary."""
        if not self.is_lora:
            return None
        base = self.model.get_base_model()
        rows = int(base.get_input_embeddings().weight.shape[0])
        for candidate in (self.base_recipe.get("spec"), getattr(base.config, "_name_or_path", None)):
            if not candidate or not (Path(str(candidate)) / "config.json").is_file():
                continue
            try:
                saved = json.loads((Path(str(candidate)) / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            vocab = saved.get("vocab_size", saved.get("text_config", {}).get("vocab_size"))
            if vocab == rows:
                return str(Path(str(candidate)).resolve())
        return None

    def save(self, path: str | Path, *, base_model_path: str | Path | None = None, tokenizer: bool = True) -> Path:
        """Write a folder ``load_policy(path)`` reads back: weights (or the LoRA adapter), the
        tokenizer with its chat template, and ``streamrl_policy.json``.

        ``tokenizer=False`` (a LoRA adapter only) leaves the tokenizer out: ``load_policy`` rebuilds
        the base from its recipe, tokenizer and chat template included, so a shipped adapter need
        not carry a copy (SmolLM2's is 3.5 MB).

        A LoRA adapter's ``adapter_config.json`` names its base (``base_model_name_or_path``):
        ``base_model_path`` when given, else ``base_model_folder()``, so PEFT alone can load it
        whenever the base exists as a folder (it stays null for a generated base such as ``tiny``;
        ``streamrl export --adapter`` writes that base next to the adapter)."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        if not tokenizer and not self.is_lora:
            raise ValueError("only a LoRA adapter can be saved without its tokenizer (its base recipe brings one)")
        self.model.save_pretrained(folder)
        if tokenizer:
            self.tokenizer.save_pretrained(folder)
        adapter_config = folder / "adapter_config.json"
        if self.is_lora and adapter_config.is_file():
            base_path = str(Path(base_model_path).resolve()) if base_model_path else self.base_model_folder()
            config = json.loads(adapter_config.read_text(encoding="utf-8"))
            config["base_model_name_or_path"] = base_path
            if isinstance(config.get("target_modules"), list):  # PEFT writes a set: its order varies per process
                config["target_modules"] = sorted(config["target_modules"])
            adapter_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        record = {
            "format": POLICY_FORMAT,
            "value_token_ids": list(self.value_token_ids) if self.value_token_ids else None,
            "lora": self.lora,
            "base_recipe": self.base_recipe if self.is_lora else None,
        }
        (folder / POLICY_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        readable_by_all(folder)
        return folder


def _block_index(parameter_name: str) -> int | None:
    """The transformer block a parameter belongs to (``...layers.12.self_attn...`` -> 12), else None."""
    match = re.search(r"\.layers\.(\d+)\.", parameter_name)
    return int(match.group(1)) if match else None


def readable_by_all(folder: Path) -> None:
    """Give the files of ``folder`` the mode the umask gives new files (transformers writes weights
    through a private temporary file, mode 0600, which other users and containers cannot read)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)
