"""Preflight: what validation of the configuration alone cannot see, checked before any work.

Each problem is a ``ConfigError`` of one line naming its field: the environment and its options,
the parser and prompt-builder options, the splits, the demonstration source, the model, the
device and the optional logging packages. Nothing is loaded but the environment (built once).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

from streamrl.envs.base import Env
from streamrl.training.config import Config, ConfigError
from streamrl.training.environment import split_task_ids

#: logging field -> (package it needs, extra that installs it)
LOGGING_PACKAGES = {"wandb_project": ("wandb", "wandb"), "mlflow_experiment": ("mlflow", "mlflow")}


def one_line(error: BaseException | str) -> str:
    return " ".join(str(error).split())


def preflight(config: Config, *, demonstrations: bool = False, warn: Callable[[str], None] = print) -> None:
    """Refuse ``config`` (``ConfigError``) on the first problem; ``demonstrations``: SFT will run."""
    from streamrl.envs.base import EnvSpec
    from streamrl.envs.registry import EnvOptionError, build

    check_model(config)
    if config.agent.function or config.agent.external:
        _check_agent(config)
        _check_logging(config, warn)
        return
    entry = _entry(config.env.name)
    try:
        build("env.parser", entry.parser, config.env.parser)
        build("env.prompt", entry.prompt_builder, config.env.prompt)
        env = build("env.options", entry.env, config.env.options)
    except EnvOptionError as error:
        raise ConfigError(str(error)) from None
    try:
        if not isinstance(getattr(env, "spec", None), EnvSpec):
            raise ConfigError(f"env.name: {config.env.name} has no spec (an EnvSpec: name, splits, max_steps); "
                              "see docs/environments.md")
        _check_splits(config, env)
        _check_action_form(config, env)
        if demonstrations:
            check_demonstrations(config, env)
    finally:
        env.close()
    _check_logging(config, warn)
    _check_reward(config, warn)


def _check_agent(config: Config) -> None:
    """The agent function imports and is async; the tasks file reads (one line each otherwise)."""
    try:
        from streamrl.agents import AgentLoadError, load_agent, read_tasks
    except ImportError as error:
        raise ConfigError(f"agent.function: the endpoint needs fastapi, uvicorn and openai ({error}); "
                          "pip install 'streamrl[agents]'") from None
    try:
        if config.agent.function:
            load_agent(config.agent.function)
        read_tasks(str(config.agent.tasks))
    except AgentLoadError as error:
        raise ConfigError(str(error)) from None
    if config.agent.external and config.rollout.backend != "local":
        raise ConfigError(f"rollout.backend: agents elsewhere claim tasks from the trainer's endpoint (local), "
                          f"not from {config.rollout.backend} workers")
    if config.agent.external and bool(getattr(config.algo, "offline_samples", 0)):
        raise ConfigError("algo.offline_samples: an offline prior plays episodes itself, which needs agent.function")
    if config.agent.host not in ("127.0.0.1", "localhost", "::1") and not os.environ.get("STREAMRL_ENDPOINT_TOKEN"):
        raise ConfigError(f"agent.host: serving on {config.agent.host} needs a bearer token (--token or "
                          "$STREAMRL_ENDPOINT_TOKEN); without one, bind 127.0.0.1")
    low, high = config.agent.reward_range
    if not low < high:
        raise ConfigError(f"agent.reward_range: must be (low, high) with low < high, got {config.agent.reward_range}")


def _entry(name: str) -> Any:
    from streamrl.envs import UnknownEnvironmentError, get_entry

    try:
        return get_entry(name)
    except UnknownEnvironmentError as error:
        raise ConfigError(f"env.name: {one_line(error)}") from None


def _check_splits(config: Config, env: Any) -> None:
    for field, split, limit, start in (("env.train_tasks", "train", config.env.train_tasks, 0),
                                       ("env.eval_split", config.env.eval_split or env.spec.eval_split, config.env.eval_tasks,
                                        config.env.eval_from)):
        try:
            split_task_ids(env, split, limit, start)
        except ValueError as error:
            raise ConfigError(f"{field}: {one_line(error)}") from None


def _check_action_form(config: Config, env: Any) -> None:
    """The tool form needs tools whose schemas build, and a known tool format; the text form an ``act``."""
    from streamrl.envs.tools import ToolSchemaError
    from streamrl.policy.tool_format import FORMATS

    name = config.env.name
    if config.model.tool_format not in ("auto", *FORMATS):
        raise ConfigError(f"model.tool_format: unknown format {config.model.tool_format!r} (known: auto, {', '.join(FORMATS)})")
    if not config.env.tools:
        if isinstance(env, Env) and type(env).act is Env.act and type(env).step is Env.step:
            raise ConfigError(f"env.tools: environment {name} has no text form (no act()); set env.tools=true")
        return
    try:
        tools = env.tools() if hasattr(env, "tools") else []
    except ToolSchemaError as error:
        raise ConfigError(f"env.tools: {one_line(error)}") from None
    if not tools:
        raise ConfigError(f"env.tools: environment {name} declares no tools (decorate methods with @streamrl.envs.tool)")


def check_demonstrations(config: Config, env: Any) -> None:
    """The demonstrator ``sft.source`` names exists for this environment (a file: every line reads)."""
    from streamrl.training.sft import load_replays

    source, name = config.sft.source, config.env.name
    if source == "expert" and not hasattr(env, "expert_action"):
        raise ConfigError(f"sft.source: environment {name} has no expert (expert_action()); use a JSONL file of "
                          "demonstrations or sft.demos=0")
    if source == "search_expert" and not hasattr(env, "searching_expert"):
        raise ConfigError(f"sft.source: environment {name} has no searching expert (searching_expert()); use expert, "
                          "a JSONL file of demonstrations or sft.demos=0")
    if source not in ("expert", "search_expert"):
        try:
            load_replays(Path(source))
        except (OSError, ValueError) as error:
            raise ConfigError(f"sft.source: {one_line(error)}") from None
    if config.sft.demos == 0:
        raise ConfigError("sft.demos: is 0, so SFT has nothing to imitate")


def check_model(config: Config) -> None:
    """Every model spec names a known model or an existing folder, and the device exists."""
    from streamrl.policy.errors import PolicyLoadError
    from streamrl.policy.loading import KNOWN_SPECS, WARM_START_PREFIX, read_chat_template, warm_start_folder

    cores = os.cpu_count() or 1
    for field, threads in (("model.threads", config.model.threads), ("rollout.engine_threads", config.rollout.engine_threads)):
        if threads is not None and threads > cores:  # OpenMP with far more threads than cores crawls
            raise ConfigError(f"{field}: {threads} is more than the {cores} cores here (at most {cores})")
    for field, spec in (("model.spec", config.model.spec), ("model.init_from", config.model.init_from)):
        if spec is None or (field == "model.spec" and (spec.split(":", 1)[0] == "tiny" or spec in KNOWN_SPECS)):
            continue
        if spec.startswith(WARM_START_PREFIX):
            try:
                warm_start_folder(spec)
            except PolicyLoadError as error:
                raise ConfigError(f"{field}: {error}") from None
        elif not Path(spec).expanduser().is_dir():
            known = ", ".join(KNOWN_SPECS)
            raise ConfigError(f"{field}: no model folder at {spec!r} (known specs: {known}, or a Hugging Face model folder)")
    if config.model.chat_template is not None:
        try:
            read_chat_template(config.model.chat_template)
        except PolicyLoadError as error:
            raise ConfigError(f"model.chat_template: {error}") from None
    if config.model.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"model.device: {config.model.device!r} but CUDA is not available (use cpu)")


def _check_logging(config: Config, warn: Callable[[str], None]) -> None:
    logging = config.logging
    for field, (package, extra) in LOGGING_PACKAGES.items():
        if getattr(logging, field) and importlib.util.find_spec(package) is None:
            raise ConfigError(f"logging.{field}: {package} is not installed (pip install 'streamrl[{extra}]')")
    if logging.tensorboard is True and importlib.util.find_spec("tensorboard") is None:
        warn("logging.tensorboard: tensorboard is not installed, so metrics go to metrics.jsonl only "
             "(pip install 'streamrl[tensorboard]', or logging.tensorboard=false)")


def _check_reward(config: Config, warn: Callable[[str], None]) -> None:
    """Shaping must not make a malformed action the cheapest failure: if it does, RL can learn to
    emit malformed actions, and once success is rare that is a stable optimum (measured: a default
    run went from 34% to 0% success, 100% format-invalid turns, between steps 45 and 59)."""
    reward = config.reward
    if reward.ineffective_penalty > reward.invalid_format_penalty:
        warn(f"reward.invalid_format_penalty ({reward.invalid_format_penalty:g}) is below reward.ineffective_penalty "
             f"({reward.ineffective_penalty:g}): a malformed action costs less than one the environment cannot carry "
             "out, and RL can learn to emit malformed actions (set invalid_format_penalty >= ineffective_penalty)")
