"""Issue 38: the first hour of a new user. Switching model or environment from any config does what
it says; overrides go anywhere; ``eval`` takes run folders and writes transcripts; a run that cannot
learn says so; the report shows the training diagnostics; small things (``~``, colons, file modes)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from streamrl import cli, commands
from streamrl.training.config_files import load_config
from streamrl.training.progress import StallWatch
from streamrl.training.report import wilson_interval

QUICK = ["train.steps=2", "train.batch_size=4", "rollout.concurrency=4", "env.eval_tasks=4", "logging.progress=true"]


# -- switching ----------------------------------------------------------------------------------

@pytest.mark.parametrize("config", ["configs/default.yaml", "configs/smoke.yaml"])
def test_a_model_given_by_the_user_replaces_the_configs_whole_model_choice(config):
    notes = []
    chosen = load_config(config, ["model.spec=smollm2-135m"], note=notes.append).model
    assert chosen.spec == "smollm2-135m" and chosen.init_from is None and chosen.overrides == {}
    assert notes and all(note.startswith("model.spec=smollm2-135m: ") for note in notes)
    # what the user sets beside it is kept
    kept = load_config(config, ["model.spec=smollm2-135m", "model.overrides={num_hidden_layers: 2}"], note=notes.append)
    assert kept.model.overrides == {"num_hidden_layers": 2}
    assert load_config(config, ["model.spec=tiny"], note=notes.append).model == load_config(config).model  # the same model


def test_an_environment_given_by_the_user_gets_its_own_defaults_on_any_config():
    from streamrl.training.preflight import preflight

    notes = []
    config = load_config("configs/default.yaml", ["env.name=math_tir"], note=notes.append)
    preflight(config, warn=notes.append)  # no conflict left to find
    assert config.env.options == {} and config.model.init_from is None
    assert any("warm-start:alfworld_lite-tiny" in note for note in notes)


# -- the stall warning --------------------------------------------------------------------------

def test_the_stall_warning_comes_once_after_five_steps_without_signal():
    watch = StallWatch(steps=5)
    said = [watch.update(step, {"frac_zero_adv": 1.0, "success": 0.5}) for step in range(1, 9)]
    assert said[:4] == [None] * 4 and said[5:] == [None] * 3
    assert said[4].startswith("steps 1-5: every advantage is 0, so the policy is not changing")
    failing = StallWatch(steps=3)
    said = [failing.update(step, {"frac_zero_adv": 0.0, "success": 0.0}) for step in range(1, 5)]
    assert said[2] == ("steps 1-3: no episode succeeded, so there is no success to learn from; start from a warm "
                       "start (model.init_from, sft.demos) or an easier task split")
    other = StallWatch(steps=2)
    metrics = [{"actor_skipped": 1.0}, {"frac_zero_adv": 0.5, "success": 0.2}, {"actor_skipped": 1.0}]
    assert [other.update(s, m) for s, m in enumerate(metrics, 1)] == [None] * 3


def test_wilson_interval():
    low, high = wilson_interval(0, 20)
    assert low == 0.0 and 0.15 < high < 0.17
    low, high = wilson_interval(10, 20)
    assert low == pytest.approx(0.299, abs=1e-3) and high == pytest.approx(0.701, abs=1e-3)


def test_a_run_that_cannot_learn_says_so_and_its_report_shows_why(tmp_path, capsys):
    run = tmp_path / "run"
    # a random tiny model never picks the target in time: every episode fails, every advantage is 0
    argv = ["train", "--config", "smoke", "--env", "pick_object", "--out", str(run), "sft.demos=0",
            "train.steps=6", "train.batch_size=4", "rollout.concurrency=4", "env.eval_tasks=4", "logging.progress=true"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "model: tiny (" in out.splitlines()[0] and "from its own weights" in out.splitlines()[0]
    assert "warning: steps 1-5: " in out
    assert "ETA " in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["warnings"][0].startswith("steps 1-5:")
    assert summary["wall_s"] > 0 and summary["processor"] and summary["model"]["spec"] == "tiny"
    assert summary["model"]["parameters"] > 0
    index = (run / "report" / "index.md").read_text()
    assert "**warning**: steps 1-5" in index and "95% intervals" in index
    assert "![diagnostics](diagnostics.png)" in index and "- **entropy**:" in index
    assert (run / "report" / "diagnostics.png").stat().st_size > 10_000
    # the run's weights are readable by others, as the umask says
    assert stat.S_IMODE((run / "final_model" / "model.safetensors").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- the command line ---------------------------------------------------------------------------

def test_overrides_go_on_either_side_of_options_and_eval_takes_the_run_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main(["train", "--config", "smoke", "train.steps=1", "--out", "~/run", "env.eval_tasks=2",
                     "train.batch_size=4", "rollout.concurrency=4"]) == 0
    run = tmp_path / "run"  # ~ expanded
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
    capsys.readouterr()
    assert cli.main(["eval", "--config", "smoke", "--model", str(run), "--tasks", "2", "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    assert f"| task type | {run} |" in out  # the table names the model evaluated
    record = json.loads((tmp_path / "e.json").read_text())
    assert 0.0 <= record["score"] <= 1.0 and record["score"] == pytest.approx(record["success"])  # one scale
    folder = run / "eval-alfworld_lite-unseen"
    assert len((folder / "samples.jsonl").read_text().splitlines()) == 2
    assert (folder / "samples.md").read_text().startswith("# Transcripts: eval ")


def test_the_default_run_folder_of_a_module_environment_has_no_colon(monkeypatch, tmp_path):
    import argparse

    config = load_config("configs/smoke.yaml", ["env.name=examples.custom_env:EchoEnv"], note=lambda _: None)
    folder = commands._out_dir(argparse.Namespace(out=None), config)
    assert ":" not in str(folder) and folder.name == "spo++-examples.custom_env-EchoEnv"


def test_run_configs_build_on_an_environment_neutral_base(tmp_path):
    from streamrl.training.config import ConfigError

    for name in ("default", "webshop", "math_tools", "math_smollm2"):
        assert load_config(f"configs/{name}.yaml").rollout.max_staleness == 1  # from configs/base.yaml
    (tmp_path / "mine.yaml").write_text("base: [base, extra.yaml]\ntrain: {steps: 7}\n")
    (tmp_path / "extra.yaml").write_text("train: {steps: 3, batch_size: 4}\n")
    mine = load_config(tmp_path / "mine.yaml")
    assert (mine.train.steps, mine.train.batch_size, mine.algo.name) == (7, 4, "spo++")  # later wins
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="base: loops back"):
        load_config(tmp_path / "a.yaml")


def test_the_progress_line_says_when_episodes_crash():
    from streamrl.training.progress import Progress

    lines = []
    progress = Progress(2, echo=lines.append)
    progress.update(1, {"success": 0.5, "crashed_frac": 0.25, "trajectories": 4})
    progress.update(2, {"success": 0.5, "trajectories": 4})
    assert "| crashed 25%" in lines[0] and "crashed" not in lines[1]
