"""The rollout against the real embedded environments, with scripted players."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re

import pytest

from streamrl.envs import list_envs, make, make_parser, make_prompt_builder
from streamrl.policy.scripted import ScriptedEngine
from streamrl.rollout import (
    EpisodeSettings,
    Rollout,
    RolloutSettings,
    UniformPromptSource,
    replay,
    to_samples,
)

from .rollout_toys import RecordingEngine
from .test_layouts import check_masks


def binary_search(prompt: str) -> str:
    """Plays guess_number perfectly from the feedback visible in the prompt."""
    low = max([int(n) + 1 for n in re.findall(r"(\d+) is too low", prompt)], default=1)
    high = min([int(n) - 1 for n in re.findall(r"(\d+) is too high", prompt)], default=100)
    return f"<action>{(low + high) // 2}</action>"


def rollout_for(env_name, engine, settings, log=None, env_options=None, prompt_options=None, parser_options=None):
    probe = make(env_name, **(env_options or {}))
    return Rollout(
        engine=engine,
        codec=engine.codec,
        env_factory=lambda: make(env_name, **(env_options or {})),
        parser=make_parser(env_name, **(parser_options or {})),
        prompt_builder=make_prompt_builder(env_name, **(prompt_options or {})),
        source=UniformPromptSource(probe.task_ids("train", limit=32)),
        settings=settings,
        event_log=log,
    )


@pytest.mark.skipif("guess_number" not in list_envs(), reason="guess_number not available")
@pytest.mark.parametrize("layout", ["full_history", "per_step"])
def test_guess_number_is_won_by_binary_search_in_both_layouts(tmp_path, layout):
    log = tmp_path / "events.jsonl"
    engine = RecordingEngine(ScriptedEngine(binary_search, latency_s=0.001))
    settings = RolloutSettings(concurrency=4, batch_size=4,
                               episode=EpisodeSettings(layout=layout, max_context_tokens=1024))
    rollout = rollout_for("guess_number", engine, settings, log)

    async def main():
        async with rollout:
            batches = [await rollout.next_batch() for _ in range(3)]
        return batches

    batches = asyncio.run(main())
    trajectories = [t for batch in batches for t in batch]
    assert all(t.end_reason == "terminated" and t.won and t.outcome == 1.0 for t in trajectories)
    assert all(1 <= len(t.turns) <= 7 for t in trajectories)
    assert replay(log) == [[t.request_id for t in batch] for batch in batches]
    calls = {request.request_id: (request, result) for request, result in engine.calls}
    for sample in to_samples(trajectories):
        trajectory = trajectories[sample.trajectory_index]
        turns = [trajectory.turns[i] for i in sample.turn_indices]
        pairs = [calls[f"{trajectory.request_id}:{i}"] for i in sample.turn_indices]
        check_masks(sample, dataclasses.replace(trajectory, turns=turns), pairs, engine.codec)


@pytest.mark.skipif("alfworld_lite" not in list_envs(), reason="alfworld_lite not available")
def test_alfworld_lite_runs_in_group_mode_with_a_random_admissible_player():
    rng = random.Random(0)

    def wander(prompt: str) -> str:
        choices = re.findall(r"'([^']+)'", prompt.rsplit("admissible", 1)[-1])
        return f"<think>ok</think><action>{rng.choice(choices) if choices else 'look'}</action>"

    engine = ScriptedEngine(wander)
    settings = RolloutSettings(mode="group", group_size=2, batch_size=4, concurrency=4, max_staleness=0,
                               episode=EpisodeSettings(layout="per_step", max_turns=6, max_context_tokens=4096))
    rollout = rollout_for("alfworld_lite", engine, settings)

    async def main():
        async with rollout:
            first = await rollout.next_batch()
            engine.update_weights({}, 1)
            rollout.publish(1)
            return first, await rollout.next_batch()

    for batch in asyncio.run(main()):
        assert len(batch) == 4
        assert batch[0].prompt_id == batch[1].prompt_id and batch[2].prompt_id == batch[3].prompt_id
        assert batch[0].initial_observation == batch[1].initial_observation  # same task, same start
        for trajectory in batch:
            assert trajectory.end_reason in ("terminated", "max_turns"), trajectory.error
            assert trajectory.task_type and len(trajectory.turns) >= 1
            assert all(turn.format_valid for turn in trajectory.turns)
        assert len(to_samples(batch)) == sum(len(t.turns) for t in batch)


@pytest.mark.skipif("guess_number" not in list_envs(), reason="guess_number not available")
def test_the_real_tiny_engine_straddles_versions_and_keeps_tokens_exact():
    pytest.importorskip("transformers")
    from streamrl.policy import HFEngine, load_policy
    from streamrl.policy.protocols import SamplingParams

    policy = load_policy("tiny")
    hf = HFEngine(policy.inference_model(), decode=policy.decode, banned_token_ids=policy.banned_token_ids)
    engine = RecordingEngine(hf, codec=policy)
    settings = RolloutSettings(concurrency=4, batch_size=4, episode=EpisodeSettings(
        max_turns=3, max_context_tokens=512, sampling=SamplingParams(max_new_tokens=8)))
    rollout = rollout_for("guess_number", engine, settings)

    async def main():
        try:
            async with rollout:
                first = await rollout.next_batch()
                hf.update_weights(policy.state_dict_for_engine(), 1)
                rollout.publish(1)
                return first + await rollout.next_batch()
        finally:
            await hf.close()

    trajectories = asyncio.run(main())
    calls = {request.request_id: (request, result) for request, result in engine.calls}
    for trajectory in trajectories:
        assert trajectory.end_reason in ("terminated", "truncated", "max_turns"), trajectory.error
        versions = trajectory.turn_versions
        assert versions == sorted(versions) and set(versions) <= {0, 1}
    for sample in to_samples(trajectories):
        trajectory = trajectories[sample.trajectory_index]
        pairs = [calls[f"{trajectory.request_id}:{i}"] for i in sample.turn_indices]
        check_masks(sample, trajectory, pairs, None)
    assert any(t.turn_versions[-1] == 1 for t in trajectories)  # the second batch used version 1
