"""Transcripts: samples.jsonl records, the success/failure mix, report/samples.md, and a short run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from streamrl.rollout import DispatchRecord, Trajectory, Turn
from streamrl.training.config_files import load_config
from streamrl.training.loggers import read_metrics
from streamrl.training.loop import train
from streamrl.training.report import samples_markdown
from streamrl.training.run import ResumeState, RunState, Workspace
from streamrl.training.samples import mixed_selection, transcript


def _turn(action: str, observation: str, reward: float = 0.0, valid: bool = True) -> Turn:
    return Turn(context_ids=[1], action_ids=[5, 6], logprobs=[-0.1, -0.2], action_text=f"<a>{action}</a>",
                action=action, format_valid=valid, action_effective=valid, reward=reward, done=False,
                finish_reason="stop", policy_version=2, observation=observation)


def _episode(request_id: str, won: bool) -> Trajectory:
    turns = [_turn("go to shelf 1", "On the shelf 1, you see a mug."), _turn("take", "Nothing happens.", valid=False),
             _turn("take mug 1", "You pick up the mug 1.", reward=float(won))]
    return Trajectory(dispatch=DispatchRecord(request_id=request_id, prompt_id=f"task/{request_id}", seq=0, policy_version=2),
                      layout="per_step", turns=turns, initial_observation="Your task is to: find a mug.",
                      outcome=float(won), won=won, task_type="pick", end_reason="terminated")


def test_transcript_holds_the_task_and_every_turn():
    record = transcript(_episode("r1", True), kind="train", step=7, advantages=[0.5, -0.25, 0.5])
    assert json.loads(json.dumps(record)) == record
    assert {k: record[k] for k in ("kind", "step", "tag", "request_id", "task_id", "task_type", "won", "outcome",
                                   "end_reason", "policy_version")} == {
        "kind": "train", "step": 7, "tag": None, "request_id": "r1", "task_id": "task/r1", "task_type": "pick",
        "won": True, "outcome": 1.0, "end_reason": "terminated", "policy_version": 2}
    assert record["task"] == "Your task is to: find a mug."
    assert record["turns"][1] == {"action_text": "<a>take</a>", "action": "take", "observation": "Nothing happens.",
                                  "reward": 0.0, "format_valid": False, "format_reason": None, "tool_calls": None,
                                  "reply": None, "advantage": -0.25}
    assert [t["advantage"] for t in transcript(_episode("r2", False), kind="eval", step=0)["turns"]] == [None] * 3


def test_selection_alternates_successes_and_failures_in_batch_order():
    batch = [_episode("l1", False), _episode("l2", False), _episode("l3", False), _episode("w1", True), _episode("w2", True)]
    ids = [t.request_id for t in mixed_selection(batch, 4)]
    assert ids == ["w1", "l1", "w2", "l2"]
    assert [t.request_id for t in mixed_selection(batch[:3], 2)] == ["l1", "l2"]  # no success: failures only
    assert len(mixed_selection(batch, 10)) == 5


def test_samples_markdown_shows_a_success_and_a_failure():
    records = [transcript(_episode(r, won), kind="eval", step=3, tag="eval-v3-final")
               for r, won in (("a", False), ("b", True), ("c", False))]
    text = samples_markdown(records)
    assert "## Success: task/b" in text and "## Failure: task/a" in text and "## Failure: task/c" in text
    assert "> <a>go to shelf 1</a>\nOn the shelf 1, you see a mug.\nreward 0" in text
    assert "> <a>take</a>  [invalid format]" in text
    assert text.index("Your task is to: find a mug.") < text.index("> <a>go to shelf 1</a>")


def test_samples_markdown_keeps_code_in_actions_readable():
    episode = _episode("m", True)
    episode.turns[0].action_text = "```python\nprint(1)\n```"
    text = samples_markdown([transcript(episode, kind="eval", step=1, tag="eval-v1")])
    assert "````text\n" in text and "> ```python\n> print(1)\n> ```\nOn the shelf 1" in text
    assert "_no failure in this evaluation_" in text


def test_resume_cuts_transcripts_back_to_the_checkpoint(tmp_path):
    ws = Workspace(tmp_path, load_config("configs/smoke.yaml"))
    log = ws.sample_log(None)
    log.write([_episode("kept", True)], kind="train", step=1)
    offset = ws.samples.stat().st_size
    log.write([_episode("redone", False)], kind="train", step=2)
    log.close()
    ws.sample_log(ResumeState(Path("."), RunState(), {}, {}, 0, 0, offset)).close()
    assert [r["request_id"] for r in read_metrics(ws.samples)] == ["kept"]


def test_training_writes_train_and_every_eval_episode(coin_config, tmp_path):
    config = coin_config("spo++", "train.steps=2", "train.checkpoint_every=0", "train.eval_at_start=true",
                         "logging.samples_every=1", "logging.samples_per_step=3")
    asyncio.run(train(config, tmp_path))
    records = read_metrics(tmp_path / "samples.jsonl")
    trained = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in trained] == [1, 1, 1, 2, 2, 2]
    assert all(isinstance(t["advantage"], float) for r in trained for t in r["turns"])
    evals = [r for r in records if r["kind"] == "eval"]
    assert [(r["tag"], r["step"]) for r in evals] == [("eval-v0", 0)] * 4 + [("eval-v2-final", 2)] * 4
    assert all(r["turns"] and r["task"] == "Flip." for r in evals)
    assert "Transcripts: [samples.md](samples.md)" in (tmp_path / "report" / "eval.md").read_text()
    assert "# Transcripts: eval-v2-final (step 2, 4 episodes)" in (tmp_path / "report" / "samples.md").read_text()
