"""Issue 13's audit: every bad input is one line on stderr naming what is wrong, no traceback, exit
status 2, before any work (no model is loaded for any of these)."""

from __future__ import annotations

import typing

import pytest

from streamrl import cli
from streamrl.policy.loading import DTYPE_NAMES
from streamrl.training.config import ModelConfig
from streamrl.training.config_files import config_to_yaml, load_config

SMOKE = ["--config", "configs/smoke.yaml"]


def _files(tmp_path):
    (tmp_path / "bad.yaml").write_text("train:\n  steps: [1,\n")
    (tmp_path / "demos.jsonl").write_text('{"task_id": "train/0", "actions": []}\nnot json\n')
    (tmp_path / "nonempty").mkdir()
    (tmp_path / "nonempty" / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "config.yaml").write_text(config_to_yaml(load_config("configs/smoke.yaml")))
    (tmp_path / "cmp.yaml").write_text("name: c\nbase: [configs/smoke.yaml]\nseeds: [0]\n"
                                       "arms: {a: {algo: spo++}, b: {algo: spo}}\n")
    return tmp_path


CASES = {  # name -> (argv with {tmp} for the temporary folder, text the line must contain)
    "env option": (["train", *SMOKE, "env.options.nonsense=3"], "env.options: got an unexpected keyword argument 'nonsense'"),
    "env option value": (["train", *SMOKE, "env.options.max_steps=0"], "env.options:"),
    "parser option": (["train", *SMOKE, "env.parser.nonsense=1"], "env.parser:"),
    "prompt option": (["train", *SMOKE, "env.prompt.nonsense=1"], "env.prompt:"),
    "eval split": (["eval", *SMOKE, "--split", "bogus"], "env.eval_split: alfworld_lite: unknown split 'bogus'"),
    "eval env/parser mismatch": (["eval", *SMOKE, "--env", "guess_number", "env.parser.require_think=true"],
                                 "env.parser:"),
    "unknown env": (["train", *SMOKE, "--env", "alfworld_lit"], "did you mean 'alfworld_lite'"),
    "unknown env module": (["train", *SMOKE, "--env", "no_such_module:Env"], "env.name: cannot load environment"),
    "env class without roles": (["train", *SMOKE, "--env", "streamrl.envs.base:Env"], "env.name:"),
    "play task id": (["play", "alfworld_lite", "--task-id", "bogus"], "--task-id: alfworld_lite: bad task_id 'bogus'"),
    "play option": (["play", "alfworld_lite", "--option", "nonsense=1"], "--option:"),
    "play alfworld_real without data": (["play", "alfworld_real"], "alfworld"),
    "wandb missing": (["train", *SMOKE, "logging.wandb_project=x"], "logging.wandb_project: wandb is not installed"),
    "mlflow missing": (["train", *SMOKE, "logging.mlflow_experiment=x"], "logging.mlflow_experiment: mlflow is not installed"),
    "sft source bad line": (["sft", *SMOKE, "--out", "{tmp}/sft", "sft.source={tmp}/demos.jsonl"], "demos.jsonl:2"),
    "sft source missing file": (["sft", *SMOKE, "--out", "{tmp}/sft", "sft.source={tmp}/none.jsonl"], "sft.source:"),
    "sft without expert": (["sft", *SMOKE, "--out", "{tmp}/sft", "--env", "guess_number", "sft.source=expert"],
                           "sft.source: environment guess_number has no expert"),
    "sft in an env without the config's expert": (["sft", *SMOKE, "--out", "{tmp}/sft", "--env", "guess_number"],
                                                  "sft.source: environment guess_number has no searching expert"),
    "sft of nothing": (["sft", *SMOKE, "--out", "{tmp}/sft", "sft.demos=0"], "sft.demos: is 0"),
    "search expert elsewhere": (["train", *SMOKE, "--env", "guess_number", "sft.source=search_expert"],
                                "sft.source: environment guess_number has no searching expert"),
    "dtype": (["train", *SMOKE, "model.dtype=int8"], "model.dtype"),
    "chat template": (["train", *SMOKE, "model.chat_template={tmp}/none.jinja"], "model.chat_template: chat template"),
    "tool format": (["train", *SMOKE, "model.tool_format=xml"], "model.tool_format: unknown format 'xml'"),
    "device": (["train", *SMOKE, "model.device=cuda:7"], "model.device"),
    "model folder": (["train", *SMOKE, "--model", "{tmp}/no_model"], "model.spec: no model folder"),
    "init_from folder": (["train", *SMOKE, "model.init_from={tmp}/no_model"], "model.init_from"),
    "eval model folder": (["eval", *SMOKE, "--model", "{tmp}/no_model"], "no model folder"),
    "yaml names the file": (["train", "--config", "{tmp}/bad.yaml"], "bad.yaml:3:"),
    "config file missing": (["train", "--config", "{tmp}/none.yaml"], "config file not found"),
    "override syntax": (["train", *SMOKE, "train.steps"], "must look like section.field=value"),
    "override value": (["train", *SMOKE, "train.steps=-1"], "train.steps"),
    "unknown field": (["train", *SMOKE, "train.stepz=1"], "train.stepz: unknown field"),
    "non-empty out": (["train", *SMOKE, "--out", "{tmp}/nonempty"], "is not empty"),
    "resume mismatch": (["train", *SMOKE, "--out", "{tmp}/saved", "--resume", "--algo", "grpo", "algo.group_size=2"],
                        "--resume: "),
    "resume of nothing": (["train", *SMOKE, "--out", "{tmp}/none", "--resume"], "--resume: {tmp}/none holds no folder to resume"),
    "resume of a folder without a run": (["train", *SMOKE, "--out", "{tmp}/nonempty", "--resume"], "holds no run (no config.yaml)"),
    "agent without tasks": (["train", *SMOKE, "--agent", "examples/openai_agent.py:run"], "agent.tasks (--tasks) goes with"),
    "agent file missing": (["train", *SMOKE, "--agent", "{tmp}/none.py:run", "--tasks", "examples/pick_tasks.jsonl"],
                           "agent.function: no file"),
    "agent not async": (["train", *SMOKE, "--agent", "json:dumps", "--tasks", "examples/pick_tasks.jsonl"],
                        "has no async function 'dumps'"),
    "agent tasks bad line": (["train", *SMOKE, "--agent", "examples/openai_agent.py:run", "--tasks", "{tmp}/demos.jsonl"],
                             "demos.jsonl:2 is not JSON"),
    "external agents on ray": (["serve", *SMOKE, "--train", "--tasks", "examples/pick_tasks.jsonl", "rollout.backend=ray"],
                               "rollout.backend: agents elsewhere claim tasks from the trainer's endpoint"),
    "serve elsewhere without token": (["serve", *SMOKE, "--host", "0.0.0.0"], "--host 0.0.0.0: serving beyond"),
    "config not text": (["train", "--config", "/bin/ls"], "config file /bin/ls is not a text (YAML) file"),
    "seed too big": (["train", *SMOKE, "train.seed=1180591620717411303424"], "train.seed"),
    "context too small": (["train", *SMOKE, "rollout.max_context_tokens=16"], "rollout.max_context_tokens: must exceed"),
    "new tokens beyond the context": (["train", *SMOKE, "rollout.max_new_tokens=100000"],
                                      "rollout.max_context_tokens: must exceed rollout.max_new_tokens (100000)"),
    "threads beyond the cores": (["train", *SMOKE, "model.threads=1000"], "model.threads: 1000 is more than the"),
    "out is a file": (["train", *SMOKE, "--out", "{tmp}/bad.yaml"], "cannot use it as a run folder"),
    "out under a file": (["train", *SMOKE, "--out", "{tmp}/bad.yaml/sub"], "cannot use it as a run folder"),
    "out path too long": (["train", *SMOKE, "--out", "{tmp}/" + "x" * 300], "cannot use it as a run folder"),
    "compare configs": (["compare", "--config", "a.yaml", "--config", "b.yaml"], "--config: compare takes one"),
    "compare missing file": (["compare", "--config", "{tmp}/none.yaml"], "comparison file not found"),
    "compare env": (["compare", "--config", "{tmp}/cmp.yaml", "--out", "{tmp}/c", "--env", "nope"], "env.name"),
    "compare model": (["compare", "--config", "{tmp}/cmp.yaml", "--out", "{tmp}/c", "--model", "{tmp}/m"], "model.spec"),
    "compare arm": (["compare", "--config", "{tmp}/cmp.yaml", "--out", "{tmp}/c", "env.options.nonsense=1"],
                    "env.options"),
    "show missing run": (["show", "{tmp}/none"], "RUN: no run folder at"),
    "show without transcripts": (["show", "{tmp}/nonempty"], "samples.jsonl does not exist"),
    "export missing model": (["export", "{tmp}/none", "--out", "{tmp}/o"], "no model folder"),
    "export folder without a model": (["export", "{tmp}/nonempty", "--out", "{tmp}/o"], "RUN_OR_MODEL: "),
    "export non-empty out": (["export", "tiny", "--out", "{tmp}/nonempty"], "--out: "),
    "play model missing": (["play", "guess_number", "--model", "{tmp}/none"], "no model folder"),
    "play model option": (["play", "alfworld_lite", "--model", "tiny", "--option", "nonsense=1"], "env.options:"),
    "play model override": (["play", "alfworld_lite", "--model", "tiny", "rollout.max_turns=0"], "rollout.max_turns"),
    "play config without model": (["play", "guess_number", "--config", "smoke"], "--config: only used with --model"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_with_status_2(name, tmp_path, capsys):
    argv, expected = CASES[name]
    folder = _files(tmp_path)
    argv = [arg.replace("{tmp}", str(folder)) for arg in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if not line.startswith(("streamrl: warning:", "streamrl: note:"))]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("streamrl "), err
    if expected:
        assert expected.replace("{tmp}", str(folder)) in lines[0], err


def test_every_dtype_the_loader_accepts_is_configurable():
    assert set(typing.get_args(ModelConfig.model_fields["dtype"].annotation)) == set(DTYPE_NAMES)
    assert load_config("configs/smoke.yaml", ["model.dtype=bf16"]).model.dtype == "bf16"


def test_missing_tensorboard_is_said_in_one_warning(capsys, monkeypatch):
    import importlib.util

    from streamrl.training.preflight import preflight

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    warnings = []
    preflight(load_config("configs/smoke.yaml", ["logging.tensorboard=true"]), warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith("logging.tensorboard: tensorboard is not installed")
    preflight(load_config("configs/smoke.yaml"), warn=warnings.append)  # not asked for: nothing to say
    assert len(warnings) == 1
