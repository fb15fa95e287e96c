"""Does each algorithm learn? Five learners from one shared warm start, the same trajectory budget.

One warm start is built once (behaviour cloning) and saved; then ``spo``, ``spo++``, ``grpo``,
``ppo`` and ``sapo`` each train from that same folder for the same number of trajectories, and
held-out success is measured before and after. The gain (points, after minus before) is the
result; the shared warm start's own success is the baseline measured in the same run.

* ``--quick`` (under a minute on 2 cores): ``pick_object`` (one turn: write the target named among
  three listed objects). Warm start: 8 epochs of 160 expert demonstrations, enough for the copy
  circuit to form (stopping earlier leaves it to chance: ``tests/training/test_learning.py``); rollouts
  and evaluation sample at temperature 1.5, where the warm start's choice is right about 35-45% of
  the time on the 200 held-out tasks. RL sharpens the sampled policy, so this mode evaluates by
  sampling. ``--steps`` (default 75) steps of 16 trajectories per algorithm, lr 5e-4 for every
  algorithm; the shared warm start is evaluated once, and each gain is against that one baseline.
  On 2026-12-07 (2-core Xeon with AMX, ``dtype: auto`` -> bfloat16, seed 0, 44 s) the warm start
  scored 38% and 75 steps gained SPO +35, SPO++ +29.5, GRPO +20, PPO +27.5 and SAPO +30 points (the
  earlier 3-epoch warm start at temperature 1 gave +8 to +16).
* default (about 30 minutes on 2 cores): ``configs/default.yaml`` from its shipped warm start,
  ``--steps`` (default 40) steps of 32 trajectories per algorithm, greedy evaluation on the 134
  unseen alfworld_lite tasks, as the default run reports it.

    python benchmarks/learning.py [--quick] [--seed 0] [--steps N] [--out DIR]

Ends with ``RESULT spo_gain=... spo++_gain=... grpo_gain=... ppo_gain=... sapo_gain=... warm_start=...``
(points; ``warm_start`` is the shared warm start's held-out success in percent).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from streamrl.api import evaluate
from streamrl.policy.dtype_choice import processor_name
from streamrl.training.config import Config
from streamrl.training.config_files import load_config
from streamrl.training.loop import train
from streamrl.training.run import load_run_policy
from streamrl.training.sft import behaviour_cloning, collect_demonstrations

ALGORITHMS = ("spo", "spo++", "grpo", "ppo", "sapo")
REPO = Path(__file__).resolve().parents[1]

QUICK = [
    "env.name=pick_object", "env.prompt={}", "env.parser={}", "env.train_tasks=64", "env.eval_tasks=200",
    "sft.source=expert", "sft.demos=160", "sft.epochs=8", "sft.lr=3e-3", "sft.batch_size=8",
    "rollout.temperature=1.5", "eval.temperature=1.5", "rollout.max_new_tokens=8", "rollout.concurrency=16", "rollout.max_staleness=1",
    "train.batch_size=16", "train.checkpoint_every=0",
    "optim.lr=5e-4", "optim.micro_batch_size=16", "eval.greedy=false",
    "logging.samples_every=0",
]


def settings(quick: bool, seed: int, steps: int | None) -> tuple[str, list[str]]:
    if quick:
        return str(REPO / "configs" / "smoke.yaml"), [*QUICK, f"train.steps={steps or 75}", f"train.seed={seed}"]
    return str(REPO / "configs" / "default.yaml"), [
        f"train.steps={steps or 40}", "train.checkpoint_every=0", "eval.greedy=true", f"train.seed={seed}",
    ]


def warm_start(config: Config, folder: Path) -> str:
    """The shared warm start: the config's own ``model.init_from``, or SFT once, saved to ``folder``."""
    if config.model.init_from:
        return config.model.init_from
    policy = load_run_policy(config, None)
    demos = asyncio.run(collect_demonstrations(config, policy))
    behaviour_cloning(config, policy, demos)
    policy.save(folder)
    return str(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="pick_object toy, under a minute")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="RL steps per algorithm (default 75 quick, 40 otherwise)")
    parser.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    base, overrides = settings(args.quick, args.seed, args.steps)
    root = Path(args.out or tempfile.mkdtemp(prefix="streamrl-learning-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    init = warm_start(load_config(base, overrides), root / "warm_start")
    print(f"benchmark: {'quick (pick_object, sampled eval)' if args.quick else 'default (alfworld_lite, greedy eval)'}; "
          f"seed {args.seed}; processor {processor_name()}; warm start {init}", flush=True)
    gains: dict[str, float] = {}
    # one baseline for every learner: the shared warm start, evaluated once (as the runs evaluate)
    before = evaluate(load_config(base, [*overrides, f"model.init_from={init}"]))["success"]
    print(f"warm start held-out {100 * before:5.1f}%", flush=True)
    for algo in ALGORITHMS:
        config = load_config(base, [*overrides, f"model.init_from={init}", "sft.demos=0", "train.eval_at_start=false"],
                             algo=algo)
        t0 = time.perf_counter()
        summary = asyncio.run(train(config, root / algo, echo=lambda *_: None))
        after = summary["eval_after"]["success"]
        gains[algo] = 100 * (after - before)
        print(f"{algo:6s} held-out {100 * before:5.1f}% -> {100 * after:5.1f}%  gain {gains[algo]:+6.1f} points  "
              f"({config.train.steps} steps x {config.train.batch_size}, {time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"total {time.perf_counter() - started:.0f} s; runs in {root}")
    fields = " ".join(f"{algo}_gain={gains[algo]:.1f}" for algo in ALGORITHMS)
    print(f"RESULT {fields} warm_start={100 * before:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
