"""Synchronous entry points: ``streamrl.train(...)`` and ``streamrl.evaluate(...)``.

``config`` is a ``Config``, a shipped config name (``"smoke"``), a YAML path, or a list of them;
``overrides`` (dotted ``section.field=value`` strings) and ``algo`` apply to names and paths (a
``Config`` is used as it is). Both preflight the configuration first
(``ConfigError``, one line naming the field) and run the same code as the command line.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from streamrl.training.config import Config
from streamrl.training.config_files import load_config
from streamrl.training.preflight import preflight

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
    from streamrl.training.loop import train as train_loop

    config = as_config(config, overrides, algo)
    preflight(config, demonstrations=config.sft.demos > 0 and config.model.init_from is None, warn=warn)
    out = Path(out) if out else Path("runs") / f"{config.algo.name}-{config.task_label()}"
    return asyncio.run(train_loop(config, out, resume=resume, overwrite=overwrite))


def evaluate(config: ConfigLike = "default", model: str | Path | None = None, *,
             overrides: Sequence[str] = (), out: str | Path | None = None) -> dict[str, Any]:
    """Evaluate ``model`` (default: ``model.init_from`` or ``model.spec``) on the configured split;
    the metrics name the model (``model``). With ``out``, the transcripts go to ``out/samples.jsonl``
    and the readable ones to ``out/samples.md``."""
    from streamrl.policy.engines import make_engine
    from streamrl.policy.loading import load_policy
    from streamrl.training.evaluate import evaluate as evaluate_policy
    from streamrl.training.report import samples_markdown
    from streamrl.training.resources import engine_prefix_tokens
    from streamrl.training.run import policy_source
    from streamrl.training.samples import SampleLog, read_samples

    config = as_config(config, overrides)
    preflight(config, warn=warn)
    source = ({"spec": model, "chat_template": config.model.chat_template, "tool_format": config.model.tool_format}
              if model else policy_source(config))
    policy = load_policy(**source, dtype=config.model.dtype, device=config.model.device, threads=config.model.threads)

    async def run() -> Any:
        # the engine the run trained with, on every core (nothing else runs)
        engine = make_engine(config.model.engine, policy, seed=config.train.seed, rollout_dtype=config.model.rollout_dtype,
                             threads=config.model.threads or os.cpu_count() or 1,
                             prefix_cache_tokens=engine_prefix_tokens(config))
        try:
            return await evaluate_policy(config, engine, policy, progress=lambda line: print(line, file=sys.stderr, flush=True))
        finally:
            await engine.close()

    result = asyncio.run(run())
    if result.crash_note():
        warn(result.crash_note())
    metrics = {"model": str(model or source["spec"]), **result.metrics()}
    if out is not None:
        folder = Path(out).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "samples.jsonl").unlink(missing_ok=True)  # this evaluation's transcripts only
        log = SampleLog(folder / "samples.jsonl")
        log.write(result.trajectories, kind="eval", step=0, tag=f"eval {metrics['model']}")
        log.close()
        (folder / "samples.md").write_text(samples_markdown(read_samples(folder / "samples.jsonl")))
    return metrics
