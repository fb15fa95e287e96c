"""Refuse, before any work, a run whose memory cannot fit: the model's training state, the
learner batch and the prompt pool are estimated from the configuration alone (the model on the
``meta`` device: shapes, no storage) and compared with the memory available now.

Each estimate is an upper bound of what the run holds at once; an error is one line naming the
field that makes it too large.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streamrl.training.config import Config, ConfigError

GIB = 1 << 30
#: a generated or context token as the trainer holds it: in a trajectory's Python lists, and in
#: the collated learner tensors (ids, masks, turn index, behaviour log-probs)
BYTES_PER_TOKEN = 64
#: one task of the training pool: its id, the prompt source's weights and per-prompt memory
BYTES_PER_TASK = 512
#: the share of the memory budget the engine's kept KV may take (the rest: weights, learner, batches)
KV_SHARE = 0.25


def check_resources(config: Config, available: int | None = None) -> None:
    """Raise ``ConfigError`` naming the field when an estimate exceeds ``available`` bytes
    (default: the memory available now on the model's device, and in RAM)."""
    ram = available if available is not None else memory_budget(config)
    model_memory = available if available is not None else device_memory(config.model.device) or ram
    params = parameter_count(config)
    if params is not None:
        need = model_training_bytes(config, params)
        if need > model_memory:
            field = "model.overrides" if config.model.overrides or ":" in config.model.spec else "model.spec"
            raise ConfigError(
                f"{field}: the model has {params / 1e6:,.0f} M parameters and needs about {need / GIB:,.1f} GiB to train "
                f"(weights, gradients, AdamW moments, the engine's copy), but {model_memory / GIB:,.1f} GiB is available"
            )
    need = batch_bytes(config)
    if need > ram:
        raise ConfigError(
            f"train.batch_size: {config.train.batch_size} trajectories of up to {tokens_per_trajectory(config):,} tokens "
            f"may need {need / GIB:,.1f} GiB, but {ram / GIB:,.1f} GiB is available"
        )
    need = config.env.train_tasks * BYTES_PER_TASK
    if need > ram:
        raise ConfigError(
            f"env.train_tasks: a pool of {config.env.train_tasks:,} tasks needs about {need / GIB:,.1f} GiB, "
            f"but {ram / GIB:,.1f} GiB is available"
        )


# -- estimates -------------------------------------------------------------------------------------


def parameter_count(config: Config) -> int | None:
    """Parameters of the model ``config`` builds, counted on the meta device (None: unknown,
    e.g. a shipped spec whose size is fixed)."""
    model_config = _model_config(config)
    if model_config is None:
        return None
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    return sum(parameter.numel() for parameter in model.parameters())


def model_training_bytes(config: Config, params: int) -> int:
    if config.model.lora:  # a half-precision base stays so (load_policy's float32_weights)
        width, copies = (2 if config.model.dtype in ("bfloat16", "bf16", "float16", "fp16") else 4), 2
    else:  # trained weights, gradients and two AdamW moments in float32, plus the engine's copy
        width, copies = 4, 5
    if config.train.reference_model or config.algo.kl_coef > 0:
        copies += 1
    if config.algo.trains_critic:
        copies += 4  # the critic: weights, gradients, moments
    return params * width * copies


def tokens_per_trajectory(config: Config) -> int:
    rollout = config.rollout
    if rollout.layout == "full_history":
        return rollout.max_context_tokens
    return rollout.max_context_tokens * (rollout.max_turns or _env_max_steps(config.env.name))


def engine_prefix_tokens(config: Config) -> int:
    """Tokens whose KV the engine keeps for the prompts that extend them: one full context for each
    episode played at once (its next turn's prompt extends it), and no more (the engine's fixed
    default held 65,536, 3 GB of SmolLM2's KV in float32, whatever the run played); within
    ``KV_SHARE`` of the memory budget when the model's KV size is known."""
    concurrency = max(config.rollout.concurrency, config.eval.concurrency or 0)
    tokens = concurrency * config.rollout.max_context_tokens
    per_token = kv_bytes_per_token(config)
    if per_token:
        tokens = min(tokens, int(KV_SHARE * memory_budget(config) / per_token))
    return max(tokens, config.rollout.max_context_tokens)  # one context at least, or nothing is reused


def kv_bytes_per_token(config: Config) -> int | None:
    """Bytes of keys and values one token holds in the engine (float32; None: the model is unknown).
    The architecture is the spec's (``init_from`` brings weights, or an adapter, for the same one)."""
    spec_only = config.model_copy(update={"model": config.model.model_copy(update={"init_from": None})})
    model = _model_config(spec_only)
    if model is None:
        return None
    heads = model.num_attention_heads
    head_dim = getattr(model, "head_dim", None) or model.hidden_size // heads
    return 2 * model.num_hidden_layers * (getattr(model, "num_key_value_heads", None) or heads) * head_dim * 4


def memory_line(config: Config, tokens: int) -> str:
    """One line for a run's start: the budget, and the engine's kept KV within it (``tokens``:
    ``engine_prefix_tokens``, the number the engine is given)."""
    budget = memory_budget(config)
    source = f"model.memory_gb={config.model.memory_gb:g}" if config.model.memory_gb is not None else "the RAM available"
    per_token = kv_bytes_per_token(config)
    kept = f" ({tokens * per_token / GIB:.2f} GiB)" if per_token else ""
    return f"memory: budget {budget / GIB:.1f} GiB ({source}); the engine keeps the KV of up to {tokens:,} tokens{kept}"


def memory_budget(config: Config) -> int:
    """The run's memory in bytes: ``model.memory_gb``, else the RAM available now. A budget above
    what is available is refused (``ConfigError`` naming the field)."""
    available = available_ram()
    if config.model.memory_gb is None:
        return available
    budget = int(config.model.memory_gb * GIB)
    if budget > available:
        raise ConfigError(f"model.memory_gb: {config.model.memory_gb:g} GiB asked, but {available / GIB:,.1f} GiB is available")
    return budget


def batch_bytes(config: Config) -> int:
    return config.train.batch_size * tokens_per_trajectory(config) * BYTES_PER_TOKEN


# -- the machine -------------------------------------------------------------------------------------


def available_ram() -> int:
    """``MemAvailable`` (Linux), else the free physical pages."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_memory(device: str) -> int | None:
    """Free memory of an accelerator device (None: the model lives in RAM)."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


# -- helpers -------------------------------------------------------------------------------------


def _model_config(config: Config) -> Any:
    from transformers import AutoConfig

    model = config.model
    spec = model.init_from or model.spec
    name, _, inline = spec.partition(":")
    if model.init_from is None and name == "tiny":
        from transformers import LlamaConfig

        from streamrl.policy import tiny

        overrides = {**tiny.parse_overrides(inline), **model.overrides}
        return LlamaConfig(**tiny.tiny_config_dict(overrides, tiny.load_tiny_tokenizer()))
    folder = Path(spec).expanduser()
    if model.init_from is None and spec == "smollm2-135m":
        from streamrl.policy import smollm2

        folder = smollm2.converted_if_ready() or folder  # not converted yet: unknown until it is
    if not (folder / "config.json").is_file():
        return None
    try:
        json.loads((folder / "config.json").read_text())
        loaded = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError):
        return None  # loading reports it properly
    for key, value in (model.overrides if model.init_from is None else {}).items():
        setattr(loaded, key, value)
    return loaded


def _env_max_steps(name: str) -> int:
    from streamrl.envs import get_entry

    try:
        spec = getattr(get_entry(name).env, "spec", None)
    except Exception:  # noqa: BLE001 - an unknown environment is reported elsewhere
        return 1
    return int(getattr(spec, "max_steps", None) or 1)
