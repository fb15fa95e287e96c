"""Bring-your-own problems: read ``question``/``answer`` rows from a local ``.jsonl``, ``.json``
or ``.parquet`` file (GSM8K, MATH-500, AIME, your own). Nothing is downloaded.

GSM8K stores the worked solution in ``answer`` and the final number after ``####``; only that
final part is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DataRow:
    question: str
    answer: str
    task_type: str


def _read_jsonl(path: Path) -> list[Any]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
    return rows


def _read_json(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise ValueError(f"{path}: a .json data file must hold a list of objects")
    return data


def _read_parquet(path: Path) -> list[Any]:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        parquet = None
    if parquet is not None:
        return parquet.read_table(path).to_pylist()
    try:
        import pandas
    except ImportError:
        raise ImportError(
            f"reading {path} needs pyarrow or pandas, and neither is installed (pip install pyarrow), "
            "or convert the file to .jsonl"
        ) from None
    return pandas.read_parquet(path).to_dict("records")


_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}


def final_answer(raw: Any) -> str:
    """The gradeable answer of a row: GSM8K's text after ``####``, else the value as text."""
    text = str(raw).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    return text


def load_rows(
    path: str | Path,
    question_field: str = "question",
    answer_field: str = "answer",
    type_field: str | None = None,
) -> list[DataRow]:
    """Every row of ``path`` as a ``DataRow``; a clear error names the file, row and field."""
    path = Path(path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"{path}: unsupported data file type {path.suffix!r}; use one of {', '.join(_READERS)}")
    if not path.is_file():
        raise FileNotFoundError(f"math_tir data file not found: {path}")
    records = reader(path)
    if not records:
        raise ValueError(f"{path}: the data file holds no rows")
    rows = []
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{path}: row {index} is a {type(record).__name__}, not an object")
        for field, option in (
            (question_field, "question_field"),
            (answer_field, "answer_field"),
            (type_field, "type_field"),
        ):
            if field is not None and field not in record:
                known = ", ".join(sorted(map(str, record))) or "none"
                raise ValueError(f"{path}: row {index} has no field {field!r} (its fields: {known}); set {option}=")
        answer = final_answer(record[answer_field])
        if not str(record[question_field]).strip() or not answer:
            raise ValueError(f"{path}: row {index} has an empty {question_field!r} or {answer_field!r}")
        task_type = str(record[type_field]) if type_field is not None else "data"
        rows.append(DataRow(str(record[question_field]).strip(), answer, task_type))
    return rows
