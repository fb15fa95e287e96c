"""An episode that ends tells the engine its last sequence will not be extended, so the KV the
engine kept for a next turn is freed at once instead of filling its prefix cache until evicted."""

from __future__ import annotations

import asyncio

import pytest

from streamrl.envs import make
from streamrl.policy import HFEngine, load_policy
from streamrl.rollout.play_tasks import run_episodes
from streamrl.training.config_files import load_config
from streamrl.training.evaluate import episode_runner, episode_settings


@pytest.mark.parametrize("layout", ["full_history", "per_step"])
def test_finished_episodes_leave_no_kept_sequences(layout):
    config = load_config("configs/smoke.yaml", [f"rollout.layout={layout}", "rollout.max_turns=3"])
    policy = load_policy("tiny:hidden=64,layers=2,heads=4,kv_heads=2,intermediate=128", seed=0)
    engine = HFEngine.from_policy(policy, seed=0)

    async def main():
        try:
            return await run_episodes(episode_runner(config, engine, policy, episode_settings(config)),
                                      lambda: make("alfworld_lite"), [f"train/{i}" for i in range(4)], concurrency=4)
        finally:
            await engine.close()

    trajectories = asyncio.run(main())
    assert all(len(t.turns) >= 2 for t in trajectories)
    store = engine._decode_loop.prefixes
    if layout == "full_history":  # each turn extended the kept sequence of the one before
        assert engine._decode_loop.stats["reused_tokens"] > 0
    for tokens in engine._forgotten:  # what the idle worker had not applied before it closed
        store.discard(tokens)
    kept = [key for key, entry in store._entries.items() if not entry[2]]
    assert kept == [], f"{len(kept)} sequences of finished episodes still kept"
