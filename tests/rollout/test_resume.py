"""Checkpoint and resume: buffered trajectories and in-flight requests survive, exactly once."""

from __future__ import annotations

import asyncio
import json

import pytest

from streamrl.policy.scripted import ScriptedEngine
from streamrl.rollout import RolloutError, replay

from .rollout_toys import RecordingSource, learn, make_rollout, ok_policy


def slow_engine() -> ScriptedEngine:
    return ScriptedEngine(ok_policy, latency_s=lambda request, n: 0.002 * (1 + int(request.request_id.split("-")[1].split(":")[0]) % 5))


@pytest.mark.parametrize("mode", ["stream", "group"])
def test_resume_reissues_in_flight_requests_and_delivers_each_once(tmp_path, mode):
    log = tmp_path / "events.jsonl"
    options = dict(mode=mode, concurrency=6, batch_size=4, log=log)
    if mode == "group":
        options["group_size"] = 2
    prompts = [f"t{i}:3" for i in range(8)]
    first_engine = slow_engine()
    first = make_rollout([], engine=first_engine, source=RecordingSource(prompts), **options)

    async def before_crash():
        async with first:
            delivered = await learn(first, first_engine, batches=2)
            for _ in range(5000):  # wait until something is both buffered and in flight
                if first.stats()["in_flight"] and first.stats()["buffered"]:
                    break
                await asyncio.sleep(0.001)
            state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
            await asyncio.sleep(0.05)  # work after the checkpoint is lost in the crash
            await first.next_batch()
        return delivered, state

    delivered, state = asyncio.run(before_crash())
    in_flight = {r["request_id"]: r for r in state["inflight"]}
    assert in_flight

    second_engine = slow_engine()
    second_engine.update_weights({}, state["learner_version"])
    source = RecordingSource(prompts)
    second = make_rollout([], engine=second_engine, source=source, **options)
    second.load_state_dict(state)

    async def after_resume():
        async with second:
            batches = []
            while not set(in_flight) <= {t.request_id for b in batches for t in b}:
                batches += await learn(second, second_engine, batches=1)
            return batches, second.stats()["dispatched"]

    resumed, dispatched_after = asyncio.run(after_resume())
    before_ids = [t.request_id for b in delivered for t in b]
    after = [t for b in resumed for t in b]
    after_ids = [t.request_id for t in after]
    assert len(set(after_ids)) == len(after_ids) and not set(before_ids) & set(after_ids)
    for trajectory in after:
        if trajectory.request_id in in_flight:  # re-issued under its original id and metadata
            assert trajectory.dispatch.to_dict() == in_flight[trajectory.request_id]
        else:
            assert trajectory.dispatch.seq >= state["dispatch_seq"] or trajectory.request_id in _buffered_ids(state)
    assert set(_buffered_ids(state)) <= set(after_ids)
    # the resumed source was asked only about new dispatches, numbered on from the checkpoint
    assert len(source.dispatches) == dispatched_after - state["dispatch_seq"]
    # the log describes what the learner saw, with the crashed run's extra batch rolled back
    assert replay(log) == [[t.request_id for t in b] for b in delivered + resumed]


def _buffered_ids(state) -> list[str]:
    buffer = state["buffer"]
    if "trajectories" in buffer:
        return [t["dispatch"]["request_id"] for t in buffer["trajectories"]]
    return [m["dispatch"]["request_id"] for g in buffer["closed"] + buffer["open"] for m in g["members"]]


def test_state_must_match_the_settings_and_be_loaded_before_start():
    rollout = make_rollout(["t:1"])
    state = rollout.state_dict()
    with pytest.raises(ValueError, match="mode"):
        make_rollout(["t:1"], mode="group", group_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks buffer"):
        make_rollout(["t:1"]).load_state_dict({k: v for k, v in state.items() if k != "buffer"})

    async def main():
        async with rollout:
            rollout.load_state_dict(state)

    with pytest.raises(RolloutError, match="before the rollout starts"):
        asyncio.run(main())
