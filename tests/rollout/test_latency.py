"""The latency model (issue 37): reproducible heavy-tailed waits around their medians, that change
when an episode arrives but never what it contains, recorded in the event log; with a failure factor
the first-finished batch is biased toward success, the regime SPO++'s event-time memory is about."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from streamrl.policy.scripted import ScriptedEngine
from streamrl.rollout import EpisodeSettings, LatencyModel, read_events
from streamrl.training.config_files import load_config
from streamrl.training.evaluate import episode_settings, training_episode_settings

from .rollout_toys import learn, make_rollout, ok_policy, play


@pytest.mark.parametrize("tail, shape", [("lognormal", 1.0), ("pareto", 1.2)])
def test_delays_are_reproducible_heavy_tailed_and_centred_on_their_median(tail, shape):
    model = LatencyModel(turn_s=0.5, episode_s=2.0, tail=tail, shape=shape, failure_factor=3.0, seed=7)
    turns = [model.turn_delay(f"r{i}", 0) for i in range(4000)]
    assert statistics.median(turns) == pytest.approx(0.5, rel=0.1)
    assert sorted(turns)[int(0.99 * len(turns))] > 5 * 0.5  # a heavy tail: the 99th percentile is far out
    assert model.turn_delay("r1", 0) == model.turn_delay("r1", 0) != model.turn_delay("r1", 1)
    assert model.episode_delay("r1", won=False) == pytest.approx(3.0 * model.episode_delay("r1", won=True))
    assert LatencyModel(turn_s=0.5, seed=8).turn_delay("r1", 0) != LatencyModel(turn_s=0.5, seed=7).turn_delay("r1", 0)
    assert not LatencyModel().active and LatencyModel().episode_delay("r1", won=False) == 0.0
    with pytest.raises(ValueError, match="shape"):
        LatencyModel(shape=0.0)


def test_waits_change_when_an_episode_ends_not_what_it_contains():
    model = LatencyModel(turn_s=0.01, episode_s=0.02, seed=3)
    plain = asyncio.run(play(ScriptedEngine(ok_policy), prompt_id="t:3", settings=EpisodeSettings()))
    delayed = asyncio.run(play(ScriptedEngine(ok_policy), prompt_id="t:3", settings=EpisodeSettings(latency=model)))
    assert [(t.context_ids, t.action_ids, t.observation, t.reward) for t in delayed.turns] == \
           [(t.context_ids, t.action_ids, t.observation, t.reward) for t in plain.turns]
    assert delayed.won and delayed.outcome == plain.outcome
    expected = sum(model.turn_delay("req-0", i) for i in range(3)) + model.episode_delay("req-0", won=True)
    assert plain.injected_delay_s == 0.0 and delayed.injected_delay_s == pytest.approx(expected)
    assert delayed.duration_s >= delayed.injected_delay_s


def _good_or_bad(prompt: str) -> str:
    return "<a>ok</a>" if "start good" in prompt else "<a>no</a>"


def test_slow_failures_bias_the_first_finished_batch_toward_success(tmp_path):
    log = tmp_path / "events.jsonl"
    # successes wait about 2 ms at their end, failures about 1 s (at least ~0.45 s for these draws)
    latency = LatencyModel(episode_s=0.002, shape=0.25, failure_factor=500.0, seed=0)
    prompts = [f"good{i}:1" for i in range(4)] + [f"bad{i}:1" for i in range(4)]
    engine = ScriptedEngine(_good_or_bad, latency_s=0.001)
    rollout = make_rollout(prompts, engine=engine, log=log, concurrency=8, batch_size=4, max_staleness=None,
                           episode=EpisodeSettings(env_timeout_s=5.0, latency=latency))

    async def main():
        async with rollout:
            return await learn(rollout, engine, batches=1)

    first = asyncio.run(main())[0]
    results = [e for e in read_events(log) if e["event"] == "result"]
    assert results and all(e["injected_delay_s"] > 0 for e in results)  # recorded with each result
    assert [t.won for t in first] == [True] * 4  # the four that arrive first are the four successes


def test_only_training_episodes_wait():
    config = load_config("configs/smoke.yaml", ["rollout.latency.episode_s=0.5", "rollout.latency.tail=pareto"])
    assert training_episode_settings(config).latency == LatencyModel(episode_s=0.5, tail="pareto", seed=0)
    assert episode_settings(config).latency is None  # evaluation and warm starts play without waits
    assert training_episode_settings(load_config("configs/smoke.yaml")).latency is None  # off by default
