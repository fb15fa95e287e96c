"""``streamrl eval --model RUN`` of an agent run, from another directory: the run's saved config
still finds the agent and its tasks, and the evaluation folder is named by the tasks file."""

from __future__ import annotations

from pathlib import Path

import streamrl.api
from streamrl import cli
from streamrl.training.config_files import config_to_yaml, load_config
from streamrl.training.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]


def test_an_agent_run_evaluates_from_elsewhere_into_a_folder_named_by_its_tasks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    config = load_config(overrides=["agent.function=examples/openai_agent.py:run", "agent.tasks=examples/pick_tasks.jsonl"])
    run = tmp_path / "run"
    (run / "final_model").mkdir(parents=True)
    (run / "final_model" / "config.json").write_text("{}")
    (run / "config.yaml").write_text(config_to_yaml(config))
    seen = {}

    def fake_evaluate(config, model, out):  # what the real one does first, without playing any episode
        preflight(config)
        seen["out"] = out
        return {"model": model, "split": "test", "episodes": 0, "success": 0.0, "score": 0.0, "policy_version": 0}

    monkeypatch.setattr(streamrl.api, "evaluate", fake_evaluate)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["eval", "--model", str(run)]) == 0, capsys.readouterr().err
    assert seen["out"] == run / "eval-pick_tasks.jsonl-test"
