"""SAPO (one model: policy + V + Q from value tokens) versus PPO with a separate critic.

Same model, same batch of trajectories (generated once, so sequence lengths are identical), same
optimiser settings, KL off for both (the comparison is about the critic). Each algorithm runs in
its own process so peak memory is its own. Per iteration we report:

* generation: the engine producing the batch (identical work for both: the same policy generates);
* scoring: proximal log-probs (and SAPO's V/Q readouts), and PPO's critic values;
* updates: the actor update, and PPO's separate critic update;
* peak training memory: the process's peak resident memory above what it held before the learner
  (and, for PPO, the critic) were built.

    python benchmarks/sapo_vs_ppo.py --quick                 # tiny model, < 1 minute
    python benchmarks/sapo_vs_ppo.py --models tiny,smollm2-135m
    python benchmarks/sapo_vs_ppo.py --models smollm2-135m --gradient-checkpointing

Ends with ``RESULT learner_time_ratio=.. iteration_time_ratio=.. memory_ratio=..`` (SAPO / PPO) for
the last (largest) model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SCORING = ("time_score_old_s", "time_score_ref_s", "time_prepare_s")
UPDATES = ("time_actor_update_s", "time_critic_update_s", "time_after_update_s")


def _config(model: str, algo: str, args: argparse.Namespace):
    from streamrl.training.config_files import load_config

    overrides = [
        f"model.spec={model}", "env.name=guess_number", "env.prompt={}", "env.parser={}",
        "rollout.layout=full_history", f"rollout.max_turns={args.turns}", f"rollout.max_new_tokens={args.new_tokens}",
        f"train.batch_size={args.batch}", f"optim.micro_batch_size={args.micro_batch}", "optim.lr=1e-5",
        "algo.kl_coef=0", "algo.epochs=1", "sft.demos=0",
        f"model.gradient_checkpointing={args.gradient_checkpointing}",
    ]
    return load_config(None, overrides, algo=algo)


def generate(model: str, args: argparse.Namespace, path: Path) -> float:
    """Generate one batch with the engine; save it; return the wall time."""
    from streamrl.envs import make
    from streamrl.policy.hf_engine import HFEngine
    from streamrl.policy.loading import load_policy
    from streamrl.rollout.play_tasks import run_episodes
    from streamrl.training.evaluate import episode_runner, episode_settings

    config = _config(model, "sapo", args)
    policy = load_policy(model, seed=0, dtype=config.model.dtype)  # auto: says what it chose and why

    async def run():
        engine = HFEngine.from_policy(policy, seed=0)
        try:
            tasks = make("guess_number").task_ids("train", limit=args.batch)
            started = time.perf_counter()
            out = await run_episodes(episode_runner(config, engine, policy, episode_settings(config)),
                                     lambda: make("guess_number"), tasks, concurrency=args.batch)
            return out, time.perf_counter() - started
        finally:
            await engine.close()

    trajectories, seconds = asyncio.run(run())
    path.write_text(json.dumps([t.to_dict() for t in trajectories]))
    return seconds


def child(model: str, algo: str, batch_path: Path, args: argparse.Namespace) -> None:
    """Runs in its own process: load, build the learner, time ``steps`` learner steps."""
    import psutil
    import torch

    from streamrl.policy.loading import load_policy
    from streamrl.rollout import Trajectory
    from streamrl.training.assemble import make_learner

    torch.manual_seed(0)
    config = _config(model, algo, args)
    policy = load_policy(model, seed=0, dtype=config.model.dtype)  # auto: says what it chose and why
    trajectories = [Trajectory.from_dict(t) for t in json.loads(batch_path.read_text())]
    for index, t in enumerate(trajectories):
        # half the episodes "succeed": a random policy never does, and with all rewards equal PPO's
        # advantages are all 0 and its actor update would be skipped (this measures cost, not learning)
        t.turns[-1].reward = float(index % 2)
        t.outcome = sum(turn.reward for turn in t.turns)
    process = psutil.Process()
    baseline = process.memory_info().rss
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    learner = make_learner(config, policy, None, (0.0, 1.0))
    records = [learner.step(trajectories) for _ in range(args.steps + 1)][1:]  # the first step warms up
    done.set()
    sampler.join()
    result = {key: sum(r.get(key, 0.0) for r in records) / len(records) for key in SCORING + UPDATES}
    result["peak_training_mb"] = (peak[0] - baseline) / 2**20
    print(json.dumps(result))


def measure(model: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as folder:
        batch = Path(folder) / "batch.json"
        generation = generate(model, args, batch)
        results = {}
        for algo in ("ppo", "sapo"):
            command = [sys.executable, __file__, "--child", model, algo, str(batch), *_passthrough(args)]
            output = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
            if output.returncode != 0:
                raise SystemExit(f"{algo} on {model} failed:\n{output.stderr[-3000:]}")
            row = json.loads(output.stdout.strip().splitlines()[-1])
            row["generation_s"] = generation
            row["scoring_s"] = sum(row[k] for k in SCORING)
            row["updates_s"] = sum(row[k] for k in UPDATES)
            row["learner_s"] = row["scoring_s"] + row["updates_s"]
            row["iteration_s"] = row["learner_s"] + generation
            results[algo] = row
    return results


def _passthrough(args: argparse.Namespace) -> list[str]:
    return [f"--batch={args.batch}", f"--turns={args.turns}", f"--new-tokens={args.new_tokens}",
            f"--micro-batch={args.micro_batch}", f"--steps={args.steps}", f"--threads={args.threads}",
            *(["--gradient-checkpointing"] if args.gradient_checkpointing else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model only, small batch (< 1 minute)")
    parser.add_argument("--models", default="tiny,smollm2-135m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in both learners (model.gradient_checkpointing)")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "ALGO", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]), args)
        return
    if args.quick:
        args.models, args.batch, args.steps = "tiny", 8, 2
    ratios = {}
    for model in args.models.split(","):
        results = measure(model, args)
        ppo, sapo = results["ppo"], results["sapo"]
        print(f"\n{model}: batch {args.batch} trajectories, {args.steps} timed steps (seconds per iteration)")
        print(f"{'':12}{'generation':>12}{'scoring':>10}{'updates':>10}{'learner':>10}{'iteration':>11}{'peak MB':>10}")
        for algo, row in results.items():
            print(f"{algo:12}{row['generation_s']:12.2f}{row['scoring_s']:10.2f}{row['updates_s']:10.2f}"
                  f"{row['learner_s']:10.2f}{row['iteration_s']:11.2f}{row['peak_training_mb']:10.1f}")
        ratios = {
            "learner_time_ratio": sapo["learner_s"] / ppo["learner_s"],
            "iteration_time_ratio": sapo["iteration_s"] / ppo["iteration_s"],
            "memory_ratio": sapo["peak_training_mb"] / max(ppo["peak_training_mb"], 1e-9),
        }
        print("SAPO / PPO: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in ratios.items()) + f" model={args.models.split(',')[-1]}"
          f" gradient_checkpointing={int(args.gradient_checkpointing)}")


if __name__ == "__main__":
    main()
