"""A run's folder and what survives a kill: checkpoints, metrics, events, models.

Layout of ``out_dir``::

    config.yaml          the validated configuration
    metrics.jsonl        kind=sft|train|eval records (truncated to the checkpoint on resume)
    events.jsonl         rollout dispatch/result/publish events (likewise)
    samples.jsonl        transcripts of training and evaluation episodes (likewise)
    checkpoints/step_*   policy/, learner.pt (optimiser, critic, RNG), state.json (step, version,
                         trackers, rollout buffer and in-flight requests, log offsets), manifest.json
    sft_model/ reference_model/ final_model/    load_policy()-ready folders
    report/              learning curve, evaluation tables, summary
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from streamrl.policy.loading import load_policy
from streamrl.rollout import Trajectory
from streamrl.train.checkpoint import latest_valid, save_checkpoint
from streamrl.train.config import Config, config_to_yaml
from streamrl.train.loggers import MetricsLogger
from streamrl.train.samples import SampleLog


@dataclass
class RunState:
    step: int = 0
    version: int = 0
    trajectories: int = 0

    @classmethod
    def initial(cls) -> RunState:
        return cls()

    def advance(self, batch: list[Trajectory]) -> None:
        self.step += 1
        self.version += 1
        self.trajectories += len(batch)

    def metrics(self) -> dict[str, float]:
        return {"policy_version": float(self.version), "trajectories_consumed": float(self.trajectories)}


def load_run_policy(config: Config, state: dict[str, Any] | None) -> Any:
    model = config.model
    if state is not None:
        return load_policy(Path(state["path"]) / "policy", dtype=model.dtype, device=model.device, threads=model.threads)
    return load_policy(
        model.init_from or model.spec,
        dtype=model.dtype,
        device=model.device,
        threads=model.threads,
        lora=model.lora.model_dump() if model.lora else None,
        seed=config.train.seed,
        model_overrides=model.overrides or None,
    )


class Workspace:
    def __init__(self, root: Path, config: Config, echo: Callable[[str], None] = print):
        self.root = root
        self.config = config
        self.echo = echo
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.yaml").write_text(config_to_yaml(config))
        self.checkpoints = root / "checkpoints"
        self.metrics_path = root / "metrics.jsonl"
        self.events = root / "events.jsonl"
        self.samples = root / "samples.jsonl"

    # -- resume -----------------------------------------------------------------------------------

    def restore(self) -> dict[str, Any] | None:
        checkpoint = latest_valid(self.checkpoints, warn=self.echo)
        if checkpoint is None:
            self.echo(f"resume: no usable checkpoint under {self.checkpoints}; starting from scratch")
            return None
        state = checkpoint.state()
        state["path"] = str(checkpoint.path)
        self.echo(f"resume: continuing from {checkpoint.path.name} (step {state['run']['step']})")
        return state

    def logger(self, state: dict[str, Any] | None) -> MetricsLogger:
        logging = self.config.logging
        return MetricsLogger(
            self.metrics_path,
            tensorboard=logging.tensorboard,
            wandb_project=logging.wandb_project,
            mlflow_experiment=logging.mlflow_experiment,
            run_config=self.config.model_dump(mode="json"),
            resume_offset=state["metrics_offset"] if state else 0,
        )

    def events_path(self, state: dict[str, Any] | None) -> Path:
        """The event log, cut back to what the checkpoint had seen (everything after is redone)."""
        return _cut_back(self.events, state["events_offset"] if state else 0)

    def sample_log(self, state: dict[str, Any] | None) -> SampleLog:
        """Transcripts, likewise cut back (checkpoints from before transcripts existed keep them all)."""
        return SampleLog(_cut_back(self.samples, state.get("samples_offset") if state else 0))

    def reference(self, config: Config, policy: Any, state: dict[str, Any] | None) -> Any:
        """A frozen copy of the policy as RL starts (kept on disk so a resume uses the same one)."""
        if not (config.train.reference_model or config.algo.kl_coef > 0):
            return None
        folder = self.root / "reference_model"
        if state is None:
            policy.save(folder)
            return SimpleNamespace(model=policy.inference_model())
        return SimpleNamespace(model=load_policy(folder, dtype=config.model.dtype, device=config.model.device).inference_model())

    def load_learner(self, state: dict[str, Any], learner: Any) -> RunState:
        learner.load_state_dict(state["learner"])
        tensors = torch.load(Path(state["path"]) / "learner.pt", weights_only=False)
        learner.load_tensor_state(tensors["learner"])
        torch.set_rng_state(tensors["torch_rng"])
        random.setstate(tensors["python_rng"])
        return RunState(**state["run"])

    # -- save -------------------------------------------------------------------------------------

    def save(self, run: RunState, policy: Any, learner: Any, rollout: Any, logger: MetricsLogger) -> None:
        """Checkpoint everything at one instant (no await between the reads below)."""
        state = {
            "run": {"step": run.step, "version": run.version, "trajectories": run.trajectories},
            "learner": learner.state_dict(),
            "rollout": rollout.state_dict(),
            "metrics_offset": logger.offset(),
            "events_offset": self.events.stat().st_size if self.events.exists() else 0,
            "samples_offset": self.samples.stat().st_size if self.samples.exists() else 0,
        }
        tensors = {"learner": learner.tensor_state(), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}

        def write(folder: Path) -> None:
            policy.save(folder / "policy")
            torch.save(tensors, folder / "learner.pt")

        save_checkpoint(self.checkpoints, run.step, state, write, keep=self.config.train.keep_checkpoints)

    def write_summary(self, summary: dict[str, Any]) -> None:
        path = self.root / "summary.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, path)


def _cut_back(path: Path, offset: int | None) -> Path:
    """Truncate ``path`` to ``offset`` bytes (``None``: leave it whole)."""
    if offset is not None and path.exists():
        with path.open("r+b") as handle:
            handle.truncate(offset)
    return path
