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

A folder holds one run: a non-empty one is refused unless the run is resumed (``resume``) or
replaced (``overwrite``, which removes only what a run writes). A resume checks everything before
writing anything: the configuration matches the saved one but for ``RESUMABLE`` fields, the newest
intact checkpoint's log offsets lie within the logs, and a finished run is reported, not redone.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from streamrl.policy.loading import load_policy
from streamrl.rollout import Trajectory
from streamrl.training.checkpoint import Checkpoint, latest_valid, list_checkpoints, save_checkpoint
from streamrl.training.config import Config, ConfigError
from streamrl.training.config_files import config_to_yaml, load_config
from streamrl.training.environment import Environment
from streamrl.training.errors import RunFolderError, TrainingError
from streamrl.training.loggers import MetricsLogger
from streamrl.training.samples import SampleLog


@dataclass
class RunState:
    #: learner steps done: the run's one step count
    step: int = 0
    trajectories: int = 0
    #: seconds of RL (evaluations excluded) up to the end of step ``step``, across resumes
    rl_s: float = 0.0

    @classmethod
    def initial(cls) -> RunState:
        return cls()

    @property
    def version(self) -> int:
        """The policy version the learner last published: each step publishes one."""
        return self.step

    def advance(self, batch: list[Trajectory], rl_s: float) -> None:
        self.step += 1
        self.trajectories += len(batch)
        self.rl_s = rl_s

    def metrics(self) -> dict[str, float]:
        # the process's peak resident memory so far (Linux counts KiB): what the run needs, as measured
        peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
        return {"policy_version": float(self.version), "trajectories_consumed": float(self.trajectories),
                "peak_rss_gb": peak_rss_gb}


@dataclass(frozen=True)
class ResumeState:
    """What a resumed run continues from: a checkpoint folder and its ``state.json`` record (a fresh
    run has none: ``None`` wherever a ``ResumeState`` is taken)."""

    #: the checkpoint folder (``policy/``, ``learner.pt``, ``state.json``)
    path: Path
    run: RunState
    #: the learner's and the rollout's own JSON state
    learner: dict[str, Any]
    rollout: dict[str, Any]
    #: bytes of metrics.jsonl, events.jsonl and samples.jsonl the checkpoint had seen (the rest is redone)
    metrics_offset: int
    events_offset: int
    #: None: a checkpoint from before transcripts were cut back with it
    samples_offset: int | None

    @classmethod
    def from_checkpoint(cls, path: Path, state: dict[str, Any]) -> ResumeState:
        saved = state["run"]  # rl_s: absent from checkpoints written before it was kept
        run = RunState(step=int(saved["step"]), trajectories=int(saved["trajectories"]), rl_s=float(saved.get("rl_s", 0.0)))
        return cls(path=path, run=run, learner=state["learner"], rollout=state["rollout"],
                   metrics_offset=int(state["metrics_offset"]), events_offset=int(state["events_offset"]),
                   samples_offset=state.get("samples_offset"))


#: the frozen policy a KL penalty measures against, inside the run folder
REFERENCE_FOLDER = "reference_model"


def load_reference(root: Path, config: Config) -> Any:
    """The run's reference policy (``Workspace.reference`` wrote it when the run began)."""
    policy = load_policy(root / REFERENCE_FOLDER, dtype=config.model.dtype, device=config.model.device)
    return SimpleNamespace(model=policy.inference_model())


def load_run_policy(config: Config, state: ResumeState | None, sft_model: Path | None = None) -> Any:
    """The policy a run trains: the checkpoint's, else (``sft_model``: a resume after SFT) that SFT
    model as ``model.init_from``, else the configured starting policy."""
    model = config.model
    if state is not None:
        return load_policy(state.path / "policy", dtype=model.dtype, device=model.device, threads=model.threads,
                           float32_weights=True, tool_format=model.tool_format)
    if sft_model is not None:
        config = config.model_copy(update={"model": model.model_copy(update={"init_from": str(sft_model)})})
    return load_policy(
        **policy_source(config),
        dtype=model.dtype,
        device=model.device,
        threads=model.threads,
        lora=model.lora.model_dump() if model.lora else None,
        float32_weights=True,  # trained: half-precision weights would lose Adam's small steps
    )


def policy_source(config: Config) -> dict[str, Any]:
    """The ``load_policy`` arguments that say which starting policy a run builds (its spec first)."""
    model = config.model
    entity_tokens = environment_entities(config) if model.entity_tokens and not model.init_from else ()
    return {"spec": model.init_from or model.spec, "seed": config.train.seed,
            "model_overrides": model.overrides or None, "entity_tokens": entity_tokens,
            "chat_template": model.chat_template, "tool_format": model.tool_format}


