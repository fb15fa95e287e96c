"""Atomic, verifiable checkpoints.

A checkpoint is a folder ``step_00000012/`` written under a temporary name, fsynced, given a
``manifest.json`` (size and sha256 of every file) last, then renamed into place. Loading walks the
checkpoints newest first and uses the first whose manifest verifies; a corrupt or partial one is
reported and skipped. A SIGKILL at any moment therefore leaves either the previous checkpoint or
the new one, never a half-written state that is mistaken for complete.

Pruning keeps the ``keep`` newest checkpoints that *verify* (the one just written among them) and
removes the rest, corrupt ones included: a corrupt checkpoint never takes the place of a valid one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MANIFEST = "manifest.json"
PREFIX = "step_"


class CheckpointError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int

    def file(self, name: str) -> Path:
        return self.path / name

    def state(self) -> dict[str, Any]:
        return json.loads(self.file("state.json").read_text())


def save_checkpoint(
    root: Path,
    step: int,
    state: dict[str, Any],
    write_files: Callable[[Path], None],
    keep: int = 2,
) -> Checkpoint:
    """Write ``state`` (JSON) plus whatever ``write_files(folder)`` writes, atomically."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    for stale in root.glob(".tmp-*"):  # halves of saves that a crash, a kill or a full disk cut short
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    write_files(tmp)
    (tmp / "state.json").write_text(json.dumps(state))
    manifest = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
        manifest[str(path.relative_to(tmp))] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest_path = tmp / MANIFEST
    manifest_path.write_text(json.dumps({"step": step, "files": manifest}))
    with manifest_path.open("rb") as handle:
        os.fsync(handle.fileno())
    _fsync_dir(tmp)
    if final.exists():  # a re-run of the same step after a resume replaces it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    written = Checkpoint(final, step)
    _prune(root, keep, written)
    return written


def verify(path: Path) -> str | None:
    """None when the checkpoint at ``path`` is complete and intact, else what is wrong."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return "no manifest (partial write)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"unreadable manifest: {exc}"
    for name, meta in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            return f"missing file {name}"
        if file.stat().st_size != meta["size"] or _sha256(file) != meta["sha256"]:
            return f"{name} does not match its recorded hash"
    return None


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Finished checkpoint folders under ``root``, newest first (not verified)."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith(PREFIX) and path.name[len(PREFIX) :].isdigit():
            found.append(Checkpoint(path, int(path.name[len(PREFIX) :])))
    return sorted(found, key=lambda c: c.step, reverse=True)


def latest_valid(root: Path, warn: Callable[[str], None] = print) -> Checkpoint | None:
    """The newest checkpoint that verifies; every skipped one is reported through ``warn``."""
    for checkpoint in list_checkpoints(root):
        problem = verify(checkpoint.path)
        if problem is None:
            return checkpoint
        warn(f"checkpoint {checkpoint.path.name} is unusable ({problem}); trying the previous one")
    return None


def _prune(root: Path, keep: int, written: Checkpoint) -> None:
    """Keep the ``keep`` newest valid checkpoints (``written`` is valid by construction); older
    ones are removed unverified once enough valid ones are kept, corrupt ones always."""
    kept = 0
    for checkpoint in list_checkpoints(root):
        if kept < keep and (checkpoint == written or verify(checkpoint.path) is None):
            kept += 1
            continue
        shutil.rmtree(checkpoint.path, ignore_errors=True)
    for stale in root.glob(".tmp-*"):
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
