"""Synchronous entry points: ``streamrl.train(...)`` and ``streamrl.evaluate(...)``.

``config`` is a ``Config``, a shipped config name (``"smoke"``), a YAML path, or a list of them;
``overrides`` (dotted ``section.field=value`` strings) and ``algo`` apply to names and paths (a
``Config`` is used as it is). Both preflight the configuration first
(``ConfigError``, one line naming the field) and run the same code as the command line.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Sequence

from streamrl.train.config import Config, load_config
from streamrl.train.preflight import preflight

ConfigLike = Config | str | Path | Sequence[str | Path]


def as_config(config: ConfigLike, overrides: Sequence[str] = (), algo: str | None = None) -> Config:
    if isinstance(config, Config):
        return config
    return load_config(config, list(overrides), algo=algo)


def warn(message: str) -> None:
    print(f"streamrl: warning: {message}", file=sys.stderr)


def train(config: ConfigLike = "default", out: str | Path | None = None, *, overrides: Sequence[str] = (),
          algo: str | None = None, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train (SFT warm start, RL, evaluation, report) into ``out``; returns the run summary."""
    from streamrl.train.loop import train as train_loop

    config = as_config(config, overrides, algo)
    preflight(config, demonstrations=config.sft.demos > 0 and config.model.init_from is None, warn=warn)
    out = Path(out) if out else Path("runs") / f"{config.algo.name}-{config.env.name}"
    return asyncio.run(train_loop(config, out, resume=resume, overwrite=overwrite))


def evaluate(config: ConfigLike = "default", model: str | Path | None = None, *,
             overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate ``model`` (default: ``model.init_from`` or ``model.spec``) on the configured split."""
    from streamrl.policy.engine import HFEngine
    from streamrl.policy.loading import load_policy
    from streamrl.train.evaluate import evaluate as evaluate_policy
    from streamrl.train.run import policy_source

    config = as_config(config, overrides)
    preflight(config, warn=warn)
    source = {"spec": model, "chat_template": config.model.chat_template} if model else policy_source(config)
    policy = load_policy(**source, dtype=config.model.dtype, device=config.model.device, threads=config.model.threads)

    async def run() -> Any:
        engine = HFEngine.from_policy(policy, seed=config.train.seed)
        try:
            return await evaluate_policy(config, engine, policy)
        finally:
            await engine.close()

    return asyncio.run(run()).metrics()
