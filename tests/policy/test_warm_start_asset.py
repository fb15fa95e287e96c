"""The shipped warm start is what its build script declares: same files, same config, same room.

``scripts/build_warm_start.py`` writes ``warm_start.json`` next to the policy; these tests re-hash
the shipped files against it, check the record was built from the committed config file, and
that the default run trains in exactly the environment the warm start was cloned in.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from streamrl.policy.errors import PolicyLoadError
from streamrl.policy.loading import WARM_START_MANIFEST, load_policy, shipped_warm_starts
from streamrl.training.config_files import load_config

REPO = Path(__file__).resolve().parents[2]
DEFAULT = "alfworld_lite-tiny"


def _build_script():
    spec = importlib.util.spec_from_file_location("build_warm_start", REPO / "scripts" / "build_warm_start.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(name: str) -> dict:
    return json.loads((shipped_warm_starts()[name] / WARM_START_MANIFEST).read_text())


def test_the_default_warm_start_is_shipped_with_its_record():
    assert DEFAULT in shipped_warm_starts()
    record = _record(DEFAULT)
    assert record["command"].startswith("python scripts/build_warm_start.py")
    assert 0.0 <= record["held_out"]["greedy_success"] <= 1.0


@pytest.mark.parametrize("name", sorted(shipped_warm_starts()))
def test_shipped_files_match_the_recorded_hashes(name):
    folder = shipped_warm_starts()[name]
    record = _record(name)
    shipped = {p.name for p in folder.iterdir() if p.is_file() and p.name != WARM_START_MANIFEST}
    assert shipped == set(record["files"]), "files added or missing since the build"
    for file, digest in record["files"].items():
        assert hashlib.sha256((folder / file).read_bytes()).hexdigest() == digest, f"{file} changed since the build"


@pytest.mark.parametrize("name", sorted(shipped_warm_starts()))
def test_built_from_the_committed_config(name):
    record = _record(name)
    config_file = REPO / record["config_file"]
    assert hashlib.sha256(config_file.read_bytes()).hexdigest() == record["config_sha256"], (
        f"{record['config_file']} changed after the warm start was built: rebuild it ({record['command']})"
    )
    # the build's own command-line overrides (e.g. model.device=cuda) are part of its recipe
    config = load_config(str(config_file), [*_build_script().BUILD_OVERRIDES, *record.get("overrides", [])])
    for section, dumped in record["config"].items():
        current = getattr(config, section).model_dump(mode="json")
        # a field added after the build (with its default) cannot have shaped the asset
        assert {key: current[key] for key in dumped} == dumped, f"{section} differs from the record"


@pytest.mark.parametrize(("run_config", "name"), [("default.yaml", DEFAULT), ("webshop.yaml", "webshop_lite-tiny")])
def test_the_run_trains_where_its_warm_start_was_cloned(run_config, name):
    run = load_config(str(REPO / "configs" / run_config), [])
    assert run.model.init_from == f"warm-start:{name}"
    built = load_config(str(REPO / _record(name)["config_file"]), [])
    assert run.model.overrides == built.model.overrides
    assert run.env.model_dump() == built.env.model_dump()
    assert run.rollout.model_dump() == built.rollout.model_dump()


def test_warm_start_spec_loads_the_shipped_policy():
    policy = load_policy(f"warm-start:{DEFAULT}")
    record = _record(DEFAULT)
    assert policy.model.config.hidden_size == record["config"]["model"]["overrides"]["hidden_size"]
    assert policy.value_token_ids is not None


def test_unknown_warm_start_is_a_one_line_error_naming_the_shipped_ones():
    with pytest.raises(PolicyLoadError, match=f"no shipped warm start 'nope'; shipped: .*{DEFAULT}"):
        load_policy("warm-start:nope")


@pytest.mark.parametrize("name", ["alfworld_lite-smollm2", "alfworld_lite-smollm2-rl"])
def test_a_shipped_adapter_names_no_machine_path_and_sits_on_the_local_base(tmp_path, name):
    import warnings

    folder = shipped_warm_starts()[name]
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] is None
    for file in folder.iterdir():
        if file.name != WARM_START_MANIFEST and file.suffix != ".safetensors":  # the record names its run
            assert "/.cache/" not in file.read_text(), f"{file.name} names a folder of the build machine"
    policy = load_policy(f"warm-start:{name}")
    (adapter,) = policy.model.peft_config.values()
    assert (Path(adapter.base_model_name_or_path) / "config.json").is_file()  # the local converted SmolLM2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # peft warns when the base it names has no config
        policy.save(tmp_path / "saved", tokenizer=False)
