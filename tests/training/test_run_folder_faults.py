"""Issue 33: a run folder is held by one live process (an OS lock), SIGTERM/SIGINT keep the step under
way in a checkpoint and say how to resume, and a run that failed before its first step leaves a
folder the corrected rerun may use."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from streamrl import cli
from streamrl.training.loggers import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--config", "configs/smoke.yaml", "train.steps=400", "train.checkpoint_every=0", "train.eval_at_start=false",
        "env.eval_tasks=2", "sft.demos=4"]


def _start(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamrl", "train", "--out", str(out), *ARGS, *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_steps(out: Path, steps: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").is_file() and len(read_metrics(out / "metrics.jsonl", "train")) >= steps:
            return
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.2)
    raise AssertionError(f"no {steps} steps within {timeout} s")


def test_a_live_folder_is_refused_and_sigterm_checkpoints_before_exit(tmp_path, capsys):
    sent, status = signal.SIGTERM, 143
    out = tmp_path / "run"
    process = _start(out)
    try:
        _wait_for_steps(out, 2, process)
        for argv in (["train", "--out", str(out), "--resume"], ["train", *ARGS[:2], "--out", str(out), "--overwrite"]):
            assert cli.main(argv) == 2
            assert f"a live training process (pid {process.pid}) is using this run folder" in capsys.readouterr().err
        process.send_signal(sent)
        output = process.communicate(timeout=120)[0]
    finally:
        process.kill()
    assert process.returncode == status, output
    name = signal.Signals(sent).name
    assert f"stopped by {name} after step" in output and f"streamrl train --out {out} --resume" in output
    assert "Traceback" not in output
    stopped_at = read_metrics(out / "metrics.jsonl", "train")[-1]["step"]
    assert (out / "checkpoints" / f"step_{stopped_at:08d}").is_dir()  # the step under way was kept
    # the lock went with the process: the run resumes from that step
    assert cli.main(["train", "--out", str(out), "--resume", "train.steps=" + str(stopped_at + 1)]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == list(range(1, stopped_at + 2))


def test_a_run_that_failed_before_its_first_step_leaves_a_reusable_folder(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()  # what a run that crashed while starting (SFT, the first evaluation) leaves
    (out / "config.yaml").write_text("left by a run that crashed while starting\n")
    (out / "metrics.jsonl").write_text('{"kind": "eval", "step": 0}\n')
    assert cli.main(["train", "--config", "smoke", "--out", str(out), "train.steps=1", "env.eval_tasks=2"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1]
    # but a folder with training steps in it is still protected
    assert cli.main(["train", "--config", "smoke", "--out", str(out), "train.steps=1"]) == 2
    assert "is not empty" in capsys.readouterr().err


def test_a_config_yaml_edited_or_deleted_after_a_checkpoint_is_refused_on_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "--config", "smoke", "--out", str(out), "train.steps=2", "env.eval_tasks=2"]) == 0
    saved = (out / "config.yaml").read_text()
    (out / "config.yaml").write_text(saved.replace("lr: 0.0001", "lr: 0.001"))
    capsys.readouterr()
    assert cli.main(["train", "--out", str(out), "--resume", "train.steps=3"]) == 2
    err = capsys.readouterr().err
    assert "was trained with another configuration than asked: optim.lr 0.0001 -> 0.001" in err
    (out / "config.yaml").unlink()  # deleted: never guessed (the default config would train silently)
    assert cli.main(["train", "--out", str(out), "--resume", "train.steps=3"]) == 2
    assert "config.yaml is missing, and the checkpoints under" in capsys.readouterr().err
    (out / "config.yaml").write_text(saved)  # restored: the resume goes on, with the allowed change
    assert cli.main(["train", "--out", str(out), "--resume", "train.steps=3"]) == 0


def test_sigint_asks_for_a_stop_and_a_second_signal_would_exit_at_once(monkeypatch):
    """The SIGINT path of the test above, in process: the first signal is recorded, the second exits."""
    import asyncio
    import os

    from streamrl.training.signals import GracefulStop

    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)

    async def main():
        async with GracefulStop() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.05)
            assert stop.requested == signal.SIGINT and exits == []
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.05)
        assert exits == [130]

    asyncio.run(main())


def test_a_read_only_out_is_one_line_with_status_2(tmp_path, capsys, monkeypatch):
    # root ignores directory permissions, so the read-only file system is simulated where the OS
    # would answer: creating anything under the folder fails with EROFS
    import errno
    import os

    read_only = tmp_path / "ro"
    real_open = os.open

    def refuse_under_read_only(path, *args, **kwargs):
        if str(path).startswith(str(read_only)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    read_only.mkdir()
    monkeypatch.setattr(os, "open", refuse_under_read_only)
    assert cli.main(["train", "--out", str(read_only / "run"), *ARGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"streamrl train: error: --out {read_only / 'run'}: cannot use it as a run folder (Read-only file system)"]


def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_resume_goes_on(tmp_path, capsys, monkeypatch):
    """torch.save on a full disk raises ``RuntimeError: [enforce fail at inline_container.cc:672]``
    after writing part of the file: the run stops in one line (status 1), the half-written folder is
    removed at the resume, and the resume continues from the previous checkpoint."""
    import torch

    out, real_save, saves = tmp_path / "run", torch.save, []

    def disk_fills_at_the_second_checkpoint(obj, f, *args, **kwargs):
        if str(f).endswith("learner.pt"):
            saves.append(f)
            if len(saves) == 2:
                Path(f).write_bytes(b"\0" * 64)
                raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                                   "data/3: file write failed")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_fills_at_the_second_checkpoint)
    args = ["train", "--config", "smoke", "--out", str(out), "train.steps=3", "train.checkpoint_every=1", "env.eval_tasks=2"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = [line for line in err.splitlines() if line.startswith("streamrl train: error:")]
    assert len(line) == 1 and "the step-2 checkpoint could not be written under" in line[0]
    assert "the previous checkpoint is intact: free space and continue with --resume" in line[0]
    assert list((out / "checkpoints").glob(".tmp-*"))  # what the full disk left
    monkeypatch.setattr(torch, "save", real_save)
    assert cli.main(["train", "--out", str(out), "--resume"]) == 0
    assert not list((out / "checkpoints").glob(".tmp-*"))  # removed at the resume
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1, 2, 3]
