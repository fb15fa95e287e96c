"""Loading the configuration: YAML file(s), ``base:`` chains and dotted command-line overrides
(``train.steps=20 algo.dual_clip=3``) into a validated ``Config`` (the sections are in
``training/config.py``), and the environment and model switches of ``--env`` / ``--model``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from streamrl.training.algo_config import ALGORITHM_TABLE, algo_fields
from streamrl.training.config import SHIPPED_CONFIGS, Config, ConfigError, EnvConfig, ModelConfig, SFTConfig


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.c=value"`` -> (["a", "b", "c"], parsed YAML value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    key, raw = text.split("=", 1)
    path = [part for part in key.strip().split(".") if part]
    if not path:
        raise ConfigError(f"override {text!r} has an empty field name")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from exc
    return path, value


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``algo.dual_clip: must be > 1 (got 0.5)``."""
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field"
        got = err.get("input")
        shown = "" if err["type"] in ("extra_forbidden", "missing") or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{'.'.join(loc) or 'config'}: {message}{shown}")
    return "; ".join(lines)


def load_config(
    paths: Sequence[str | Path] | str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    algo: str | None = None,
    note: Callable[[str], None] | None = None,
) -> Config:
    """Merge YAML files (later wins), then ``overrides``, then ``algo``; validate everything.
    ``note`` hears what switching environment changed (default: one line each on stderr)."""
    tree: dict[str, Any] = {}
    if isinstance(paths, (str, Path)):
        paths = [paths]
    for path in paths or []:
        _deep_merge(tree, _read_config_file(path))
    parsed = [parse_override(text) for text in overrides or []]
    overridden = {tuple(path) for path, _ in parsed}
    switched_to = next((value for path, value in reversed(parsed) if path == ["env", "name"]), None)
    if switched_to is not None:
        switch_environment(tree, str(switched_to), overridden, note or _note)
    model_spec = next((value for path, value in reversed(parsed) if path == ["model", "spec"]), None)
    if model_spec is not None:
        switch_model(tree, str(model_spec), overridden, note or _note)
    for path_parts, value in parsed:
        _set_path(tree, path_parts, value)
    _tell_environment_its_form(tree)
    if algo is not None:
        if algo not in ALGORITHM_TABLE:
            raise ConfigError(f"--algo: unknown algorithm {algo!r} (allowed: {', '.join(ALGORITHM_TABLE)})")
        section = tree.setdefault("algo", {})
        if not isinstance(section, dict):
            raise ConfigError("algo must be a section")
        if section.get("name") not in (None, algo):
            # switching algorithm: keep only the fields the new algorithm also has
            allowed = algo_fields(algo)
            tree["algo"] = {k: v for k, v in section.items() if k in allowed}
        tree["algo"]["name"] = algo
    if isinstance(tree.get("algo"), dict):
        tree["algo"].setdefault("name", "spo++")
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


#: sft.source -> the environment method that demonstrates
DEMONSTRATORS = {"expert": "expert_action", "search_expert": "searching_expert"}


def switch_environment(
    tree: dict[str, Any], name: str, overridden: set[tuple[str, ...]], note: Callable[[str], None]
) -> None:
    """An override that names another environment than the config files' makes their environment
    sections that environment's defaults (the overrides themselves still apply): its options,
    parser and prompt options are dropped; a warm start built for another environment is not
    loaded; SFT is skipped when ``name`` has no demonstrator of ``sft.source``. Each change is said
    in one line on stderr."""
    from streamrl.envs import UnknownEnvironmentError, get_entry

    env: dict[str, Any] = tree["env"] if isinstance(tree.get("env"), dict) else {}
    previous = env.get("name", EnvConfig().name)
    if previous == name:
        return
    for field in ("options", "parser", "prompt"):
        env.pop(field, None)
    model: dict[str, Any] = tree["model"] if isinstance(tree.get("model"), dict) else {}
    init_from = str(model.get("init_from") or "")
    if init_from.startswith("warm-start:") and ("model", "init_from") not in overridden:
        model["init_from"] = None
        note(f"env.name={name}: not starting from {init_from} (a warm start for {previous})")
    sft: dict[str, Any] = tree["sft"] if isinstance(tree.get("sft"), dict) else {}
    demonstrator = DEMONSTRATORS.get(sft.get("source", SFTConfig().source))
    try:
        factory = get_entry(name).env
    except UnknownEnvironmentError:
        return  # preflight names the unknown environment
    if sft.get("demos", SFTConfig().demos) and demonstrator and not hasattr(factory, demonstrator):
        if ("sft", "source") in overridden:  # an explicit choice is checked (preflight), not replaced
            return
        other = next((source for source, method in DEMONSTRATORS.items() if hasattr(factory, method)), None)
        if other is not None:
            tree.setdefault("sft", {})["source"] = other
            note(f"env.name={name}: SFT from sft.source={other} ({name} has no {demonstrator}())")
        elif ("sft", "demos") not in overridden:
            tree.setdefault("sft", {})["demos"] = 0
            note(f"env.name={name}: no SFT warm start ({name} has no {demonstrator}() for sft.source)")


