"""SmolLM2's RL learner step and greedy evaluation: the path before issue 56 against the new one,
measured side by side in one run, plus the peak memory of a short RL run of the config.

* **Step**: the learner update of ``configs/smollm2_alfworld.yaml`` (SPO++, LoRA r=16 in the top 8
  of 30 blocks) on ``--episodes`` full-history episodes of the size that config plays (a prompt of
  about 480 ids, then turns of about 35 action and 100 observation ids: about 1,900 ids each), half
  of them won, one learner thread (what the loop gives the learner while the engine generates).
  Old: every block runs forward, micro-batches of 4, no recomputation (the config before issue
  56). New: the config as it is (the learner starts from the engine's inputs of the lowest trained
  block, ``GenerationResult.block_inputs``, computed here once, untimed, the way the engine computes
  them while it generates; micro-batches of 2 with the trained blocks recomputed). Between them,
  each lever alone: block inputs with the old micro-batches (``reuse``), and the new path on two
  threads (``two_threads``: a learner with the machine to itself). Each path's second update is
  timed (the first grows the heap).
* **Eval**: greedy evaluation of ``--tasks`` unseen tasks with the shipped warm start through
  ``evaluate``: the engine on one thread (what the loop gave it) against every core (what an
  evaluation gets now: the learner is idle).
* **Peak RSS**: ``streamrl train`` of the config for two steps of 8 episodes (the issue's command;
  ``--quick``: 4 episodes of at most 6 turns), its peak resident memory as the kernel counts it for the child process.

Usage:
    python benchmarks/pretrained_step.py [--quick] [--smoke] [--episodes N] [--tasks N] [--threads N]

``--smoke`` runs every part on a small tiny model (what the test suite runs). The last line is
``RESULT step_speedup=<old s / new s> eval_speedup=<old s / new s> peak_rss_gb=<GB>
reuse_speedup=<old s / block inputs alone s> two_thread_speedup=<old s / new on 2 threads s>``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from streamrl.policy.dtype_choice import processor_name  # noqa: E402
from streamrl.policy.engines import make_engine  # noqa: E402
from streamrl.rollout.trajectory import DispatchRecord, Trajectory, Turn  # noqa: E402
from streamrl.training.allocator import keep_freed_memory  # noqa: E402
from streamrl.training.assemble import make_learner  # noqa: E402
from streamrl.training.config_files import load_config  # noqa: E402
from streamrl.training.evaluate import evaluate  # noqa: E402
from streamrl.training.run import load_run_policy  # noqa: E402

CONFIG = "configs/smollm2_alfworld.yaml"
SMOKE = ["model.spec=tiny:hidden=64,layers=4,heads=4,kv_heads=2,intermediate=128", "model.init_from=null", "sft.demos=0",
         "model.train_top_layers=2", "rollout.max_turns=3", "rollout.max_new_tokens=8", "rollout.concurrency=4",
         "rollout.max_context_tokens=512", "env.train_tasks=8", "env.eval_tasks=2"]


def episode(index: int, vocab: int, prompt: int, turns: int, action: int, observation: int, won: bool) -> Trajectory:
    """A full-history episode of random ids in the config's proportions."""
    generator = torch.Generator().manual_seed(index)

    def ids(n: int) -> list[int]:
        return torch.randint(16, vocab, (n,), generator=generator).tolist()

    played = [
        Turn(context_ids=ids(prompt if t == 0 else observation), action_ids=ids(action), logprobs=[-1.0] * action,
             action_text="", action="", format_valid=True, action_effective=True,
             reward=float(won and t == turns - 1), done=t == turns - 1, finish_reason="stop", policy_version=0,
             observation="")
        for t in range(turns)
    ]
    dispatch = DispatchRecord(request_id=f"r{index}", prompt_id=f"train/{index}", seq=index, policy_version=0, z=0.0, baseline=0.5)
    return Trajectory(dispatch, "full_history", played, outcome=float(won), won=won)


def add_block_inputs(trajectories: list[Trajectory], model, block: int) -> None:
    """What the engine hands over: block ``block``'s inputs at every id fed (all but the last)."""
    for t in trajectories:
        fed = [i for turn in t.turns for i in (*turn.context_ids, *turn.action_ids)][:-1]
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([fed]), output_hidden_states=True).hidden_states[block]
        t.block_inputs, t.block_inputs_layer = [hidden[0]], block


