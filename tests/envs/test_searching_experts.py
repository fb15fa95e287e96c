"""``env.searching_expert()``: each environment's non-privileged demonstrator (SFT's
``sft.source: search_expert``) solves held-out tasks knowing only what it observes."""

from __future__ import annotations

import pytest

from streamrl.envs import make


def _play(env, act, task_id: str) -> bool:
    observation, info = env.reset(task_id=task_id)
    for _ in range(env.spec.max_steps):
        result = env.step(act(observation, info))
        if result.terminated or result.truncated:
            return bool(result.info.get("won"))
        observation, info = result.observation, result.info
    return False


@pytest.mark.parametrize(("name", "options", "split", "at_least"), [
    ("alfworld_lite", {"max_receptacles": 5}, "unseen", 0.7),
    ("webshop_lite", {}, "test", 0.5),
])
def test_searching_expert_wins_most_held_out_tasks(name, options, split, at_least):
    env = make(name, **options)
    tasks = env.task_ids(split, limit=20)
    wins = [_play(env, env.searching_expert(), task) for task in tasks]
    env.close()
    assert sum(wins) / len(wins) >= at_least, wins

