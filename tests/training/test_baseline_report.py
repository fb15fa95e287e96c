"""The run report grades the baselines frozen at dispatch against the run's own evidence (issue 37)."""

from __future__ import annotations

from streamrl.rollout.events import EventLog
from streamrl.training.report import baseline_summary


def _events(path, baseline_of, scale=1.0):
    """Two tasks succeeding in exactly 1 and 4 of every 5 episodes over 20 versions; baselines given per task."""
    log = EventLog(path)
    for version in range(20):
        for task, p in (("a", 0.2), ("b", 0.8)):
            for copy in range(4):
                rid = f"{task}-{version}-{copy}"
                log.write("dispatch", request_id=rid, prompt_id=task, policy_version=version, baseline=scale * baseline_of[task])
                log.write("result", request_id=rid, prompt_id=task, outcome=float((4 * version + copy) % 5 < 5 * p))
    log.write("dispatch", request_id="lost", prompt_id="a", policy_version=3, baseline=0.5)  # never finished
    log.close()


def test_accurate_frozen_baselines_grade_near_zero_and_optimistic_ones_positive(tmp_path):
    _events(tmp_path / "right.jsonl", {"a": 0.2, "b": 0.8}, scale=2.0)
    right = baseline_summary(tmp_path / "right.jsonl", (0.0, 1.0), scale=2.0)
    assert right is not None and "over 160 episodes (0 without evidence)" in right
    bias = float(right.split("bias ")[1].split(",")[0])
    assert abs(bias) < 0.03
    _events(tmp_path / "high.jsonl", {"a": 0.5, "b": 1.0})
    high = baseline_summary(tmp_path / "high.jsonl", (0.0, 1.0))
    assert high is not None and float(high.split("bias ")[1].split(",")[0]) > 0.2


def test_runs_without_frozen_baselines_say_nothing(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.write("dispatch", request_id="r", prompt_id="a", policy_version=0, baseline=None)
    log.write("result", request_id="r", prompt_id="a", outcome=1.0)
    log.close()
    assert baseline_summary(tmp_path / "events.jsonl", (0.0, 1.0)) is None
    assert baseline_summary(tmp_path / "none.jsonl", (0.0, 1.0)) is None
