"""Metrics sinks: JSON lines always; TensorBoard when installed; W&B and MLflow when asked for.

``metrics.jsonl`` is the source of truth. Its byte length is stored in every checkpoint, so a
resumed run truncates the lines written after that checkpoint and continues without duplicates.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

from streamrl.rollout.events import JsonLines


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # 0-d tensors and numpy scalars
        return _jsonable(value.item())
    return value


class MetricsLogger:
    def __init__(
        self,
        path: Path,
        *,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        mlflow_experiment: str | None = None,
        run_config: dict[str, Any] | None = None,
        resume_offset: int | None = None,
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_offset is not None and self.path.exists():
            with self.path.open("r+b") as handle:
                handle.truncate(resume_offset)
        self._file = JsonLines(self.path)
        self._sinks: list[Any] = []
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional: JSON lines stay the record
                pass
            else:
                self._sinks.append(_TensorBoardSink(SummaryWriter(str(self.path.parent / "tensorboard"))))
        if wandb_project:
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError("logging.wandb_project is set but wandb is not installed: pip install 'streamrl[wandb]'") from exc
            self._sinks.append(_WandbSink(wandb.init(project=wandb_project, config=run_config, resume="allow")))
        if mlflow_experiment:
            try:
                import mlflow
            except ImportError as exc:
                raise RuntimeError("logging.mlflow_experiment is set but mlflow is not installed: pip install 'streamrl[mlflow]'") from exc
            mlflow.set_experiment(mlflow_experiment)
            mlflow.start_run()
            if run_config:
                mlflow.log_dict(run_config, "config.json")
            self._sinks.append(_MlflowSink(mlflow))

    def log(self, step: int, metrics: dict[str, Any], kind: str = "train") -> None:
        record = {"kind": kind, "step": step, "time": round(time.time(), 3)}
        record.update({key: _jsonable(value) for key, value in metrics.items()})
        self._file.append(record)
        numeric = {f"{kind}/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("step", "time")}
        for sink in self._sinks:
            sink.log(step, numeric)

    def offset(self) -> int:
        """Bytes written so far, synced to disk (stored in checkpoints)."""
        self._file.sync()
        return self.path.stat().st_size

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._sinks = []
        self._file.close()


def read_metrics(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of a kind-tagged JSON-lines file (metrics.jsonl, samples.jsonl); [] if absent. A
    line that is not a record (torn, invalid UTF-8, foreign) is skipped with one warning for the file."""
    records: list[dict[str, Any]] = []
    if not Path(path).exists():
        return records
    skipped: list[int] = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):  # torn by a kill or a full disk, or foreign
            skipped.append(number)
        elif kind is None or record.get("kind") == kind:
            records.append(record)
    if skipped:
        warnings.warn(f"{path}: skipped {len(skipped)} line(s) that are not records (first: line {skipped[0]})", stacklevel=2)
    return records


class _TensorBoardSink:
    def __init__(self, writer: Any):
        self.writer = writer

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class _WandbSink:
    def __init__(self, run: Any):
        self.run = run

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class _MlflowSink:
    def __init__(self, mlflow: Any):
        self.mlflow = mlflow

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        self.mlflow.end_run()
