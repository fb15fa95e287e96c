"""`streamrl train --config configs/smoke.yaml --env webshop_lite --algo ...` runs on CPU in under a minute.

The command exactly as a user types it: smoke.yaml's ``sft.source: search_expert`` is each
environment's own non-privileged demonstrator (webshop_lite's searching shopper). SAPO runs in
the default suite; GRPO (same path, another loss) is marked slow.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _train(algo: str, out: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "streamrl", "train", "--config", "configs/smoke.yaml", "--env", "webshop_lite",
         "--algo", algo, "--out", str(out), "train.steps=2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "held-out success (test" in result.stdout
    assert "SFT: 0 demonstrations" not in result.stdout, "the searching shopper produced no successful demo"
    assert (out / "metrics.jsonl").is_file()
    return elapsed


def test_sapo_smoke_on_webshop_lite(tmp_path):
    assert _train("sapo", tmp_path / "sapo") < 60.0


@pytest.mark.slow
def test_grpo_smoke_on_webshop_lite(tmp_path):
    assert _train("grpo", tmp_path / "grpo") < 60.0
