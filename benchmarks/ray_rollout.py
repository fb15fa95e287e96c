"""Rollout throughput of the Ray backend with 1 and 2 workers against the local backend.

The same workload for each: the tiny policy playing guess_number (per-step layout, 3 turns of up to
8 new tokens), stream mode, ``--concurrency`` slots, ``--trajectories`` trajectories delivered to a
learner that publishes a new version after every batch (weights to the workers through one
``ray.put`` each). The clock starts once the backend is up (Ray and worker start-up are reported
apart: they are paid once per run, not per episode).

Reported: trajectories/s of each; ``overhead_ms`` = (1/ray_1 - 1/local) in ms per trajectory, the
cost of playing an episode on a Ray actor instead of in-process (dispatch, pickling the record and
the trajectory, weights per version) on the same number of cores; and ``scaling`` = ray_2 / ray_1.
On a 2-core machine the learner process, Ray's own processes and the workers share the cores, so
``scaling`` stays near or below 1 there; with one worker per core on a larger machine it grows
with the workers as long as generation dominates the per-episode overhead.

    python benchmarks/ray_rollout.py [--quick] [--trajectories N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import ray
import torch

from streamrl.policy.hf_engine import HFEngine
from streamrl.policy.loading import load_policy
from streamrl.policy.protocols import SamplingParams
from streamrl.rollout import EpisodeSettings, Rollout, RolloutSettings, UniformPromptSource, WorkerSpec, make_backend

MODEL = {"spec": "tiny", "seed": 0, "threads": 1,
         "model_overrides": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128}}
EPISODE = EpisodeSettings(layout="per_step", sampling=SamplingParams(max_new_tokens=8), max_turns=3,
                          max_context_tokens=512)
SPEC = WorkerSpec(model=MODEL, env="guess_number", episode=EPISODE, seed=0)


async def measure(kind: str, workers: int, policy, trajectories: int, concurrency: int) -> dict[str, float]:
    engine = HFEngine.from_policy(policy, threads=1)
    backend = make_backend(kind, SPEC, concurrency=concurrency, engine=engine, codec=policy,
                           weights=policy.state_dict_for_engine, workers=workers)
    settings = RolloutSettings(concurrency=concurrency, batch_size=concurrency, max_staleness=4, episode=EPISODE)
    rollout = Rollout(backend=backend, source=UniformPromptSource([f"train/{i}" for i in range(64)]),
                      settings=settings)
    started = time.monotonic()
    await rollout.start()
    up = time.monotonic()
    delivered, version = 0, 0
    try:
        while delivered < trajectories:
            delivered += len(await rollout.next_batch())
            version += 1
            engine.update_weights(policy.state_dict_for_engine(), version)
            rollout.publish(version)
        elapsed = time.monotonic() - up
    finally:
        await rollout.close()
        await engine.close()
    return {"traj_s": delivered / elapsed, "startup_s": up - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="48 trajectories each instead of 192 (<1 min)")
    parser.add_argument("--trajectories", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    trajectories = args.trajectories or (48 if args.quick else 192)
    torch.set_num_threads(1)
    policy = load_policy(**MODEL)
    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray_init_s = time.monotonic() - started
    try:
        local = asyncio.run(measure("local", 1, policy, trajectories, args.concurrency))
        ray_1 = asyncio.run(measure("ray", 1, policy, trajectories, args.concurrency))
        ray_2 = asyncio.run(measure("ray", 2, policy, trajectories, args.concurrency))
    finally:
        ray.shutdown()
    for name, row in (("local", local), ("ray x1", ray_1), ("ray x2", ray_2)):
        print(f"{name:7s} {row['traj_s']:7.2f} trajectories/s   start-up {row['startup_s']:5.1f} s")
    overhead_ms = 1000 * (1 / ray_1["traj_s"] - 1 / local["traj_s"])
    print(f"RESULT local_traj_s={local['traj_s']:.2f} ray1_traj_s={ray_1['traj_s']:.2f} "
          f"ray2_traj_s={ray_2['traj_s']:.2f} overhead_ms={overhead_ms:.1f} scaling={ray_2['traj_s'] / ray_1['traj_s']:.2f} "
          f"ray_init_s={ray_init_s:.1f} worker_start_s={ray_2['startup_s']:.1f} trajectories={trajectories}")


if __name__ == "__main__":
    main()
