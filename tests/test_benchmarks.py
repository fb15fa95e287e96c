"""Benchmarks run at a smoke size, so none rots: each ends with its ``RESULT`` line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: each benchmark at its smallest size: what it runs is what it measures, only less of it
SMOKE = {
    "agent_endpoint": ["--quick", "--calls", "4", "--new-tokens", "4", "--concurrency", "2"],
    "async_vs_sync": ["--quick", "--trajectories", "32", "--concurrency", "4"],
    "envs_alfworld_lite": ["--quick"],
    "generation_throughput": ["--model", "tiny", "--repeats", "1", "--tokens", "4", "--concurrency", "2"],
    "learner_scaling": ["--quick", "--model", "tiny"],
    "learner_throughput": ["--quick", "--model", "tiny"],
    "learning": ["--quick", "--steps", "2"],
    "multiturn_generation": ["--quick", "--model", "tiny", "--episodes", "2", "--turns", "2", "--tokens", "4"],
    "peer_engine": ["--smoke", "--threads", "1"],
    "quantised_rollouts": ["--quick", "--model", "tiny", "--repeats", "1"],
    "ray_rollout": ["--quick", "--trajectories", "8", "--concurrency", "2"],
    "sapo_vs_ppo": ["--quick", "--models", "tiny", "--batch", "2", "--turns", "2", "--new-tokens", "4", "--steps", "1",
                    "--threads", "1"],
}


def _result(name: str, *args: str) -> dict[str, str]:
    """The ``RESULT key=value ...`` fields the benchmark ended with."""
    out = subprocess.run([sys.executable, f"benchmarks/{name}.py", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-1000:] + out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), last
    return dict(item.split("=", 1) for item in last.split()[1:])


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_benchmark_runs_at_smoke_size(name):
    assert _result(name, *SMOKE[name])


def test_every_benchmark_has_a_smoke_run():
    names = {path.stem for path in (ROOT / "benchmarks").glob("*.py")}
    assert names - {"pretrained_step"} == set(SMOKE)  # pretrained_step.py: the test below


def test_pretrained_step_runs_every_part_at_smoke_size():
    values = _result("pretrained_step", "--smoke")
    assert set(values) == {"step_speedup", "eval_speedup", "peak_rss_gb", "reuse_speedup", "two_thread_speedup"}
    assert all(float(v) > 0 for v in values.values())
