"""``--agent`` training killed with SIGKILL resumes like environment training: every step once, no
session trained twice or lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from streamrl.rollout import replay
from streamrl.training.loggers import read_metrics

ROOT = Path(__file__).resolve().parents[2]
STEPS, BATCH = 6, 8
ARGS = ["--config", "configs/smoke.yaml", "--agent", "examples/openai_agent.py:run", "--tasks", "examples/pick_tasks.jsonl",
        f"train.steps={STEPS}", f"train.batch_size={BATCH}", "train.checkpoint_every=2", "train.eval_at_start=false",
        "env.eval_tasks=2"]


def _train(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl", "train", "--out", str(out), *ARGS, *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_agent_training_resumes_after_sigkill(tmp_path, sigkill_at_checkpoint):
    out = tmp_path / "run"
    sigkill_at_checkpoint(_train(out), out, step=2, timeout=240)
    second = _train(out, "--resume")
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    assert "resume: continuing from step_0000000" in output
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == list(range(1, STEPS + 1))
    delivered = [rid for batch in replay(out / "events.jsonl") for rid in batch]
    assert len(delivered) == STEPS * BATCH and len(set(delivered)) == len(delivered)
