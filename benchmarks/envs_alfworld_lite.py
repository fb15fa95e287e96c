"""alfworld_lite: simulator speed and how three scripted policies fare on the eval sets.

Speed: milliseconds per reset + privileged-expert episode, and microseconds per step of a random
admissible policy with and without ``info["expert_plan"]`` (the baseline, measured in this run).
Policies: the privileged expert, the non-privileged searching expert and a random admissible
policy, over the 134 unseen and 140 seen tasks (success rate and mean steps of won episodes).

    python benchmarks/envs_alfworld_lite.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from streamrl.envs import make
from streamrl.envs.alfworld_lite import SearchingExpert


def play(env, task_id: str, policy: str, rng: random.Random) -> tuple[bool, int]:
    observation, info = env.reset(task_id=task_id)
    searcher = SearchingExpert()
    searcher.reset(observation)
    while True:
        if policy == "expert":
            action = env.expert_action()
        elif policy == "search":
            action = searcher.act(observation, info["admissible_actions"])
        else:
            action = rng.choice(info["admissible_actions"])
        result = env.step(action)
        observation, info = result.observation, result.info
        if result.terminated or result.truncated:
            return info["won"], info["step"]


def random_steps_per_second(expert_plan: bool, episodes: int) -> float:
    env, rng, steps = make("alfworld_lite", expert_plan=expert_plan), random.Random(0), 0
    start = time.perf_counter()
    for i in range(episodes):
        _, info = env.reset(task_id=f"train/{i}")
        while True:
            result = env.step(rng.choice(info["admissible_actions"]))
            info, steps = result.info, steps + 1
            if result.terminated or result.truncated:
                break
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timing episodes (the eval sets run in full)")
    args = parser.parse_args()
    episodes = 60 if args.quick else 400

    env = make("alfworld_lite", expert_plan=False)
    env.reset(task_id="train/0")  # build the cached eval sets before timing
    start = time.perf_counter()
    for i in range(episodes):
        play(env, f"train/{1000 + i}", "expert", random.Random(0))
    episode_ms = (time.perf_counter() - start) / episodes * 1000
    base = random_steps_per_second(False, episodes // 2)
    with_plan = random_steps_per_second(True, episodes // 2)
    print(f"reset + expert episode: {episode_ms:.2f} ms")
    print(f"random-policy step: {1e6 / base:.0f} us without expert_plan in info (baseline), "
          f"{1e6 / with_plan:.0f} us with it: {base / with_plan:.2f}x the baseline cost")

    results: dict[str, float] = {
        "episode_ms": round(episode_ms, 3),
        "step_cost_ratio_expert_info": round(base / with_plan, 3),
    }
    for split in ("unseen", "seen"):
        for policy in ("expert", "search", "random"):
            rng = random.Random(0)
            outcomes = [play(env, task_id, policy, rng) for task_id in env.task_ids(split)]
            won = [steps for ok, steps in outcomes if ok]
            rate = len(won) / len(outcomes)
            mean = statistics.mean(won) if won else float("nan")
            print(f"{split:6s} {policy:6s}: success {len(won)}/{len(outcomes)} ({rate:.1%}), "
                  f"mean steps when won {mean:.1f}")
            results[f"{split}_{policy}_success"] = round(rate, 4)
            results[f"{split}_{policy}_steps"] = round(mean, 2)
    print("RESULT " + " ".join(f"{key}={value}" for key, value in results.items()))


if __name__ == "__main__":
    main()