def model_record(config: Config, policy: Any) -> dict[str, Any]:
    """The model a run trains, as its summary and report record it."""
    lora = config.model.lora.model_dump() if config.model.lora else None
    return {"spec": config.model.spec, "init_from": config.model.init_from, "lora": lora, **policy.describe()}


def model_line(model: dict[str, Any]) -> str:
    """``model: smollm2-135m (134.5M parameters, 0.9M trained by LoRA r=8; float32), its own weights``"""
    size = f"{model['parameters'] / 1e6:.1f}M parameters"
    if model["trained_parameters"] != model["parameters"]:
        size += f", {model['trained_parameters'] / 1e6:.2f}M trained" + (f" by LoRA r={model['lora']['r']}" if model["lora"] else "")
    start = f"from {model['init_from']}" if model["init_from"] else "from its own weights"
    return f"model: {model['spec']} ({size}; {model['dtype']}), {start}"


def environment_entities(config: Config) -> tuple[str, ...]:
    """The configured environment's ``EnvSpec.entity_tokens``."""
    return Environment.of(config.env).spec().entity_tokens


#: everything a run (or ``streamrl sft``) writes into its folder: what ``overwrite`` removes
RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "events.jsonl", "samples.jsonl", "summary.json", "checkpoints",
               "sft_model", "reference_model", "final_model", "report", "tensorboard")
#: configuration a resumed run may change (its length, how often it evaluates, saves and logs, its
#: threads and learner processes); every other field must equal the saved run's
RESUMABLE = ("train.steps", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints", "logging.",
             "eval.concurrency", "model.threads", "rollout.engine_threads", "train.learner_processes")
#: state.json offset -> the log it points into
LOG_OFFSETS = {"metrics_offset": "metrics.jsonl", "events_offset": "events.jsonl", "samples_offset": "samples.jsonl"}


#: the file a training process holds an exclusive OS lock on for its whole life (released by the
#: kernel however the process ends, SIGKILL included); it names the holder's pid
LOCK_FILE = ".lock"
#: what a run that failed before its first step leaves: such a folder is reused without --overwrite
LEFT_BEFORE_STEP_ONE = {"config.yaml", LOCK_FILE, "metrics.jsonl", "events.jsonl", "samples.jsonl"}


def lock_folder(root: Path) -> int:
    """Hold ``root``'s lock (creating the folder); a ``RunFolderError`` naming the holder when a live
    process has it. Returns the descriptor, kept open as long as the lock is to be held."""
    import fcntl

    try:
        root.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise RunFolderError(f"--out {root}: cannot use it as a run folder ({error.strerror or error})") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(descriptor, 32).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise RunFolderError(f"--out {root}: a live training process (pid {holder}) is using this run folder; "
                             f"wait for it to end or stop it (kill {holder})") from None
    try:
        os.ftruncate(descriptor, 0)
        os.write(descriptor, str(os.getpid()).encode())
    except OSError as error:  # a full disk already
        os.close(descriptor)
        free = shutil.disk_usage(root).free
        raise RunFolderError(f"--out {root}: cannot write in it ({error.strerror}; {free:,} bytes free)") from None
    return descriptor


def claim_folder(root: Path, *, overwrite: bool = False) -> None:
    """Make ``root`` an empty run folder: refuse a non-empty one unless ``overwrite``, which removes
    only what a run writes (anything else there is refused before deleting a thing)."""
    entries = sorted(p.name for p in root.iterdir() if p.name != LOCK_FILE) if root.is_dir() else []
    if set(entries) <= LEFT_BEFORE_STEP_ONE and not (root / "checkpoints").exists() and not _has_train_steps(root):
        overwrite = True  # a run that failed before its first step: nothing to lose
    if entries and not overwrite:
        raise RunFolderError(f"--out {root} is not empty; pass --resume to continue its run or --overwrite to replace it")
    foreign = [name for name in entries if name not in RUN_ENTRIES]
    if foreign:
        raise RunFolderError(f"--overwrite: {root} holds files no run writes ({', '.join(foreign[:5])}); remove them yourself")
    for name in entries:
        path = root / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    root.mkdir(parents=True, exist_ok=True)


def _has_train_steps(root: Path) -> bool:
    metrics = root / "metrics.jsonl"
    return metrics.is_file() and '"kind": "train"' in metrics.read_text(errors="replace")


