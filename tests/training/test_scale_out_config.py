"""rollout.backend, rollout.workers and model.engine: defaults, one-line errors naming the field,
exit status 2 from the command line, and the worker spec a configuration gives Ray workers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrl.rollout import LocalBackend
from streamrl.training.backend_choice import rollout_backend, worker_spec
from streamrl.training.config import ConfigError
from streamrl.training.config_files import load_config
from streamrl.training.evaluate import episode_settings


def test_defaults_are_one_process_and_the_hf_engine():
    config = load_config("configs/smoke.yaml")
    assert (config.rollout.backend, config.rollout.workers, config.model.engine) == ("local", 1, "hf")


@pytest.mark.parametrize("override, message", [
    ("rollout.workers=2", "rollout.workers: applies to rollout.backend=ray only (got 2)"),
    ("rollout.backend=slurm", "rollout.backend: Input should be 'local' or 'ray' (got 'slurm')"),
    ("model.engine=vllm", "model.engine: 'vllm' runs on a GPU: set model.device=cuda"),
    ("model.engine=sglang", "model.engine: Input should be 'hf' or 'vllm'"),
])
def test_bad_values_name_their_field(override, message):
    with pytest.raises(ConfigError) as error:
        load_config("configs/smoke.yaml", [override])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_cli_exits_2_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "streamrl", "train", "--config", "configs/smoke.yaml",
                           "rollout.workers=3", "--out", str(tmp_path / "run")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "streamrl train: error: rollout.workers: applies to rollout.backend=ray only (got 3)"]


def test_worker_spec_rebuilds_the_trainers_policy_and_environment():
    config = load_config("configs/smoke.yaml", ["rollout.backend=ray", "rollout.workers=2", "model.lora.r=4"])
    spec = worker_spec(config, episode_settings(config), engine_threads=1)
    assert spec.model["spec"] == "tiny" and spec.model["model_overrides"] == config.model.overrides
    assert "lora" not in spec.model  # the trainer sends merged weights
    assert (spec.env, spec.parser_options, spec.prompt_options) == ("alfworld_lite", config.env.parser, config.env.prompt)
    assert spec.episode == episode_settings(config) and spec.engine == "hf" and spec.worker_gpus == 0.0
    env = spec.make_env()
    assert env.spec.name == "alfworld_lite"
    env.close()


def test_local_backend_plays_on_the_trainers_engine():
    config = load_config("configs/smoke.yaml")
    backend = rollout_backend(config, episode_settings(config), _Versioned(3), _Codec(), engine_threads=1)
    assert isinstance(backend, LocalBackend) and backend.version == 3


class _Versioned:
    def __init__(self, version):
        self.version = version


class _Codec:
    end_of_turn_id = 0

    def state_dict_for_engine(self):
        return {}
