"""examples/custom_env.py trains from Python, and its environment loads by module:Class from the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(command, cwd):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_custom_environment_example_trains_from_python(tmp_path):
    out = _run([sys.executable, str(ROOT / "examples" / "custom_env.py")], cwd=tmp_path)
    assert "held-out success after 3 steps:" in out
    assert (tmp_path / "runs" / "custom_env" / "final_model" / "config.json").is_file()


@pytest.mark.parametrize("form", [[], ["env.tools=true"]], ids=["text", "tools"])
def test_the_cli_trains_the_example_environment_with_its_documented_command(tmp_path, form):
    """The module docstring's command, with nothing else than a shorter run."""
    run = tmp_path / "run"
    out = _run([sys.executable, "-m", "streamrl", "train", "--config", "smoke", "--env", "examples.custom_env:EchoEnv",
                *form, "train.steps=1", "--out", str(run)], cwd=ROOT)
    assert "after 1 RL steps" in out
    turns = [turn for line in (run / "samples.jsonl").read_text().splitlines() for turn in json.loads(line)["turns"]]
    # the tool form records each turn's parsed calls (a list, maybe empty) and the messages that answered it
    assert turns and all((turn["tool_calls"] is not None) == bool(form) for turn in turns)
    assert all((turn["reply"] is not None) == bool(form) for turn in turns)


def test_the_math_tools_config_records_tool_calls_and_tool_results(tmp_path):
    """configs/math_tools.yaml, cut short: every transcript turn carries the parsed calls and the
    messages that answered them (tool results, or the user message after a turn without a call)."""
    run = tmp_path / "run"
    _run([sys.executable, "-m", "streamrl", "train", "--config", "configs/math_tools.yaml", "--out", str(run),
          "train.steps=1", "sft.demos=16", "sft.epochs=1", "env.eval_tasks=2", "rollout.concurrency=4"], cwd=ROOT)
    turns = [turn for line in (run / "samples.jsonl").read_text().splitlines() for turn in json.loads(line)["turns"]]
    assert turns and all(isinstance(turn["tool_calls"], list) and turn["reply"] for turn in turns)
    for turn in turns:
        roles = {message["role"] for message in turn["reply"]}
        assert roles == ({"tool"} if turn["tool_calls"] else {"user"})
    shown = _run([sys.executable, "-m", "streamrl", "show", str(run), "--last", "1"], cwd=ROOT)
    assert "[turn 1] model" in shown and "Call the python tool" in shown


def test_the_openai_agent_example_trains_through_the_endpoint(tmp_path):
    """docs/agents.md's command, cut short: the sessions are in events.jsonl and samples.jsonl."""
    run = tmp_path / "run"
    out = _run([sys.executable, "-m", "streamrl", "train", "--config", "smoke", "--agent", "examples/openai_agent.py:run",
                "--tasks", "examples/pick_tasks.jsonl", "train.steps=2", "env.eval_tasks=4", "--out", str(run)], cwd=ROOT)
    assert "after 2 RL steps" in out
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    results = [e for e in events if e["event"] == "result"]
    assert len(results) >= 16 and all(e["prompt_id"].startswith("train/") for e in results)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    evaluated = [s for s in samples if s["kind"] == "eval"]
    assert len(evaluated) == 8 and all(s["task_id"].startswith("test/") for s in evaluated)
    assert all(turn["action_text"] is not None for s in samples for turn in s["turns"])


def test_a_langgraph_agent_trains_through_the_endpoint(tmp_path):
    """A framework nobody here wrote drives the endpoint: LangGraph's ReAct agent over ChatOpenAI."""
    run = tmp_path / "run"
    out = _run([sys.executable, "-m", "streamrl", "train", "--config", "smoke", "--agent", "examples/langgraph_agent.py:run",
                "--tasks", "examples/pick_tasks.jsonl", "train.steps=2", "env.eval_tasks=4", "--out", str(run)], cwd=ROOT)
    assert "after 2 RL steps" in out
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["end_reason"] in ("terminated", "agent_error") for s in samples)
    assert sum(s["end_reason"] == "terminated" for s in samples) >= len(samples) // 2