def check_resume(root: Path, config: Config, warn: Callable[[str], None] = print) -> Checkpoint | None:
    """Everything a resume needs, read-only: the same configuration (but for ``RESUMABLE``) and an
    intact newest checkpoint whose log offsets lie within the logs (None: nothing to resume)."""
    saved_path = root / "config.yaml"
    if not saved_path.is_file():
        if list_checkpoints(root / "checkpoints"):  # a run whose config.yaml was deleted: never guess it
            raise RunFolderError(f"--resume: {saved_path} is missing, and the checkpoints under {root} were trained with it; "
                                 "restore it (or use --overwrite to start again)")
        what = "no folder" if not root.exists() else "no run (no config.yaml)"
        raise RunFolderError(f"--resume: {root} holds {what} to resume; leave out --resume to start a run there")
    try:
        saved = load_config(saved_path)
    except ConfigError as error:
        raise RunFolderError(f"--resume: the saved {saved_path} no longer validates ({error})") from None
    changed = config_changes(saved, config)
    if changed:
        shown = "; ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        allowed = ", ".join(f.rstrip(".") for f in RESUMABLE)
        raise RunFolderError(f"--resume: {root} was run with another configuration: {shown} (a resume may change only {allowed})")
    checkpoints = list_checkpoints(root / "checkpoints")
    checkpoint = latest_valid(root / "checkpoints", warn=warn)
    if checkpoint is None and sft_result(root) is None:
        outputs = run_outputs(root)
        if outputs or checkpoints:  # something to lose: a resume never replaces it
            found = ", ".join([*(f"{c.path.name} (unusable)" for c in checkpoints), *outputs])
            raise RunFolderError(f"--resume: {root} has no usable checkpoint (found {found}); nothing was changed. "
                                 "Restore a checkpoint under checkpoints/, or use --overwrite to start again")
    if checkpoint is not None:
        state = checkpoint.state()
        if "config" in state:  # config.yaml edited since: the checkpoint's weights and optimiser say otherwise
            edited = config_changes(Config.model_validate(state["config"]), config)
            if edited:
                shown = "; ".join(edited[:3]) + (f" and {len(edited) - 3} more" if len(edited) > 3 else "")
                raise RunFolderError(
                    f"--resume: {root}'s {checkpoint.path.name} was trained with another configuration than asked: {shown}; "
                    "restore config.yaml (a resume may change only train.steps, evaluation, checkpoint and logging "
                    "fields, as overrides on the command line)")
        for key, name in LOG_OFFSETS.items():
            size = (root / name).stat().st_size if (root / name).exists() else 0
            if (state.get(key) or 0) > size:
                raise RunFolderError(
                    f"--resume: {checkpoint.path.name} expects {state[key]} bytes of {name}, which has {size} "
                    "(the folder was written by another run); use --overwrite to start again"
                )
    return checkpoint


#: what a run writes besides checkpoints and config.yaml
RUN_OUTPUTS = ("metrics.jsonl", "events.jsonl", "samples.jsonl", "summary.json", "final_model", "report", "sft_model")


def run_outputs(root: Path) -> list[str]:
    """The run outputs ``root`` holds that are not empty."""
    def holds(path: Path) -> bool:
        return path.is_dir() and any(path.iterdir()) or path.is_file() and path.stat().st_size > 0

    return [name for name in RUN_OUTPUTS if holds(root / name)]


def sft_result(root: Path) -> Path | None:
    """The SFT model of a run stopped after SFT and before RL logged anything (its first evaluation
    or step): a resume starts RL from it and keeps SFT's records instead of cloning again."""
    model = root / "sft_model"
    if not (model / "config.json").is_file() or list_checkpoints(root / "checkpoints"):
        return None
    if any(name in run_outputs(root) for name in ("events.jsonl", "summary.json", "final_model", "report")):
        return None
    from streamrl.training.loggers import read_metrics

    return model if all(r.get("kind") == "sft" for r in read_metrics(root / "metrics.jsonl")) else None


