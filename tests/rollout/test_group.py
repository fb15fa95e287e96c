"""Group-synchronous mode (GRPO): the barrier, synchronous admission and group timeouts."""

from __future__ import annotations

import asyncio

import pytest

from streamrl.policy.scripted import ScriptedEngine
from streamrl.rollout import RolloutStalledError, read_events

from .rollout_toys import learn, make_rollout, ok_policy


def test_groups_are_delivered_whole_and_synchronously(tmp_path):
    log = tmp_path / "events.jsonl"
    codec = ScriptedEngine(ok_policy).codec

    def latency(request, n):  # one prompt is much slower; its group holds the barrier
        return 0.05 if "slow" in codec.decode(request.prompt_ids) else 0.001

    engine = ScriptedEngine(ok_policy, latency_s=latency)
    rollout = make_rollout(["slow:2", "a:2", "b:2", "c:1"], engine=engine, log=log, mode="group", group_size=3,
                           batch_size=6, concurrency=6, max_staleness=0)

    async def main():
        async with rollout:
            return await learn(rollout, engine, batches=4)

    batches = asyncio.run(main())
    events = read_events(log)
    seq_of_result = {e["request_id"]: e["seq"] for e in events if e["event"] == "result"}
    delivers = [e for e in events if e["event"] == "deliver"]
    for batch, deliver in zip(batches, delivers):
        assert len(batch) == 6
        groups = [batch[:3], batch[3:]]  # members of a group are contiguous
        for group in groups:
            assert len({t.group_id for t in group}) == 1 and len({t.prompt_id for t in group}) == 1
            assert len({t.dispatch.env_seed for t in group}) == 1  # same task, same initial state
            assert not any(t.partial_group for t in group)
        assert groups[0][0].group_id != groups[1][0].group_id
        # the barrier: every member finished before the batch was handed over
        assert all(seq_of_result[t.request_id] < deliver["seq"] for t in batch)
        assert all(t.lag == 0 and not t.excluded_from_loss for t in batch)
    # synchronous: each batch is dispatched only after the previous one was published
    for event in (e for e in events if e["event"] == "dispatch"):
        assert event["dispatch_seq"] // 6 == event["learner_version"]


def test_a_group_timeout_delivers_a_partial_group_and_discards_stragglers(tmp_path):
    log = tmp_path / "events.jsonl"
    # the third member of every group is slow (request ids "req-<seq>:<turn>")
    engine = ScriptedEngine(ok_policy, latency_s=lambda r, n: 5.0 if int(r.request_id.split("-")[1].split(":")[0]) % 3 == 2 else 0.001)
    rollout = make_rollout(["a:1", "b:1"], engine=engine, log=log, mode="group", group_size=3, batch_size=3,
                           concurrency=6, group_timeout_s=0.2, max_staleness=0)

    async def main():
        async with rollout:
            batches = await learn(rollout, engine, batches=2)
            return batches, rollout.stats()

    batches, stats = asyncio.run(main())
    events = read_events(log)
    discarded = {e["request_id"] for e in events if e["event"] == "discard"}
    for batch in batches:
        assert len(batch) == 2 and all(t.partial_group for t in batch)
        assert {t.group_id for t in batch} == {batch[0].group_id}
    assert len(discarded) == 2  # one straggler per group, cancelled
    assert not discarded & {e["request_id"] for e in events if e["event"] == "result"}
    partial = [e for e in events if e["event"] == "group"]
    assert all(e["partial"] for e in partial) and len(partial) >= 2
    assert stats["in_flight"] <= 3  # stragglers do not keep their slots


def test_a_synchronous_learner_that_does_not_publish_is_told_it_stalled():
    rollout = make_rollout(["a:1"], mode="group", group_size=2, batch_size=2, concurrency=4, max_staleness=0)

    async def main():
        async with rollout:
            await rollout.next_batch()
            await rollout.next_batch()  # nothing may be dispatched before version 1

    with pytest.raises(RolloutStalledError, match="staleness"):
        asyncio.run(main())
