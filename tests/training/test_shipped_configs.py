"""Every configuration file the repository ships validates, so a user's first command does not fail on it."""

from pathlib import Path

import pytest

from streamrl.training.compare import load_compare_config
from streamrl.training.config_files import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_run_config_validates(path):
    config = load_config([str(path)], [])
    assert config.train.steps >= 1


@pytest.mark.parametrize("path", sorted((CONFIGS / "compare").glob("*.yaml")), ids=lambda p: p.name)
def test_every_arm_of_a_comparison_validates(path, monkeypatch):
    monkeypatch.chdir(CONFIGS.parent)  # comparison files name their base configs from the repository root
    spec = load_compare_config(path)
    for arm in spec.arms.values():
        config = load_config(spec.base, [*spec.overrides, *arm.overrides], algo=arm.algo)
        assert config.algo.name == arm.algo
