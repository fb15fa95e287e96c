"""Play a fixed list of tasks once each (evaluation), outside the training stream."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Sequence

from streamrl.envs.base import AsyncEnv, Env
from streamrl.rollout.env_pool import EnvPool
from streamrl.rollout.episode import EpisodeRunner
from streamrl.rollout.trajectory import DispatchRecord, Trajectory, env_seed


async def run_episodes(
    runner: EpisodeRunner,
    env_factory: Callable[[], Env | AsyncEnv],
    prompt_ids: Sequence[str],
    *,
    concurrency: int = 8,
    seed: int = 0,
    request_prefix: str = "eval",
    shutdown_timeout_s: float = 5.0,
    on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """One episode per task id, at most ``concurrency`` at a time; results in ``prompt_ids`` order
    (``on_done`` hears each as it ends: a long evaluation tells its progress).

    Faults end single episodes (see ``EpisodeRunner``); environments and threads are closed on
    return, also when the caller is cancelled.
    """
    if concurrency < 1:
        raise ValueError(f"run_episodes: concurrency must be >= 1, got {concurrency}")
    envs = EnvPool(env_factory, concurrency, call_timeout_s=runner.settings.env_timeout_s)
    slots = asyncio.Semaphore(concurrency)

    async def one(index: int, prompt_id: str) -> Trajectory:
        async with slots:
            record = DispatchRecord(
                request_id=f"{request_prefix}-{index}",
                prompt_id=prompt_id,
                seq=index,
                policy_version=runner.engine.version,
                env_seed=env_seed(seed, index),
                dispatched_at=time.time(),
            )
            trajectory = await runner.run_leased(envs, record)
            if on_done is not None:
                on_done(trajectory)
            return trajectory

    tasks = [asyncio.ensure_future(one(index, prompt_id)) for index, prompt_id in enumerate(prompt_ids)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await envs.close(shutdown_timeout_s)
