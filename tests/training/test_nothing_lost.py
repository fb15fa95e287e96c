"""Issue 53: a resume that cannot resume refuses and changes nothing, torn logs are skipped with a
warning (the report of a finished run never crashes), bounded inputs (YAML aliases, tasks files,
``--tasks`` without ``--agent``), an evaluation whose episodes crashed says so, SFT tells its
progress, and ``play`` and ``show`` answer in one line."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest

from streamrl import cli
from streamrl.rollout.events import read_events
from streamrl.training.loggers import read_metrics

SMOKE = ["--config", "smoke", "train.steps=2", "env.eval_tasks=2"]


def _contents(folder: Path) -> dict[str, bytes]:
    """Every file's bytes but the lock's (it holds the pid of whoever holds the folder)."""
    from streamrl.training.run import LOCK_FILE

    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != LOCK_FILE}


def test_a_resume_without_a_usable_checkpoint_refuses_and_changes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *SMOKE, "--out", str(out), "train.checkpoint_every=1", "train.keep_checkpoints=1"]) == 0
    for weights in (out / "checkpoints").rglob("*.safetensors"):  # the only checkpoint left is truncated
        weights.write_bytes(weights.read_bytes()[:100])
    before = _contents(out)
    capsys.readouterr()
    assert cli.main(["train", "--out", str(out), "--resume", "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert "has no usable checkpoint" in err and "metrics.jsonl" in err and "final_model" in err and "--overwrite" in err
    assert len(err.strip().splitlines()) <= 3  # the skipped checkpoint's warning, then one line
    assert _contents(out) == before  # nothing replaced: final_model, metrics, events, samples


def _strip_to(out: Path, keep: set[str]) -> None:
    """Remove every run output of ``out`` but ``keep`` (what a run stopped earlier would have left)."""
    import shutil

    for path in out.iterdir():
        if path.name not in keep | {"config.yaml"}:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def test_a_resume_after_sft_starts_rl_from_the_kept_sft_model(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *SMOKE, "--out", str(out), "train.steps=1"]) == 0
    sft_lines = [line for line in (out / "metrics.jsonl").read_text().splitlines() if '"kind": "sft"' in line]
    _strip_to(out, {"sft_model"})  # stopped after SFT, before its first evaluation
    (out / "metrics.jsonl").write_text("\n".join(sft_lines) + "\n")
    capsys.readouterr()
    assert cli.main(["train", "--out", str(out), "--resume", "train.steps=1"]) == 0
    printed = capsys.readouterr().out
    assert "RL starts from the SFT model kept in" in printed and "SFT: collecting" not in printed
    assert [r["kind"] for r in read_metrics(out / "metrics.jsonl")][: len(sft_lines)] == ["sft"] * len(sft_lines)
    _strip_to(out, set())  # nothing at all yet: a resume simply starts
    assert cli.main(["train", "--out", str(out), "--resume", "train.steps=1"]) == 0
    assert "holds no run output yet; starting from scratch" in capsys.readouterr().out


def test_torn_and_foreign_log_lines_are_skipped_with_one_warning(tmp_path):
    events, metrics = tmp_path / "events.jsonl", tmp_path / "metrics.jsonl"
    events.write_bytes(b'{"seq": 0, "event": "dispatch"}\n\xff\xfe garbage\n{"not": "an event"}\n'
                       b'{"seq": 1, "event": "result"}\n{"seq": 2, "ev')
    metrics.write_bytes(b'{"kind": "train", "step": 1}\n\xff\n[1, 2]\n{"kind": "train", "step": 2}\n{"kind": "tr')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [e["seq"] for e in read_events(events)] == [0, 1]
        assert [r["step"] for r in read_metrics(metrics, "train")] == [1, 2]
    assert len(caught) == 2 and "skipped 3 line(s)" in str(caught[0].message) and "first: line 2" in str(caught[0].message)


def test_a_torn_events_line_does_not_crash_the_report_of_a_finished_run(tmp_path):
    from streamrl.training.config_files import load_config
    from streamrl.training.report import write_report

    out = tmp_path / "run"
    assert cli.main(["train", *SMOKE, "--out", str(out)]) == 0
    with (out / "events.jsonl").open("ab") as log:
        log.write(b"\xff\xfe not an event\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = write_report(out, load_config(out / "config.yaml"))
    assert (report / "index.md").is_file()


BOMB = """env:
  options:
    a: &a [x, x, x, x, x, x, x, x, x, x]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
    h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
