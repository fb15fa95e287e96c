"""Learning is behaviour: RL must raise held-out success on a toy task, end to end.

The toy is a one-turn contextual choice: the prompt names a target among a few listed objects
and success is writing the target. A weak warm start (behaviour cloning on a *random* listed
object) knows the format but is right about 1 time in 3, so any learner bug that stops learning
(a sign error, a broken optimiser step, weights that never reach the engine, advantages that
vanish) leaves held-out success where the warm start put it and fails this test.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from streamrl.envs import ActionParser, Env, EnvSpec, ParsedAction, StepResult, register
from streamrl.envs.common import tagged_text
from streamrl.train.config import load_config
from streamrl.train.loggers import read_metrics
from streamrl.train.loop import train

from .conftest import CoinPrompt as ObservationPrompt  # the prompt is the observation alone

OBJECTS = ("apple", "mug", "knife", "book", "pen", "cup", "plate", "pan", "egg", "box")
CHOICES = 3


def _task(task_id: str) -> tuple[list[str], str]:
    rng = random.Random(f"pick/{task_id}")
    listed = rng.sample(OBJECTS, CHOICES)
    return listed, rng.choice(listed)


class PickEnv(Env):
    spec = EnvSpec(name="pick", max_steps=1, splits={"train": None, "test": 48}, eval_split="test")

    def reset(self, seed=None, task_id=None, options=None):
        self.task_id = task_id or f"train/{seed or 0}"
        self.listed, self.target = _task(self.task_id)
        return f"Take the {self.target}. You see: {', '.join(self.listed)}.", self._info(False)

    def step(self, action: str) -> StepResult:
        won = action.strip() == self.target
        info = {**self._info(won), "reason": "won" if won else "lost"}
        return StepResult("Done.", float(won), True, False, info)

    def _info(self, won: bool) -> dict:
        return {"won": won, "score": float(won), "admissible_actions": None, "format_valid": True,
                "action_effective": True, "task_id": self.task_id, "task_type": "pick", "step": 0}


class ActionTag(ActionParser):
    def parse(self, text: str) -> ParsedAction:
        inner = tagged_text(text, "action")
        return ParsedAction((inner or "").strip(), inner is not None)


register("pick", PickEnv, ActionTag, ObservationPrompt, overwrite=True)


def _random_choice_demos(path, count: int, pool: int) -> None:
    """Demonstrations of the format with a random listed object (right 1 time in CHOICES)."""
    rng = random.Random(0)
    with path.open("w") as out:
        for i in range(pool, pool + count):
            listed, _ = _task(f"train/{i}")
            out.write(json.dumps({"task_id": f"train/{i}", "actions": [f"<action>{rng.choice(listed)}</action>"]}) + "\n")


# Known failure (issue 11, measured 2026-12-01): from a 27% warm start SPO++ reaches only 33%
# after 30 steps at lr 3e-4 (19% at 1e-3; GRPO 29%, SPO 6%), and loses the format at lr 2e-3.
# A variant with a fixed target does learn (sampled success 0.5 -> 0.9 in 30 steps), so the sign
# of the update is right; what RL does not build in 480 samples is the copy-from-context circuit.
# Strict: once it learns this toy, xfail reports XPASS as a failure and the marker goes.
@pytest.mark.xfail(strict=True, reason="issue 11: SPO++ does not yet learn the pick toy by a clear margin")
@pytest.mark.parametrize("algo", ["spo++"])
def test_rl_raises_held_out_success_over_a_weak_warm_start(algo, tmp_path):
    demos = tmp_path / "demos.jsonl"
    _random_choice_demos(demos, 160, pool=64)
    config = load_config("configs/smoke.yaml", [
        "env.name=pick", "env.prompt={}", "env.parser={}", "env.train_tasks=64", "env.eval_tasks=48",
        f"sft.source={demos}", "sft.demos=160", "sft.epochs=8", "sft.only_successes=false", "sft.lr=3e-3", "sft.batch_size=8",
        "rollout.max_new_tokens=8", "rollout.concurrency=16", "rollout.max_staleness=1",
        "train.steps=30", "train.batch_size=16", "train.checkpoint_every=0",
        "optim.lr=3e-4", "optim.micro_batch_size=16", "eval.greedy=true",
    ], algo=algo)
    summary = asyncio.run(train(config, tmp_path / "run", echo=lambda *_: None))
    before, after = summary["eval_before"]["success"], summary["eval_after"]["success"]
    assert before < 0.6, f"the warm start should be weak: {before:.2f}"
    assert after >= before + 0.3, f"{algo} did not learn: held-out success {before:.2f} -> {after:.2f}"
    train_rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert train_rows[-1]["success"] > train_rows[0]["success"]
