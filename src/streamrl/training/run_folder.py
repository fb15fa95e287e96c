"""Who may use a run folder, and whether a resume can: the folder's lock, claiming it for a new run,
and the checks a resume makes before writing anything.

A folder holds one run: a non-empty one is refused unless the run is resumed or replaced
(``overwrite``, which removes only what a run writes). A resume checks everything first: the
configuration matches the saved one but for ``RESUMABLE`` fields, and the newest intact checkpoint's
log offsets lie within the logs. Every refusal is a ``RunFolderError``: one line, exit status 2.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

from streamrl.training.checkpoint import Checkpoint, latest_valid, list_checkpoints
from streamrl.training.config import Config, ConfigError
from streamrl.training.config_files import load_config

#: everything a run (or ``streamrl sft``) writes into its folder: what ``overwrite`` removes
RUN_ENTRIES = (
    "config.yaml",
    "metrics.jsonl",
    "events.jsonl",
    "samples.jsonl",
    "summary.json",
    "checkpoints",
    "sft_model",
    "reference_model",
    "final_model",
    "report",
    "tensorboard",
)
#: configuration a resumed run may change (its length, how often it evaluates, saves and logs, its
#: threads and learner processes); every other field must equal the saved run's
RESUMABLE = (
    "train.steps",
    "train.eval_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "logging.",
    "eval.concurrency",
    "model.threads",
    "rollout.engine_threads",
    "train.learner_processes",
)
#: state.json offset -> the log it points into
LOG_OFFSETS = {"metrics_offset": "metrics.jsonl", "events_offset": "events.jsonl", "samples_offset": "samples.jsonl"}


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked: one line, exit status 2."""


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
        raise RunFolderError(
            f"--out {root}: a live training process (pid {holder}) is using this run folder; "
            f"wait for it to end or stop it (kill {holder})"
        ) from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, str(os.getpid()).encode())
    return descriptor


def claim_folder(root: Path, *, overwrite: bool = False) -> None:
    """Make ``root`` an empty run folder: refuse a non-empty one unless ``overwrite``, which removes
    only what a run writes (anything else there is refused before deleting a thing)."""
    entries = sorted(p.name for p in root.iterdir() if p.name != LOCK_FILE) if root.is_dir() else []
    if set(entries) <= LEFT_BEFORE_STEP_ONE and not (root / "checkpoints").exists() and not _has_train_steps(root):
        overwrite = True  # a run that failed before its first step: nothing to lose
    if entries and not overwrite:
        raise RunFolderError(
            f"--out {root} is not empty; pass --resume to continue its run or --overwrite to replace it"
        )
    foreign = [name for name in entries if name not in RUN_ENTRIES]
    if foreign:
        raise RunFolderError(
            f"--overwrite: {root} holds files no run writes ({', '.join(foreign[:5])}); remove them yourself"
        )
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
            raise RunFolderError(
                f"--resume: {saved_path} is missing, and the checkpoints under {root} were trained with it; "
                "restore it (or use --overwrite to start again)"
            )
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
        raise RunFolderError(
            f"--resume: {root} was run with another configuration: {shown} (a resume may change only {allowed})"
        )
    checkpoint = latest_valid(root / "checkpoints", warn=warn)
    if checkpoint is not None:
        state = checkpoint.state()
        if "config" in state:  # config.yaml edited since: the checkpoint's weights and optimiser say otherwise
            edited = config_changes(Config.model_validate(state["config"]), config)
            if edited:
                shown = "; ".join(edited[:3]) + (f" and {len(edited) - 3} more" if len(edited) > 3 else "")
                raise RunFolderError(
                    f"--resume: {root}'s {checkpoint.path.name} was trained with another configuration than asked: {shown}; "
                    "restore config.yaml (a resume may change only train.steps, evaluation, checkpoint and logging "
                    "fields, as overrides on the command line)"
                )
        for key, name in LOG_OFFSETS.items():
            size = (root / name).stat().st_size if (root / name).exists() else 0
            if (state.get(key) or 0) > size:
                raise RunFolderError(
                    f"--resume: {checkpoint.path.name} expects {state[key]} bytes of {name}, which has {size} "
                    "(the folder was written by another run); use --overwrite to start again"
                )
    return checkpoint


def config_changes(saved: Config, config: Config) -> list[str]:
    """``field saved -> new`` for every differing non-resumable field, names first."""
    before, after = _flatten(saved.model_dump(mode="json")), _flatten(config.model_dump(mode="json"))
    keys = [
        k for k in dict.fromkeys([*before, *after]) if not k.startswith(RESUMABLE) and before.get(k) != after.get(k)
    ]
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
