"""Cancellation and shutdown leave no task, thread or open environment behind."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamrl.policy.scripted import ScriptedEngine
from streamrl.rollout import EpisodeSettings, RolloutError

from .rollout_toys import ToyEnv, env_threads, make_rollout, ok_policy

REPO = Path(__file__).resolve().parents[2]


def test_close_cancels_everything_including_hung_environment_calls():
    envs: list[ToyEnv] = []

    def factory():
        envs.append(ToyEnv(hang_limit_s=60))
        return envs[-1]

    engine = ScriptedEngine(ok_policy, latency_s=0.01)
    rollout = make_rollout(["hang:3", "t:50", "u:50"], engine=engine, env_factory=factory, concurrency=3,
                           episode=EpisodeSettings(env_timeout_s=30))

    async def main():
        await rollout.start()
        while rollout.stats()["in_flight"] < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # one step is now hung, the others are mid-episode
        await rollout.close()
        await rollout.close()  # idempotent
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        with pytest.raises(RolloutError, match="closed"):
            await rollout.next_batch()
        return others

    assert asyncio.run(main()) == []
    assert env_threads() == []
    assert envs and all(env.closed for env in envs)
    assert not engine.closed  # the engine belongs to the trainer


def test_keyboard_interrupt_shuts_the_rollout_down_cleanly(tmp_path):
    script = textwrap.dedent(
        """
        import asyncio, os, signal, sys, threading
        # a shell starting us in the background may have set SIGINT to "ignore": restore Ctrl-C
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {tests!r})
        from rollout.rollout_toys import ScriptedEngine, make_rollout, ok_policy, env_threads

        async def main():
            engine = ScriptedEngine(ok_policy, latency_s=0.01)
            async with make_rollout(["slow:50", "hang:5", "t:50"], engine=engine, concurrency=3):
                loop = asyncio.get_running_loop()
                loop.call_later(0.3, os.kill, os.getpid(), signal.SIGINT)  # Ctrl-C
                await asyncio.sleep(30)

        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            print("interrupted", "threads:", env_threads(), flush=True)
        """
    ).format(tests=str(REPO / "tests"))
    path = tmp_path / "interrupt.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=60, env=env)
    assert "interrupted threads: []" in done.stdout, done.stdout + done.stderr
    assert "Task was destroyed" not in done.stderr and "Traceback" not in done.stderr, done.stderr
