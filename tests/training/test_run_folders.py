"""Issue 13: a run folder holds one run. A non-empty --out is refused unless resumed or overwritten;
a resume checks everything before it writes anything; a finished run is not redone."""

from __future__ import annotations

import json

import pytest

from streamrl import cli
from streamrl.training.checkpoint import latest_valid

from . import conftest  # noqa: F401  (registers the coin environment)

RUN = ["--config", "configs/smoke.yaml", "env.name=coin", "env.prompt={}", "env.parser={}", "sft.demos=0",
       "train.eval_at_start=false", "env.eval_tasks=2", "rollout.max_new_tokens=6", "train.batch_size=4",
       "rollout.concurrency=4", "train.checkpoint_every=1", "logging.samples_every=0"]


def _train(out, *overrides, flags=()):
    return cli.main(["train", "--out", str(out), *flags, *RUN, *overrides])


def _one_line(capsys) -> str:
    # once-per-process announcements ("streamrl: dtype auto -> ...") of an earlier successful run are
    # not part of the error (errors read "streamrl <command>: error: ...")
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("streamrl: ")]
    err = "\n".join(lines)
    assert len(lines) == 1 and "Traceback" not in err, err
    return err


def test_reuse_is_refused_and_resume_checks_before_writing(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out, "train.steps=2") == 0
    config_before = (out / "config.yaml").read_text()
    metrics_before = (out / "metrics.jsonl").read_bytes()

    assert _train(out, "train.steps=1") == 2  # the first case: reusing the folder
    assert "is not empty" in _one_line(capsys)
    assert _train(out, "algo.group_size=2", flags=("--resume", "--algo", "grpo")) == 2  # the second: another algorithm
    assert "algo.name 'spo++' -> 'grpo'" in _one_line(capsys)
    assert (out / "config.yaml").read_text() == config_before and (out / "metrics.jsonl").read_bytes() == metrics_before

    assert _train(out, "train.steps=2", flags=("--resume",)) == 0  # finished: said so, nothing recomputed
    assert "already finished at step 2" in capsys.readouterr().out
    assert (out / "metrics.jsonl").read_bytes() == metrics_before

    assert _train(out, "train.steps=3", flags=("--resume",)) == 0  # a longer run continues
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if '"kind": "train"' in line] == [1, 2, 3]


def test_resume_refuses_log_offsets_beyond_the_logs(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out, "train.steps=1") == 0
    (out / "metrics.jsonl").write_text("")
    (out / "summary.json").unlink()
    assert _train(out, "train.steps=2", flags=("--resume",)) == 2
    err = _one_line(capsys)
    assert "metrics.jsonl" in err and "--overwrite" in err
    assert latest_valid(out / "checkpoints").step == 1 and (out / "metrics.jsonl").read_text() == ""


def test_overwrite_replaces_a_run_but_never_foreign_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out, "train.steps=1") == 0
    (out / "metrics.jsonl").write_text('{"kind": "train", "step": 99}\n')
    assert _train(out, "train.steps=1", flags=("--overwrite",)) == 0
    assert [r for r in (out / "metrics.jsonl").read_text().splitlines() if '"step": 99' in r] == []
    (out / "notes.txt").write_text("mine")
    assert _train(out, "train.steps=1", flags=("--overwrite",)) == 2
    assert "notes.txt" in _one_line(capsys) and (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("flags", [["--resume", "--overwrite"]])
def test_resume_and_overwrite_exclude_each_other(tmp_path, flags):
    with pytest.raises(SystemExit) as exited:
        _train(tmp_path / "run", flags=flags)
    assert exited.value.code == 2


def test_a_time_limit_stops_training_after_the_step_that_reaches_it(tmp_path, capsys):
    # 0.0001 min is reached by the first step: the run keeps it, checkpoints, evaluates and stops
    assert _train(tmp_path / "run", "train.steps=5", "train.time_limit_minutes=0.0001") == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped_by"] == "time_limit"
    assert "eval_after" in summary and summary["rl_s"] > 0
    assert latest_valid(tmp_path / "run" / "checkpoints") is not None
    assert "time limit: 0.0001 min of RL reached after step 1" in capsys.readouterr().out
    # the clock is part of the checkpoint: a resume does not get a new hour
    assert _train(tmp_path / "run", "train.steps=6", "train.time_limit_minutes=0.0001", flags=("--resume",)) == 0
    resumed = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert resumed["steps"] == 1 and resumed["stopped_by"] == "time_limit"  # no new step
    clock = json.loads((latest_valid(tmp_path / "run" / "checkpoints").path / "state.json").read_text())["run"]["rl_s"]
    assert clock > 0  # the clock the resumed run went on from (without it, the resume trained a step)