def config_changes(saved: Config, config: Config) -> list[str]:
    """``field saved -> new`` for every differing non-resumable field, names first."""
    before, after = _flatten(saved.model_dump(mode="json")), _flatten(config.model_dump(mode="json"))
    keys = [k for k in dict.fromkeys([*before, *after]) if not k.startswith(RESUMABLE) and before.get(k) != after.get(k)]
    keys.sort(key=lambda k: not k.endswith(".name"))  # a changed name (algo.name) explains the rest
    return [f"{k} {before.get(k)!r} -> {after.get(k)!r}" for k in keys]


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class Workspace:
    """A run folder, checked (``claim_folder`` or ``check_resume``) before anything is written."""

    def __init__(self, root: Path, config: Config, echo: Callable[[str], None] = print, *, resume: bool = False,
                 overwrite: bool = False):
        self.root = root
        self.config = config
        self.echo = echo
        self.checkpoints = root / "checkpoints"
        self.metrics_path = root / "metrics.jsonl"
        self.events = root / "events.jsonl"
        self.samples = root / "samples.jsonl"
        self.resume = resume
        # held until release() or the process's end; first, so a live run's folder is refused as such
        self._lock: int | None = lock_folder(root) if os.path.isdir(root) else None  # (False for a name too long)
        try:
            self.checkpoint = check_resume(root, config, warn=echo) if resume else None
            #: a resumed run stopped between SFT and RL: RL starts from this SFT model
            self.sft_kept = sft_result(root) if resume and self.checkpoint is None else None
            if self._lock is None:
                self._lock = lock_folder(root)
            if self.finished() is None:
                if not resume:
                    claim_folder(root, overwrite=overwrite)
                root.mkdir(parents=True, exist_ok=True)
                (root / "config.yaml").write_text(config_to_yaml(config))
        except BaseException:  # refused: the folder is not ours to hold
            self.release()
            raise

    def release(self) -> None:
        """Let go of the folder's lock (the process's end does it too)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def finished(self) -> dict[str, Any] | None:
        """The summary of a resumed run that already reached ``train.steps`` (nothing to redo)."""
        summary = self.root / "summary.json"
        if self.checkpoint is None or self.checkpoint.step < self.config.train.steps or not summary.is_file():
            return None
        return json.loads(summary.read_text())

    # -- resume -----------------------------------------------------------------------------------

    def restore(self) -> ResumeState | None:
        checkpoint = self.checkpoint
        if checkpoint is None:
            if self.sft_kept:
                self.echo(f"resume: no checkpoint yet; RL starts from the SFT model kept in {self.sft_kept}")
            elif self.resume:
                self.echo(f"resume: {self.root} holds no run output yet; starting from scratch")
            return None
        state = ResumeState.from_checkpoint(checkpoint.path, checkpoint.state())
        self.echo(f"resume: continuing from {checkpoint.path.name} (step {state.run.step})")
        return state

    def logger(self, state: ResumeState | None) -> MetricsLogger:
        logging = self.config.logging
        return MetricsLogger(
            self.metrics_path,
            tensorboard=logging.tensorboard is not False,  # null: when installed
            wandb_project=logging.wandb_project,
            mlflow_experiment=logging.mlflow_experiment,
            run_config=self.config.model_dump(mode="json"),
            resume_offset=state.metrics_offset if state else self._sft_records_end(),
        )

    def _sft_records_end(self) -> int:
        return self.metrics_path.stat().st_size if self.sft_kept and self.metrics_path.is_file() else 0

    def events_path(self, state: ResumeState | None) -> Path:
        """The event log, cut back to what the checkpoint had seen (everything after is redone)."""
        return _cut_back(self.events, state.events_offset if state else 0)

    def sample_log(self, state: ResumeState | None) -> SampleLog:
        """Transcripts, likewise cut back (checkpoints from before transcripts existed keep them all)."""
        return SampleLog(_cut_back(self.samples, state.samples_offset if state else 0),
                         self.config.logging.sample_text_chars)

    def reference(self, config: Config, policy: Any, state: ResumeState | None) -> Any:
        """A frozen copy of the policy as RL starts (kept on disk so a resume uses the same one)."""
        if not (config.train.reference_model or config.algo.kl_coef > 0):
            return None
        folder = self.root / REFERENCE_FOLDER
        if state is None:
            policy.save(folder)
            return SimpleNamespace(model=policy.inference_model())
        return load_reference(self.root, config)

    def load_learner(self, state: ResumeState, learner: Any) -> RunState:
        learner.load_state_dict(state.learner)
        tensors = torch.load(state.path / "learner.pt", weights_only=False)
        learner.load_tensor_state(tensors["learner"])
        torch.set_rng_state(tensors["torch_rng"])
        random.setstate(tensors["python_rng"])
        return state.run

    # -- save -------------------------------------------------------------------------------------

    def save(self, run: RunState, policy: Any, learner: Any, rollout: Any, logger: MetricsLogger) -> None:
        """Checkpoint everything at one instant (no await between the reads below)."""
        state = {
            "run": {"step": run.step, "version": run.version, "trajectories": run.trajectories, "rl_s": run.rl_s},
            "learner": learner.state_dict(),
            "rollout": rollout.state_dict(),
            "metrics_offset": logger.offset(),
            "events_offset": self.events.stat().st_size if self.events.exists() else 0,
            "samples_offset": self.samples.stat().st_size if self.samples.exists() else 0,
            # the configuration this state was trained with: a resume checks config.yaml against it
            "config": self.config.model_dump(mode="json"),
        }
        tensors = {"learner": learner.tensor_state(), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}

        def write(folder: Path) -> None:
            policy.save(folder / "policy")
            torch.save(tensors, folder / "learner.pt")

        try:
            save_checkpoint(self.checkpoints, run.step, state, write, keep=self.config.train.keep_checkpoints)
        except (OSError, RuntimeError) as error:  # a full disk reaches torch.save as a RuntimeError
            message = " ".join(str(error).split())[:300]
            raise TrainingError(f"the step-{run.step} checkpoint could not be written under {self.checkpoints} ({message}); "
                                "the previous checkpoint is intact: free space and continue with --resume") from None

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
