"""Issue 13: the package works outside the clone. A wheel built from this tree, installed
non-editable into a fresh virtual environment (dependencies borrowed from the test's own
environment, never downloaded), runs ``streamrl train --config smoke`` from a foreign folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*command, cwd=None):
    result = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_built_wheel_trains_the_shipped_smoke_config_outside_the_clone(tmp_path):
    source = tmp_path / "source"  # build from a copy: nothing is written into the checkout
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist", source)
    wheel = next((tmp_path / "dist").glob("streamrl-*.whl"))

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co., not streamrl
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _run(venv / "bin" / "streamrl", "--version", cwd=elsewhere).strip().startswith("streamrl ")
    location = _run(python, "-c", "import streamrl; print(streamrl.__file__)", cwd=elsewhere)
    assert str(site) in location, location
    out = _run(venv / "bin" / "streamrl", "train", "--config", "smoke", "--out", "run", "train.steps=1",
               "sft.demos=4", "env.eval_tasks=2", cwd=elsewhere)
    assert "after 1 RL steps" in out
    saved = (elsewhere / "run" / "config.yaml").read_text()
    assert "lr: 0.0001" in saved  # the shipped smoke config, not the built-in defaults
