"""Configuration: YAML + dotted overrides, algorithm sections, one-line errors naming the field."""

from __future__ import annotations

import pytest

from streamrl.training.algo_config import GRPOConfig, SAPOConfig, SPOConfig, SPOPlusPlusConfig
from streamrl.training.config import ALGORITHMS, ConfigError
from streamrl.training.config_files import config_to_yaml, load_config


def test_defaults_follow_the_spec_per_algorithm():
    spopp = load_config(algo="spo++").algo
    assert isinstance(spopp, SPOPlusPlusConfig)
    assert (spopp.dual_clip, spopp.tis_cap, spopp.norm_measure, spopp.retention) == (2.0, 2.0, "token", 0.875)
    spo = load_config(algo="spo").algo
    assert isinstance(spo, SPOConfig)
    assert (spo.dual_clip, spo.norm_measure, spo.rho_min, spo.rho_max, spo.d_half) == (10.0, "traj", 0.875, 0.96, 0.06)
    sapo = load_config(algo="sapo").algo
    assert isinstance(sapo, SAPOConfig)
    assert (sapo.kl_coef, sapo.value_coef, sapo.q_coef, sapo.gamma, sapo.lam) == (0.01, 0.5, 0.5, 0.99, 0.95)
    grpo = load_config(algo="grpo").algo
    assert isinstance(grpo, GRPOConfig) and grpo.group_size == 8 and grpo.clip_high == 0.2


def test_yaml_files_merge_and_overrides_win(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("train: {steps: 5, batch_size: 16}\nalgo: {name: spo, dual_clip: 4}\n")
    extra = tmp_path / "extra.yaml"
    extra.write_text("train: {steps: 7}\n")
    config = load_config([base, extra], ["optim.lr=3e-4", "env.options={max_receptacles: 6}"])
    assert config.train.steps == 7 and config.train.batch_size == 16
    assert config.algo.name == "spo" and config.algo.dual_clip == 4
    assert config.optim.lr == pytest.approx(3e-4)
    assert config.env.options == {"max_receptacles": 6}


def test_algo_switch_keeps_shared_fields_and_drops_foreign_ones(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo: {name: spo++, clip_low: 0.1, memory: receipt}\n")
    config = load_config(path, algo="sapo")
    assert config.algo.name == "sapo" and config.algo.clip_low == 0.1
    assert not hasattr(config.algo, "memory")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algo.dual_clip=1.0"], "algo.dual_clip: must be > 1"),
        (["rollout.layout=sideways"], "rollout.layout: Input should be 'per_step' or 'full_history'"),
        (["train.stepz=3"], "train.stepz: unknown field"),
        (["algo.name=foo"], "'spo', 'spo++', 'grpo', 'ppo', 'sapo'"),
        (["optim.lr=-1"], "optim.lr: Input should be greater than 0"),
        (["train.steps"], "must look like section.field=value"),
        (["model.spec=smollm2-135m", "model.entity_tokens=true"], "model.entity_tokens: applies to spec 'tiny'"),
    ],
)
def test_bad_values_name_the_field_and_the_allowed_values(overrides, expected):
    with pytest.raises(ConfigError) as error:
        load_config(overrides=overrides)
    assert expected in str(error.value)
    assert "\n" not in str(error.value)


def test_group_size_must_divide_the_batch():
    with pytest.raises(ConfigError, match=r"train.batch_size \(12\) must be a multiple of algo.group_size \(8\)"):
        load_config(overrides=["train.batch_size=12"], algo="grpo")


def test_unknown_algorithm_and_missing_file_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="allowed: spo, spo"):
        load_config(algo="a2c")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_round_trip_through_yaml(tmp_path):
    for name in ALGORITHMS:
        config = load_config(algo=name, overrides=["train.batch_size=16"])
        path = tmp_path / f"{name}.yaml"
        path.write_text(config_to_yaml(config))
        assert load_config(path) == config


def test_the_algorithm_table_names_each_algorithm_once():
    from streamrl.training.algo_config import ALGORITHM_TABLE
    from streamrl.training.algorithms import algorithm_class
    from streamrl.training.algorithms.base import Algorithm

    assert ALGORITHMS == tuple(ALGORITHM_TABLE)[:5] == ("spo", "spo++", "grpo", "ppo", "sapo")  # then any registered
    members = [name for name in dir(Algorithm) if not name.startswith("_")] + list(Algorithm.__annotations__)
    for name in ALGORITHMS:
        section = ALGORITHM_TABLE[name][0]
        assert type(load_config(algo=name).algo) is section
        cls = algorithm_class(name)
        # class attributes, or set per instance from the config section
        assert all(hasattr(cls, member) or member in ("group_size", "critic", "warm_start") for member in members), name


def test_entity_tokens_come_from_the_environment_for_a_fresh_tiny_model_only():
    from streamrl.training.run import policy_source

    config = load_config(overrides=["env.name=webshop_lite", "model.entity_tokens=true"])
    tokens = policy_source(config)["entity_tokens"]
    assert len(tokens) == 3900 and all(t.startswith("b0") and t == t.lower() for t in tokens)
    assert policy_source(load_config(overrides=["env.name=webshop_lite"]))["entity_tokens"] == ()
    # a saved model keeps the tokenizer it was trained with
    assert policy_source(load_config(overrides=["env.name=webshop_lite", "model.entity_tokens=true",
                                                "model.init_from=runs/x/final_model"]))["entity_tokens"] == ()
