"""An agent run's config (``agent.function``, ``agent.tasks``): paths stored absolute, so the run's
saved config works from any directory, and the run labelled with its tasks file, not an environment."""

from __future__ import annotations

from pathlib import Path

from streamrl.training.config_files import config_to_yaml, load_config
from streamrl.training.report import write_report

ROOT = Path(__file__).resolve().parents[2]


def _agent_config(function: str = "examples/openai_agent.py:run", tasks: str = "examples/pick_tasks.jsonl"):
    return load_config(overrides=[f"agent.function={function}", f"agent.tasks={tasks}"])


def test_agent_paths_become_absolute_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = _agent_config()
    assert config.agent.function == f"{ROOT / 'examples/openai_agent.py'}:run"
    assert config.agent.tasks == str(ROOT / "examples/pick_tasks.jsonl")
    monkeypatch.setenv("HOME", str(tmp_path))
    home = _agent_config("~/agents/../agent.py:play", "~/tasks.jsonl").agent
    assert (home.function, home.tasks) == (f"{tmp_path / 'agent.py'}:play", str(tmp_path / "tasks.jsonl"))


def test_a_module_spec_stays_as_written():
    assert _agent_config("my_agents.pick:run").agent.function == "my_agents.pick:run"


def test_a_saved_agent_config_loads_the_same_from_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = _agent_config()
    saved = tmp_path / "config.yaml"
    saved.write_text(config_to_yaml(config))
    monkeypatch.chdir(tmp_path)
    again = load_config(saved).agent
    assert (again.function, again.tasks) == (config.agent.function, config.agent.tasks)
    assert Path(again.function.rpartition(":")[0]).is_file() and Path(again.tasks).is_file()


def test_runs_are_labelled_by_their_tasks_file_or_environment():
    assert load_config(overrides=["env.name=webshop_lite"]).task_label() == "webshop_lite"
    assert _agent_config().task_label() == "pick_tasks.jsonl"
    assert load_config(overrides=["agent.external=true", "agent.tasks=/x/jobs.jsonl"]).task_label() == "jobs.jsonl"


def test_an_agent_run_report_names_its_tasks_file(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = _agent_config()
    (tmp_path / "config.yaml").write_text(config_to_yaml(config))
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "success": 0.5}\n')
    index = (write_report(tmp_path, config, {"steps": 2, "trajectories": 16}) / "index.md").read_text()
    assert index.startswith("# spo++ on pick_tasks.jsonl (tiny)")
    assert "trained tiny on pick_tasks.jsonl for 2 steps" in index
    assert "alfworld" not in index


def test_one_reply_cap_for_the_endpoint_and_the_length_normaliser(monkeypatch):
    """``rollout.max_new_tokens`` is a reply's default length; ``agent.max_tokens`` the most an agent
    may ask, and what Dr.GRPO's normaliser assumes of an agent's reply (it assumed 8x less)."""
    from streamrl.training.agent_mode import agent_settings
    from streamrl.training.assemble import update_config

    monkeypatch.chdir(ROOT)
    config = load_config(overrides=["agent.function=examples/openai_agent.py:run", "agent.tasks=examples/pick_tasks.jsonl",
                                    "agent.max_tokens=100", "rollout.max_new_tokens=20"])
    endpoint = agent_settings(config).endpoint()
    assert (endpoint.max_new_tokens, endpoint.max_tokens_cap) == (20, 100)
    assert update_config(config).max_new_tokens == 100 == config.reply_token_cap()
    environment = load_config(overrides=["rollout.max_new_tokens=20"])
    assert update_config(environment).max_new_tokens == 20 == environment.reply_token_cap()