def switch_model(tree: dict[str, Any], spec: str, overridden: set[tuple[str, ...]], note: Callable[[str], None]) -> None:
    """An override that names another model than the config files' replaces their whole model
    choice: the warm start they load (``model.init_from``, which would win over ``model.spec``) and the
    architecture ``overrides`` made for their model are dropped, unless the overrides set them too.
    Each change is said in one line on stderr."""
    model: dict[str, Any] = tree["model"] if isinstance(tree.get("model"), dict) else {}
    if model.get("spec", ModelConfig().spec) == spec:
        return
    if model.get("init_from") and ("model", "init_from") not in overridden:
        note(f"model.spec={spec}: not starting from {model['init_from']} (the config's warm start for {model.get('spec', ModelConfig().spec)})")
        model["init_from"] = None
    if model.get("overrides") and ("model", "overrides") not in overridden:
        note(f"model.spec={spec}: the config's architecture overrides {model['overrides']} are not applied to it")
        model["overrides"] = {}


def _tell_environment_its_form(tree: dict[str, Any]) -> None:
    """``env.tools: true`` reaches an environment whose constructor takes ``tools`` (its instructions
    and hints then speak of tool calls) as ``env.options.tools``, unless the options set it."""
    from streamrl.envs import UnknownEnvironmentError, get_entry
    from streamrl.rollout.roles import takes_tools_option

    env = tree.get("env")
    if not isinstance(env, dict) or env.get("tools") is not True:
        return
    options = env.setdefault("options", {})
    if not isinstance(options, dict) or "tools" in options:
        return
    try:
        factory = get_entry(str(env.get("name", EnvConfig().name))).env
    except (UnknownEnvironmentError, ValueError, ImportError):
        return  # preflight names the unknown environment
    if takes_tools_option(factory):
        options["tools"] = True


def _note(message: str) -> None:
    import sys

    print(f"streamrl: note: {message}", file=sys.stderr)


def _read_config_file(path: str | Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's sections, on top of those of the files its ``base:`` names (a shipped config
    name, or a path relative to the file), applied first and in order."""
    resolved = resolve_config(path)
    if resolved.resolve() in chain:
        raise ConfigError(f"config file {path}: base: loops back to itself ({' -> '.join(p.name for p in chain)})")
    loaded = read_yaml(resolved, "config file")
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections")
    bases = loaded.pop("base", None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"config file {path}: base: must name a config file or a list of them")
    tree: dict[str, Any] = {}
    for base in bases:
        local = resolved.parent / base
        _deep_merge(tree, _read_config_file(local if local.is_file() else base, (*chain, resolved.resolve())))
    _deep_merge(tree, loaded)
    return tree


def resolve_config(path: str | Path) -> Path:
    """``path`` when it exists; else a config shipped in the package: by name (``default``,
    ``compare/math_spopp_vs_spo``) or by its path in the repository (``configs/default.yaml``)."""
    path = Path(path)
    if path.exists():
        return path
    relative = path.relative_to("configs") if path.parts[:1] == ("configs",) else path
    shipped = SHIPPED_CONFIGS / (relative if relative.suffix == ".yaml" else relative.with_suffix(".yaml"))
    return shipped if not path.is_absolute() and shipped.is_file() else path


def shipped_configs() -> list[str]:
    """The names of the shipped run configurations (``--config NAME``)."""
    return sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.yaml"))


#: a configuration file's size and its node count with aliases expanded (a shipped one: ~300 nodes)
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_NODES = 100_000


def expanded_nodes(value: Any, limit: int) -> int:
    """How many nodes ``value`` has once YAML's aliases (shared objects) are expanded, counting
    each shared object once per reference without expanding it again; raises ``ValueError`` past
    ``limit`` or on a recursive alias."""
    sizes: dict[int, int] = {}

    def size(item: Any, open_ids: frozenset[int]) -> int:
        if not isinstance(item, (dict, list)):
            return 1
        key = id(item)
        if key in open_ids:
            raise ValueError("a recursive alias")
        if key not in sizes:
            children = list(item.keys()) + list(item.values()) if isinstance(item, dict) else item
            total = 1
            for child in children:
                total += size(child, open_ids | {key})
                if total > limit:
                    raise ValueError(f"more than {limit:,} nodes once its aliases are expanded")
            sizes[key] = total
        return sizes[key]

    return size(value, frozenset())


def read_yaml(path: Path, what: str) -> Any:
    """The YAML document in ``path``; a ``ConfigError`` naming the file (and line) otherwise. Files
    over ``MAX_CONFIG_BYTES`` and documents whose aliases expand past ``MAX_CONFIG_NODES`` are refused."""
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {path} is {path.stat().st_size:,} bytes; a configuration is at most {MAX_CONFIG_BYTES:,}")
    try:
        with path.open(encoding="utf-8") as handle:
            document = yaml.safe_load(handle) or {}
        expanded_nodes(document, MAX_CONFIG_NODES)
        return document
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not a text (YAML) file") from None
    except ValueError as error:  # expanded_nodes: too many nodes, a recursive alias
        raise ConfigError(f"{what} {path}: {error}") from None
    except OSError as error:
        raise ConfigError(f"{what} {path}: cannot be read ({error.strerror or error})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or exc
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(problem).split())}") from None


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value


def config_to_yaml(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
