"""Benchmarks run at a smoke size, so none rots: each ends with its ``RESULT`` line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pretrained_step_runs_every_part_at_smoke_size():
    out = subprocess.run([sys.executable, "benchmarks/pretrained_step.py", "--smoke"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT step_speedup="), last
    values = dict(item.split("=") for item in last.split()[1:])
    assert set(values) == {"step_speedup", "eval_speedup", "peak_rss_gb", "reuse_speedup", "two_thread_speedup"}
    assert all(float(v) > 0 for v in values.values())
