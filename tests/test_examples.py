"""examples/custom_env.py trains from Python, and its environment loads by module:Class from the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(command, cwd):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_custom_environment_example_trains_from_python(tmp_path):
    out = _run([sys.executable, str(ROOT / "examples" / "custom_env.py")], cwd=tmp_path)
    assert "held-out success after 3 steps:" in out
    assert (tmp_path / "runs" / "custom_env" / "final_model" / "config.json").is_file()


def test_the_cli_loads_an_environment_by_module_and_class(tmp_path):
    out = _run([sys.executable, "-m", "streamrl", "train", "--config", "smoke", "--env", "examples.custom_env:EchoEnv",
                "--out", str(tmp_path / "run"), "env.prompt={}", "env.parser={}", "sft.demos=0", "train.steps=1",
                "env.eval_tasks=2"], cwd=ROOT)
    assert "after 1 RL steps" in out