def time_update(config, policy, trajectories: list[Trajectory], threads: int, reuse: bool) -> tuple[float, dict]:
    """Seconds of the second of two learner steps on ``trajectories`` (fresh copies of the policy),
    with or without the engine's block inputs."""
    torch.set_num_threads(threads)
    learner = make_learner(config, copy.deepcopy(policy))
    if not reuse:
        learner.reused_block = None
    learner.step(trajectories)
    start = time.perf_counter()
    metrics = learner.step(trajectories)
    return time.perf_counter() - start, metrics


def time_eval(config, policy, threads: int) -> tuple[float, float]:
    async def run():
        engine = make_engine(config.model.engine, policy, seed=0, threads=threads)
        try:
            start = time.perf_counter()
            result = await evaluate(config, engine, policy)
            return time.perf_counter() - start, result.success
        finally:
            await engine.close()

    torch.set_num_threads(1)  # the main thread only waits
    return asyncio.run(run())


def peak_rss_gb(overrides: list[str]) -> float:
    """Peak resident GiB of ``streamrl train`` of the config for two steps (a child process)."""
    with tempfile.TemporaryDirectory() as out:
        command = [str(Path(sys.executable).parent / "streamrl"), "train", "--config", CONFIG, "--out", out, "--overwrite",
                   *overrides]
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="2 episodes, 2 evaluation tasks, a two-step run of 4 episodes of at most 6 turns")
    parser.add_argument("--smoke", action="store_true", help="every part on a small tiny model (tests)")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="the learner's threads during a step")
    args = parser.parse_args()
    keep_freed_memory()
    short = args.quick or args.smoke
    episodes, tasks = (2, 2) if short else (args.episodes, args.tasks)
    overrides = SMOKE if args.smoke else []
    config = load_config(CONFIG, [*overrides, f"env.eval_tasks={tasks}", "train.seed=0"])
    old_config = load_config(CONFIG, [*overrides, "model.gradient_checkpointing=false", "optim.micro_batch_size=4"])
    policy = load_run_policy(config, None)
    block = make_learner(config, policy).reused_block
    assert block is not None, "the config trains only its top blocks"
    vocab = policy.model.config.vocab_size
    sizes = (40, 3, 6, 10) if args.smoke else (480, 11, 35, 100)
    trajectories = [episode(i, vocab, *sizes, won=i % 2 == 0) for i in range(episodes)]
    add_block_inputs(trajectories, policy.model, block)
    seconds, metrics = {}, {}
    for name, path_config, threads, reuse in (("old", old_config, args.threads, False), ("reuse", old_config, args.threads, True),
                                              ("new", config, args.threads, True), ("two_threads", config, 2, True)):
        seconds[name], metrics[name] = time_update(path_config, policy, trajectories, threads, reuse)
        assert metrics[name]["block_inputs_reused"] == float(reuse)
    length = sum(len(turn.context_ids) + len(turn.action_ids) for turn in trajectories[0].turns)
    print(f"step ({episodes} episodes of {length} ids, {args.threads} learner thread): old {seconds['old']:.1f} s -> "
          f"new {seconds['new']:.1f} s: {seconds['old'] / seconds['new']:.2f}x; block inputs alone {seconds['reuse']:.1f} s, "
          f"new on 2 threads {seconds['two_threads']:.1f} s; policy loss old {metrics['old']['policy_loss']:.6f}, "
          f"new {metrics['new']['policy_loss']:.6f}")
    old_eval_s, old_success = time_eval(config, policy, 1)
    new_eval_s, new_success = time_eval(config, policy, os.cpu_count() or 1)
    print(f"eval ({tasks} tasks, greedy): old {old_eval_s:.1f} s -> new {new_eval_s:.1f} s: "
          f"{old_eval_s / new_eval_s:.2f}x; success {old_success:.3f} / {new_success:.3f}")
    run = [*overrides, "train.steps=2", "train.eval_at_start=false", "reward.ineffective_penalty=0.1",
           *(["env.eval_tasks=1", "train.batch_size=4", "rollout.max_turns=6"] if short else ["env.eval_tasks=4", "train.batch_size=8"])]
    rss = peak_rss_gb(run)
    print(f"two-step RL run ({' '.join(run)}): peak RSS {rss:.2f} GiB; processor: {processor_name()}")
    print(f"RESULT step_speedup={seconds['old'] / seconds['new']:.2f} eval_speedup={old_eval_s / new_eval_s:.2f} "
          f"peak_rss_gb={rss:.2f} reuse_speedup={seconds['old'] / seconds['reuse']:.2f} "
          f"two_thread_speedup={seconds['old'] / seconds['two_threads']:.2f}")


if __name__ == "__main__":
    main()
