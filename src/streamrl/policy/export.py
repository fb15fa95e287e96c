"""Export a ``Policy`` as a standard Hugging Face folder that needs nothing from streamrl.

* merged (the default): full weights through ``save_pretrained`` (a LoRA adapter merged in with
  peft's ``merge_and_unload``) plus the tokenizer with its chat template. The vocabulary is kept as
  it is, SAPO's value-token rows included, so ``config.json``, the weights and the tokenizer agree
  and ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it alone.
* adapter: the LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``) with a
  ``base_model_name_or_path`` PEFT can load: the base model's folder when it exists on disk with
  the same vocabulary, otherwise (a generated base such as ``tiny``) the base written to
  ``DIR/base_model``. That path is absolute: after moving the folder, edit it or export merged.

Both also write ``streamrl_policy.json``, so ``load_policy(DIR)`` reads the export back with the
same value tokens.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from streamrl.policy.errors import PolicyLoadError
from streamrl.policy.lora import own_storage, quiet_peft
from streamrl.policy.policy import POLICY_FILE, POLICY_FORMAT, Policy, readable_by_all

BASE_FOLDER = "base_model"


def export_policy(policy: Policy, out: str | Path, *, adapter: bool = False) -> Path:
    """Write ``policy`` to ``out`` (see the module docstring); returns ``out``."""
    folder = Path(out)
    if adapter:
        if not policy.is_lora:
            raise PolicyLoadError("--adapter: this policy has no LoRA adapter (export it without --adapter)")
        base_path = policy.base_model_folder()
        if base_path is None:
            base_path = str(_write_base(policy, folder / BASE_FOLDER).resolve())
        with quiet_peft():
            return policy.save(folder, base_model_path=base_path)
    with quiet_peft():
        model = policy.inference_model()  # a plain copy: LoRA merged (merge_and_unload), frozen
    return _write_folder(model, policy, folder)


def _write_base(policy: Policy, folder: Path) -> Path:
    """The base model under a LoRA policy (adapters removed, not merged) as a plain HF folder."""
    with quiet_peft():
        base: Any = own_storage(copy.deepcopy(policy.model)).unload()
    return _write_folder(base, policy, folder)


def _write_folder(model: Any, policy: Policy, folder: Path) -> Path:
    """``model`` with ``policy``'s tokenizer and record, as a folder anyone may read."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    _write_record(folder, policy)
    readable_by_all(folder)
    return folder


def _write_record(folder: Path, policy: Policy) -> None:
    record = {
        "format": POLICY_FORMAT,
        "value_token_ids": list(policy.value_token_ids) if policy.value_token_ids else None,
        "lora": None,
        "base_recipe": None,
    }
    (folder / POLICY_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
