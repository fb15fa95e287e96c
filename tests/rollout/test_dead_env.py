"""Issue 12: a dead environment stops the rollout with one line naming it and its first error,
and no asyncio task exception goes unretrieved on the way."""

from __future__ import annotations

import asyncio
import gc
import itertools

import pytest

from streamrl.rollout import DeadEnvironmentError, RolloutSettings
from streamrl.rollout.timeouts import bounded

from .rollout_toys import ToyEnv, make_rollout


def _run_collecting_loop_errors(coro_fn):
    """Run ``coro_fn()`` and return (its result or exception, what the loop's handler saw)."""
    seen: list[dict] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: seen.append(context))
        try:
            return await coro_fn()
        finally:
            gc.collect()
            await asyncio.sleep(0)

    try:
        outcome = asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - the test inspects it
        outcome = error
    gc.collect()
    return outcome, seen


@pytest.mark.parametrize("where", ["reset", "step"])
def test_an_environment_failing_every_episode_stops_the_rollout(where):
    rollout = make_rollout(["t:2", "u:3"], env_factory=lambda: ToyEnv(raise_on={where}), concurrency=4, batch_size=4,
                           env_name="toy-dead")

    async def main():
        async with rollout:
            return await rollout.next_batch()

    outcome, seen = _run_collecting_loop_errors(main)
    assert isinstance(outcome, DeadEnvironmentError), outcome
    message = str(outcome)
    assert "\n" not in message and "'toy-dead'" in message and f"{where} exploded" in message
    assert "episodes in a row" in message
    assert not seen, seen


def test_a_factory_that_always_raises_is_a_dead_environment():
    def factory():
        raise OSError("no display")

    rollout = make_rollout(["t:2"], env_factory=factory, concurrency=2, batch_size=2, max_env_faults_in_row=3)

    async def main():
        async with rollout:
            for _ in range(3):  # the third fault in a row stops it, whichever batch it falls in
                await rollout.next_batch()

    outcome, _ = _run_collecting_loop_errors(main)
    assert isinstance(outcome, DeadEnvironmentError) and "no display" in str(outcome)


def test_occasional_environment_faults_do_not_stop_training():
    counter = itertools.count()

    def factory():  # every other environment is broken; the healthy ones are reused
        return ToyEnv(raise_on={"reset"} if next(counter) % 2 else None)

    rollout = make_rollout([f"t{i}:1" for i in range(8)], env_factory=factory, concurrency=2, batch_size=4)

    async def main():
        batches = []
        async with rollout:
            for _ in range(3):
                batches.append(await rollout.next_batch())
                rollout.publish(rollout.learner_version + 1)
        return batches

    outcome, seen = _run_collecting_loop_errors(main)
    assert isinstance(outcome, list) and len(outcome) == 3, outcome
    assert not seen


def test_a_call_failing_as_its_caller_is_cancelled_leaves_no_unretrieved_exception():
    async def fail():
        raise RuntimeError("failed just now")

    async def main():
        caller = asyncio.ensure_future(bounded(fail(), 5.0))
        await asyncio.sleep(0)  # the caller starts the call and waits on it
        await asyncio.sleep(0)  # the call fails; the caller has not resumed yet
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)

    _, seen = _run_collecting_loop_errors(main)
    assert not [c for c in seen if "never retrieved" in c.get("message", "")], seen


def test_the_limit_is_checked():
    with pytest.raises(ValueError, match="max_env_faults_in_row"):
        RolloutSettings(max_env_faults_in_row=0)
