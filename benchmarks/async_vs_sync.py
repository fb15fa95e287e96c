"""Single-stream versus group-synchronous rollout under heavy-tailed environment latency.

Both modes run the same workload on the same code path (``streamrl.rollout.Rollout``): the same
environment, whose steps sleep for a log-normal tool latency with one episode in ten made 10x
slower, the same scripted latency-simulating engine, the same number of slots, and the same number
of trajectories delivered to a learner that publishes a new version after every batch.

* stream: ``mode="stream"``, first-finished batches, ``max_staleness=4``;
* sync (the baseline): ``mode="group"`` (GRPO groups of 4) with ``max_staleness=0``, i.e. each
  batch is dispatched after the previous one was trained on and waits for its slowest episode.

Reported: wall-clock time; slot utilisation (busy slot-seconds / (slots x wall)); the ideal time
N x E[episode work] / slots, which any scheduler with that many slots needs on average to complete
N episodes (E[work] from the latency model); the speedup of stream over sync; and the fraction of
stream samples that lagged more than ``max_staleness`` (delivered, but excluded from the loss).

First-finished delivery takes short episodes first and leaves slow ones in flight, so over a short
run the stream can deliver slightly faster than the ideal (``stream_vs_ideal`` > 1); the ratio
converges as the run grows (2,048 trajectories: ~0.96, the rest being framework and timer overhead).

    python benchmarks/async_vs_sync.py [--quick] [--trajectories N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from streamrl.envs.base import ActionParser, Env, EnvSpec, ParsedAction, PromptBuilder, StepResult
from streamrl.policy.scripted import ScriptedEngine
from streamrl.rollout import EpisodeSettings, Rollout, RolloutSettings, UniformPromptSource


@dataclass(frozen=True)
class Workload:
    turns: int = 4
    generate_s: float = 0.002  # per turn
    tool_median_s: float = 0.010  # log-normal step latency: median and sigma of its log
    tool_sigma: float = 0.6
    slow_fraction: float = 0.1
    slow_factor: float = 10.0
    seed: int = 0

    def expected_episode_s(self) -> float:
        tool_mean = self.tool_median_s * math.exp(self.tool_sigma**2 / 2)
        slowdown = 1 - self.slow_fraction + self.slow_fraction * self.slow_factor
        return self.turns * (self.generate_s + tool_mean * slowdown)


class LatencyEnv(Env):
    """Fixed-length episodes whose steps sleep; every episode draws its latencies independently."""

    spec = EnvSpec(name="latency", max_steps=64)
    _episodes = itertools.count()
    _lock = threading.Lock()

    def __init__(self, workload: Workload):
        self.workload = workload

    def reset(self, seed: int | None = None, task_id: str | None = None, options: dict[str, Any] | None = None):
        with LatencyEnv._lock:
            number = next(LatencyEnv._episodes)
        self._rng = random.Random(f"{self.workload.seed}:{number}")
        self._scale = self.workload.slow_factor if self._rng.random() < self.workload.slow_fraction else 1.0
        self._step = 0
        return f"task {task_id}", {"won": False, "task_type": "latency"}

    def step(self, action: str) -> StepResult:
        self._step += 1
        time.sleep(self._scale * self._rng.lognormvariate(math.log(self.workload.tool_median_s), self.workload.tool_sigma))
        done = self._step >= self.workload.turns
        return StepResult(f"result {self._step}", float(done), done, False, {"won": done})


class EchoParser(ActionParser):
    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(text.strip(), True)


class PlainPrompts(PromptBuilder):
    def system_prompt(self) -> str | None:
        return None

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        return observation

    def next_message(self, observation: str, info: dict[str, Any]) -> str:
        return observation

    def step_messages(self, initial_observation, history, observation, info):
        return [{"role": "user", "content": observation}]


async def measure(mode: str, workload: Workload, trajectories: int, concurrency: int) -> dict[str, float]:
    engine = ScriptedEngine(lambda prompt: "act", latency_s=workload.generate_s)
    group = dict(mode="group", group_size=4, max_staleness=0) if mode == "sync" else dict(mode="stream", max_staleness=4)
    settings = RolloutSettings(concurrency=concurrency, batch_size=concurrency, seed=workload.seed,
                               episode=EpisodeSettings(max_turns=workload.turns, env_timeout_s=60), **group)
    rollout = Rollout(
        engine=engine,
        codec=engine.codec,
        env_factory=lambda: LatencyEnv(workload),
        parser=EchoParser(),
        prompt_builder=PlainPrompts(),
        source=UniformPromptSource([f"task/{i}" for i in range(4 * concurrency)]),
        settings=settings,
    )
    delivered = excluded = 0
    work = 0.0
    async with rollout:
        started = time.monotonic()
        while delivered < trajectories:
            batch = await rollout.next_batch()
            delivered += len(batch)
            excluded += sum(t.excluded_from_loss for t in batch)
            work += sum(t.duration_s for t in batch)
            engine.update_weights({}, rollout.learner_version + 1)
            rollout.publish(rollout.learner_version + 1)
        wall = time.monotonic() - started
        busy = rollout.stats()["busy_slot_s"]
    return {
        "wall_s": wall,
        "utilisation": busy / (concurrency * wall),
        "mean_work_s": work / delivered,
        "excluded": excluded / delivered,
        "delivered": delivered,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,024 trajectories instead of 2,048 (~25 s)")
    parser.add_argument("--trajectories", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    trajectories = args.trajectories or (1024 if args.quick else 2048)
    concurrency = args.concurrency
    workload = Workload()

    results = {mode: asyncio.run(measure(mode, workload, trajectories, concurrency)) for mode in ("stream", "sync")}
    ideal = trajectories * workload.expected_episode_s() / concurrency
    stream, sync = results["stream"], results["sync"]
    print(f"async_vs_sync: {trajectories} trajectories, {concurrency} slots, batch {concurrency}, "
          f"{workload.turns} turns/episode, E[episode] {workload.expected_episode_s() * 1e3:.0f} ms "
          f"({workload.slow_fraction:.0%} of episodes {workload.slow_factor:.0f}x slower)")
    print(f"{'mode':<8}{'wall_s':>9}{'traj/s':>9}{'slot_util':>11}{'mean_work_ms':>14}{'excluded':>10}")
    for name, row in results.items():
        print(f"{name:<8}{row['wall_s']:>9.2f}{row['delivered'] / row['wall_s']:>9.1f}{row['utilisation']:>11.2f}"
              f"{row['mean_work_s'] * 1e3:>14.1f}{row['excluded']:>10.2f}")
    print(f"{'ideal':<8}{ideal:>9.2f}{trajectories / ideal:>9.1f}{1.0:>11.2f}")
    speedup = sync["wall_s"] / stream["wall_s"]
    print(f"speedup (sync wall / stream wall): {speedup:.2f}x; stream reaches {ideal / stream['wall_s']:.2f} of the "
          f"ideal throughput, sync {ideal / sync['wall_s']:.2f}")
    print(f"RESULT speedup={speedup:.2f} stream_utilisation={stream['utilisation']:.3f} "
          f"sync_utilisation={sync['utilisation']:.3f} stream_vs_ideal={ideal / stream['wall_s']:.3f} "
          f"stream_excluded={stream['excluded']:.3f}")


if __name__ == "__main__":
    main()
