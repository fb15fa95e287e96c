"""A training process killed with SIGKILL mid-run resumes exactly: step count, tracker state and
trajectory accounting continue as if it had never stopped."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from streamrl.rollout import read_events, replay
from streamrl.training.loggers import read_metrics

STEPS, BATCH = 8, 8
ARGS = [
    "--config", "configs/smoke.yaml", "--algo", "spo++",
    f"train.steps={STEPS}", f"train.batch_size={BATCH}", "train.checkpoint_every=2", "train.keep_checkpoints=3",
    "train.eval_at_start=false", "env.eval_tasks=2", "sft.demos=4",
]


def _train(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl", "train", "--out", str(out), *ARGS, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_sigkill_then_resume_continues_exactly(tmp_path, sigkill_at_checkpoint):
    out = tmp_path / "run"
    # kill as soon as the step-4 checkpoint exists: the process is then inside step 5 or 6
    sigkill_at_checkpoint(_train(out), out, step=4, timeout=240)
    killed_steps = [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")]
    assert killed_steps[:4] == [1, 2, 3, 4]

    second = _train(out, "--resume")
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    assert "resume: continuing from step_0000000" in output

    # metrics continue where the checkpoint stopped: every step once, in order
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == list(range(1, STEPS + 1))

    state = json.loads((out / "checkpoints" / f"step_{STEPS:08d}" / "state.json").read_text())
    assert {k: v for k, v in state["run"].items() if k != "rl_s"} == {"step": STEPS, "version": STEPS, "trajectories": STEPS * BATCH}
    assert state["run"]["rl_s"] > 0  # the RL clock, which goes on across the resume
    tracker = state["learner"]["tracker"]
    assert math.isclose(tracker["z"], STEPS * -math.log(0.875), rel_tol=1e-12)

    # trajectory accounting from the event log: no request trained twice, none lost
    batches = replay(out / "events.jsonl")
    delivered = [rid for batch in batches for rid in batch]
    assert len(batches) == STEPS and len(delivered) == STEPS * BATCH
    assert len(set(delivered)) == len(delivered)
    events = read_events(out / "events.jsonl")
    dispatched = {e["request_id"] for e in events if e["event"] == "dispatch"}
    pending = {r["request_id"] for r in state["rollout"]["inflight"]}
    pending |= {t["dispatch"]["request_id"] for t in state["rollout"]["buffer"].get("trajectories", [])}
    assert dispatched == set(delivered) | pending
    # evidence was recorded once per arrived result, the duplicates of the killed run included none
    seen = tracker["seen_request_ids"]
    assert len(seen) == len(set(seen))