"""


def test_a_yaml_alias_bomb_and_an_oversized_config_are_one_line(tmp_path, capsys):
    bomb, big = tmp_path / "bomb.yaml", tmp_path / "big.yaml"
    bomb.write_text(BOMB)  # 10^8 nodes once expanded, from 400 bytes
    big.write_text("# padding\n" * 200_000)
    for path, phrase in ((bomb, "nodes once its aliases are expanded"), (big, "a configuration is at most")):
        assert cli.main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert phrase in err and len(err.strip().splitlines()) == 1
    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("env:\n  options:\n    a: &a [1, *a]\n")
    assert cli.main(["train", "--config", str(recursive), "--out", str(tmp_path / "run")]) == 2
    assert "recursive alias" in capsys.readouterr().err


@pytest.mark.parametrize("content, phrase", [
    (b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "\xff"}\n', ":2 is not UTF-8 text"),
    (b'{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', ":2 repeats id 'a' (first on line 1)"),
], ids=["invalid-utf8", "duplicate-ids"])
def test_a_bad_tasks_file_is_one_line_with_status_2(tmp_path, capsys, content, phrase):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(content)
    code = cli.main(["train", "--config", "smoke", "--agent", "examples/openai_agent.py:run", "--tasks", str(tasks),
                     "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and phrase in err and len(err.strip().splitlines()) == 1


def test_tasks_without_an_agent_is_refused(tmp_path, capsys):
    assert cli.main(["train", "--config", "smoke", "--tasks", "examples/pick_tasks.jsonl", "--out", str(tmp_path / "run")]) == 2
    assert "--tasks examples/pick_tasks.jsonl: goes with --agent" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_an_evaluation_whose_episodes_all_crashed_says_so_with_the_first_error(tmp_path, capsys):
    agent = tmp_path / "wrong.py"
    agent.write_text("async def run(client):\n    return 1.0\n")  # the wrong signature: every episode raises
    code = cli.main(["train", "--config", "smoke", "--agent", f"{agent}:run", "--tasks", "examples/pick_tasks.jsonl",
                     "train.steps=1", "env.eval_tasks=2", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "eval-v0: every episode of the evaluation crashed (agent_error: TypeError" in out
    assert code == 1  # and training, where every episode crashes too, stops in one line


def test_sft_tells_its_progress(monkeypatch):
    from streamrl.training import sft

    monkeypatch.setattr(sft, "PROGRESS_EVERY_S", 0.0)
    from streamrl.policy import load_policy
    from streamrl.rollout.trajectory import DispatchRecord, Trajectory, Turn
    from streamrl.training.config_files import load_config

    config = load_config("configs/smoke.yaml", ["sft.epochs=2", "sft.batch_size=2"])
    policy = load_policy(config.model.spec)
    ids = policy.encode_chat([{"role": "user", "content": "hello"}])
    demos = []
    for n in range(4):
        trajectory = Trajectory(dispatch=DispatchRecord(request_id=f"d{n}", prompt_id=f"p{n}", seq=n, policy_version=0),
                                layout="full_history")
        trajectory.turns.append(Turn(context_ids=list(ids), action_ids=ids[:3], logprobs=[0.0] * 3, action_text="", action="",
                                     format_valid=True, action_effective=True, reward=0.0, done=True, finish_reason="stop",
                                     policy_version=0, observation=""))
        demos.append(trajectory)
    lines: list[str] = []
    sft.behaviour_cloning(config, policy, demos, progress=lines.append)
    assert lines and lines[-1].startswith("SFT: epoch 2/2, batch 4/4, NLL") and "s left" in lines[-1]


def test_play_answers_a_broken_environment_in_one_line(tmp_path, capsys, monkeypatch):
    module = tmp_path / "broken_env.py"
    module.write_text(
        "from streamrl.envs.pick_object import PickObjectEnv\n"
        "from streamrl.envs.tools import tool\n"
        "class Broken(PickObjectEnv):\n"
        "    @tool\n"
        "    def shout(self, word):  # no type hint, no docstring: no schema\n"
        "        return word\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("sys.stdin", io.StringIO("quit\n"))
    assert cli.main(["play", "broken_env:Broken", "--tools"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamrl play: error: ") and "broken_env:Broken" in err and len(err.strip().splitlines()) == 1


def test_a_bare_word_argument_is_the_text_a_person_meant():
    from streamrl.play import typed_message

    schemas = [{"type": "function", "function": {"name": "take", "parameters": {"properties": {"object": {}}}}}]
    message = typed_message("take(object=cup)", schemas)
    assert message.tool_calls[0].arguments == {"object": "cup"}
    assert typed_message("take(cup)", schemas).tool_calls[0].arguments == {"object": "cup"}


def test_show_says_why_a_run_has_no_training_transcripts(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *SMOKE, "--out", str(out)]) == 0  # smoke writes training samples every 10 steps
    capsys.readouterr()
    assert cli.main(["show", str(out), "--kind", "train"]) == 0
    err = capsys.readouterr().err
    assert "logging.samples_every=10" in err and "has taken 2" in err


def test_reports_of_a_one_step_run_draw_markers_and_integer_ticks(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from streamrl.training.report import plot_diagnostics

    drawn: list = []
    original = plt.Figure.savefig

    def keep(figure, *args, **kwargs):
        drawn.append(figure)
        return original(figure, *args, **kwargs)

    plt.Figure.savefig = keep
    try:
        plot_diagnostics([{"step": 1, "loss": 0.5, "entropy": 7.613301, "grad_norm": None}, {"step": 2, "entropy": 7.6133011}],
                         tmp_path / "d.png", "t")
    finally:
        plt.Figure.savefig = original
    axes = [ax for ax in drawn[0].axes if ax.get_title()]
    entropy = next(ax for ax in axes if ax.get_title() == "entropy")
    assert entropy.lines[0].get_marker() == "o"
    drawn[0].canvas.draw()
    assert entropy.yaxis.get_major_formatter().get_offset() == ""  # no "1e-7+7.613301"
    assert all(float(t).is_integer() for t in entropy.get_xticks())
    empty = [ax for ax in axes if not ax.lines]
    assert [ax.get_title() for ax in empty] == ["gradient norm"] and "no data" in empty[0].texts[0].get_text()


@pytest.mark.parametrize("command", ["train", "sft", "eval", "serve"])
def test_a_config_typo_is_answered_before_torch_or_transformers_load(command):
    """Well under a second: the config is checked before anything heavy is imported."""
    import subprocess
    import sys

    probe = ("import sys\nfrom streamrl import cli\n"
             f"code = cli.main([{command!r}, '--config', 'smoke', 'optim.lrr=1'])\n"
             "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.stdout.split() == ["2", "False", "False"], result.stdout + result.stderr
    assert "optim.lrr: unknown field" in result.stderr


def test_a_record_a_full_disk_cuts_short_is_cut_back_and_the_error_names_the_file(tmp_path, monkeypatch):
    import errno
    import os

    from streamrl.rollout import events

    log = events.JsonLines(tmp_path / "metrics.jsonl")
    log.append({"step": 1})
    real_write = os.write

    def half_then_full(fd, data):  # the kernel writes part of a record, then the disk is full
        if len(data) > 10:
            return real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(events.os, "write", half_then_full)
    with pytest.raises(OSError) as full:
        log.append({"step": 2, "loss": 0.123456789})
    monkeypatch.setattr(events.os, "write", real_write)
    assert full.value.errno == errno.ENOSPC and "metrics.jsonl" in str(full.value) and "bytes free" in str(full.value)
    log.append({"step": 3})
    log.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 3}\n'  # whole lines only


def test_a_full_disk_while_logging_checkpoints_the_step_and_stops_in_one_line(tmp_path, capsys, monkeypatch):
    import errno

    from streamrl.rollout import events

    out, real_append = tmp_path / "run", events.JsonLines.append

    def full_at_step_3(self, *records):
        if self.path.name == "metrics.jsonl" and any(r.get("kind") == "train" and r.get("step") == 3 for r in records):
            raise OSError(errno.ENOSPC, f"{self.path}: No space left on device (0 bytes free)")
        return real_append(self, *records)

    monkeypatch.setattr(events.JsonLines, "append", full_at_step_3)
    assert cli.main(["train", *SMOKE, "--out", str(out), "train.steps=5", "train.checkpoint_every=0"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "writing the run's logs failed at step 3" in err and "step 3 is checkpointed" in err
    assert (out / "checkpoints" / "step_00000003").is_dir()  # the 3 steps since the start were kept
    monkeypatch.setattr(events.JsonLines, "append", real_append)
    assert cli.main(["train", "--out", str(out), "--resume"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1, 2, 4, 5]


def test_a_long_evaluation_tells_its_progress():
    from streamrl.rollout.trajectory import DispatchRecord, Trajectory
    from streamrl.training.evaluate import EvalProgress

    lines: list[str] = []
    progress = EvalProgress("eval-v0", 4, lines.append, every_s=0.0)
    for n in range(4):
        trajectory = Trajectory(dispatch=DispatchRecord(request_id=f"e{n}", prompt_id=f"p{n}", seq=n, policy_version=0),
                                layout="full_history")
        trajectory.won = n % 2 == 0
        progress(trajectory)
    assert lines[0].startswith("eval-v0: 1/4 episodes, 1 won, about") and lines[-1].startswith("eval-v0: 3/4 episodes, 2 won")
    assert len(lines) == 3  # the last episode is the result line's to tell
