"""The shared interface conformance test, over every embedded environment in ``list_envs()``."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.envs import STANDARD_INFO_KEYS, AsyncEnv, ParsedAction, StepResult, get_entry, list_envs, make

EMBEDDED = [name for name in list_envs() if name != "alfworld_real"]
JUNK = ["hello", "", "42", "<action>look</action>", "go to nowhere 1"]


def _entry_or_skip(name: str):
    try:
        return get_entry(name)
    except ModuleNotFoundError as error:  # another engineer's env that has not landed yet
        pytest.skip(f"{name} is not importable yet: {error}")


def _first_task(env) -> str:
    return env.task_ids(env.spec.eval_split, limit=1)[0]


def _policy(seed: int):
    """Admissible actions when the env lists them, else junk; seeded, so runs repeat."""
    rng = random.Random(seed)

    def act(info: dict) -> str:
        actions = info.get("admissible_actions")
        return rng.choice(actions) if actions else rng.choice(JUNK)

    return act


def _check_info(info: dict, task_id: str, step: int) -> None:
    missing = [key for key in STANDARD_INFO_KEYS if key not in info]
    assert not missing, f"info lacks {missing}"
    assert isinstance(info["won"], bool)
    assert isinstance(info["score"], float)
    assert info["admissible_actions"] is None or all(isinstance(a, str) for a in info["admissible_actions"])
    assert isinstance(info["format_valid"], bool)
    assert isinstance(info["action_effective"], bool)
    assert info["task_id"] == task_id
    assert isinstance(info["task_type"], str) and info["task_type"]
    assert info["step"] == step


def _run(name: str, task_id: str, act, max_steps: int | None = None) -> list[tuple]:
    """One episode; returns (observation, reward, terminated, truncated, info) per step."""
    env = make(name)
    observation, info = env.reset(task_id=task_id)
    assert isinstance(observation, str) and observation
    _check_info(info, task_id, 0)
    trace = [(observation, 0.0, False, False, info)]
    for step in range(1, (max_steps or env.spec.max_steps) + 1):
        result = env.step(act(info))
        assert isinstance(result, StepResult)
        assert isinstance(result.observation, str)
        assert isinstance(result.reward, float)
        _check_info(result.info, task_id, step)
        info = result.info
        trace.append((result.observation, result.reward, result.terminated, result.truncated, result.info))
        if result.terminated or result.truncated:
            break
    env.close()
    return trace


@pytest.mark.parametrize("name", EMBEDDED)
def test_episode_types_info_and_ending(name):
    _entry_or_skip(name)
    env = make(name)
    task_id = _first_task(env)
    trace = _run(name, task_id, _policy(0))
    *middle, last = trace
    for _, _, terminated, truncated, _ in middle:
        assert not terminated and not truncated
    _, _, terminated, truncated, info = last
    assert terminated != truncated, "an episode ends either terminated or truncated, never both"
    assert isinstance(info.get("reason"), str) and info["reason"]
    assert len(trace) - 1 <= env.spec.max_steps


@pytest.mark.parametrize("name", EMBEDDED)
def test_junk_actions_end_in_truncation_at_the_cap(name):
    _entry_or_skip(name)
    env = make(name)
    trace = _run(name, _first_task(env), lambda info: "xyzzy plugh")
    _, reward, terminated, truncated, info = trace[-1]
    if not terminated:  # some caps (tool calls, tokens) may truncate before max_steps
        assert truncated and info["reason"] and len(trace) - 1 <= env.spec.max_steps
        assert reward == 0.0


@pytest.mark.parametrize("name", EMBEDDED)
def test_same_task_and_actions_give_the_same_episode(name):
    _entry_or_skip(name)
    task_id = _first_task(make(name))
    first = _run(name, task_id, _policy(7))
    second = _run(name, task_id, _policy(7))
    assert [step[:4] for step in first] == [step[:4] for step in second]
    keys = (*STANDARD_INFO_KEYS, "anchor", "reason")  # other keys may carry timings
    for step_a, step_b in zip(first, second, strict=True):
        assert {k: step_a[4].get(k) for k in keys} == {k: step_b[4].get(k) for k in keys}


@pytest.mark.parametrize("name", EMBEDDED)
def test_close_is_idempotent_sync_and_async(name):
    _entry_or_skip(name)
    env = make(name)
    env.reset(task_id=_first_task(env))
    env.close()
    env.close()
    async_env = AsyncEnv(make(name))

    async def episode():
        await async_env.reset(task_id=_first_task(async_env.env))
        await async_env.close()
        await async_env.close()

    asyncio.run(episode())
    with make(name) as managed:
        managed.reset(task_id=_first_task(managed))


@pytest.mark.parametrize("name", EMBEDDED)
def test_task_ids_are_deterministic_strings(name):
    _entry_or_skip(name)
    env = make(name)
    for split, size in env.spec.splits.items():
        ids = env.task_ids(split, limit=5)
        assert ids == make(name).task_ids(split, limit=5)
        assert len(ids) == (5 if size is None else min(5, size))
        assert all(isinstance(task_id, str) for task_id in ids)
    assert env.spec.eval_split in env.spec.splits


@pytest.mark.parametrize("name", EMBEDDED)
@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200))
def test_parser_never_raises(name, text):
    entry = _entry_or_skip(name)
    parsed = entry.parser().parse(text)
    assert isinstance(parsed, ParsedAction)
    assert isinstance(parsed.action, str) and isinstance(parsed.format_valid, bool)


@pytest.mark.parametrize("name", EMBEDDED)
def test_prompt_builder_renders_both_layouts(name):
    entry = _entry_or_skip(name)
    builder = entry.prompt_builder()
    env = make(name)
    initial, info = env.reset(task_id=_first_task(env))
    action = _policy(1)(info)
    result = env.step(action)
    system = builder.system_prompt()
    assert system is None or isinstance(system, str)
    assert isinstance(builder.first_message(initial, info), str)
    assert isinstance(builder.next_message(result.observation, result.info), str)
    for history in ([], [(initial, action)]):
        messages = builder.step_messages(initial, history, result.observation, result.info)
        assert messages and all(set(m) == {"role", "content"} for m in messages)
        assert all(isinstance(m["content"], str) and m["content"] for m in messages)


def test_64_toy_envs_play_concurrently_and_fast():
    """64 guess_number envs (8 tasks, 8 copies each) play binary search concurrently through AsyncEnv."""
    task_ids = make("guess_number").task_ids("test", limit=8)
    envs = [AsyncEnv(make("guess_number")) for _ in range(64)]

    async def play() -> list[bool]:
        results = await asyncio.gather(*(env.reset(task_id=task_ids[i // 8]) for i, env in enumerate(envs)))
        assert [info["task_id"] for _, info in results] == [task_ids[i // 8] for i in range(64)]
        bounds = [[1, 100] for _ in range(64)]
        won = [False] * 64
        for _ in range(7):
            guesses = {i: (low + high) // 2 for i, (low, high) in enumerate(bounds) if not won[i]}
            stepped = await asyncio.gather(*(envs[i].step(str(g)) for i, g in guesses.items()))
            for (i, guess), result in zip(guesses.items(), stepped):
                if result.info["won"]:
                    won[i] = True
                elif "too low" in result.observation:
                    bounds[i][0] = guess + 1
                else:
                    bounds[i][1] = guess - 1
        await asyncio.gather(*(env.close() for env in envs))
        return won

    start = time.perf_counter()
    won = asyncio.run(play())
    assert all(won)
    assert time.perf_counter() - start < 10.0
