"""Trajectory records: per-turn views and the JSON round trip."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.policy.scripted import ScriptedEngine
from streamrl.rollout import DispatchRecord, Trajectory, Turn

from .rollout_toys import ToyEnv, play


@settings(max_examples=30, deadline=None)
@given(replies=st.lists(st.sampled_from(["<a>ok</a>", "<a>no</a>", "junk"]), min_size=1, max_size=4),
       turns=st.integers(1, 4), version=st.integers(0, 9))
def test_json_round_trip_is_exact(replies, turns, version):
    queue = iter(replies * 4)
    engine = ScriptedEngine(lambda prompt: next(queue), version=version)
    trajectory = asyncio.run(play(engine, ToyEnv(), f"t:{turns}"))
    trajectory.lag, trajectory.excluded_from_loss = 2, True
    restored = Trajectory.from_dict(json.loads(json.dumps(trajectory.to_dict())))
    assert restored == trajectory
    assert restored.num_action_tokens == sum(len(t.action_ids) for t in trajectory.turns) > 0
    assert restored.invalid_flags == [not t.format_valid for t in trajectory.turns]
    assert restored.turn_versions == [version] * len(trajectory.turns)


def test_dispatch_metadata_round_trips():
    record = DispatchRecord(request_id="r", prompt_id="p", seq=3, policy_version=2, group_id="g", z=0.4,
                            baseline=0.25, extra={"visits": 3}, env_seed=11, dispatched_at=1.5)
    assert DispatchRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_non_json_info_values_are_stringified():
    record = DispatchRecord(request_id="r", prompt_id="p", seq=0, policy_version=0)
    turn = Turn([1], [2], [-0.5], "x", "x", True, True, 0.0, False, "stop", 0, "o", info={"obj": object(), "t": (1, 2)})
    data = json.loads(json.dumps(Trajectory(dispatch=record, layout="per_step", turns=[turn]).to_dict()))
    assert data["turns"][0]["info"]["t"] == [1, 2] and data["turns"][0]["info"]["obj"].startswith("<object")


def test_malformed_dicts_name_the_problem():
    record = DispatchRecord(request_id="r", prompt_id="p", seq=0, policy_version=0)
    data = Trajectory(dispatch=record, layout="full_history").to_dict()
    with pytest.raises(ValueError, match="surprise"):
        Trajectory.from_dict({**data, "surprise": 1})
    with pytest.raises(ValueError, match="dispatch"):
        Trajectory.from_dict({k: v for k, v in data.items() if k != "dispatch"})


def test_turn_refuses_mismatched_logprobs():
    with pytest.raises(ValueError, match="logprobs"):
        Turn([1], [2, 3], [-0.5], "x", "x", True, True, 0.0, False, "stop", 0, "o")


def test_versions_without_turns_fall_back_to_dispatch():
    record = DispatchRecord(request_id="r", prompt_id="p", seq=0, policy_version=5)
    trajectory = Trajectory(dispatch=record, layout="full_history", end_reason="env_error")
    assert trajectory.min_policy_version is None and trajectory.behaviour_version == 5
    assert trajectory.num_action_tokens == 0 and not trajectory.cut
