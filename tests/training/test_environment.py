"""The evaluation's task ids: one split or several, a count of each, from an index on."""

from __future__ import annotations

import pytest

from streamrl.envs import make
from streamrl.training.config import ConfigError
from streamrl.training.config_files import load_config
from streamrl.training.environment import split_task_ids
from streamrl.training.evaluate import eval_task_ids
from streamrl.training.preflight import preflight


def test_several_splits_give_a_count_of_each_from_the_start_index():
    env = make("alfworld_lite")
    ids = split_task_ids(env, "seen+unseen", 64, 64)
    assert len(ids) == len(set(ids)) == 128
    assert ids[0] == "seen/64" and ids[63] == "seen/127" and ids[64] == "unseen/64" and ids[-1] == "unseen/127"
    assert split_task_ids(env, "unseen", 3) == ["unseen/0", "unseen/1", "unseen/2"]
    assert len(split_task_ids(env, "unseen")) == env.split_size("unseen")
    # past the end of a split: what is left of it
    assert split_task_ids(env, "unseen", 10, env.split_size("unseen") - 2) == ["unseen/132", "unseen/133"]


def test_the_config_reaches_the_evaluation_and_bad_splits_are_refused_before_the_run():
    config = load_config(None, ["env.name=alfworld_lite", "env.eval_split=seen+unseen", "env.eval_tasks=2", "env.eval_from=64"])
    assert eval_task_ids(config) == ("seen+unseen", ["seen/64", "seen/65", "unseen/64", "unseen/65"])
    for overrides, named in ((["env.eval_split=seen+valid"], "unknown split 'valid'"),
                             (["env.eval_split=unseen", "env.eval_from=134"], "split 'unseen' has no tasks from index 134")):
        with pytest.raises(ConfigError, match=rf"^env.eval_split: .*{named}"):
            preflight(load_config(None, ["env.name=alfworld_lite", *overrides]), warn=lambda line: None)
