"""A coin-flip environment for trainer tests: outcomes vary from the first step, whatever the
policy writes, so every algorithm gets non-degenerate advantages with an untrained tiny model."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from streamrl.envs import ActionParser, Env, EnvSpec, ParsedAction, PromptBuilder, StepResult, make, register
from streamrl.policy.hf_engine import HFEngine
from streamrl.rollout.play_tasks import run_episodes
from streamrl.training.config_files import load_config
from streamrl.training.evaluate import episode_runner, episode_settings


class CoinEnv(Env):
    spec = EnvSpec(name="coin", max_steps=3, splits={"train": None, "test": 16}, eval_split="test")

    def reset(self, seed=None, task_id=None, options=None):
        self.task_id = task_id or f"train/{seed or 0}"
        self.rng = random.Random(f"{self.task_id}:{seed}")
        self.turns = self.rng.randint(1, 3)
        self.step_count = 0
        self.actions: list[str] = []
        return "Flip.", self._info(False)

    def step(self, action: str) -> StepResult:
        self.step_count += 1
        done = self.step_count >= self.turns
        self.actions.append(action)
        # the outcome depends on what the policy wrote, so members of a GRPO group differ
        won = done and random.Random(f"{self.task_id}:{self.actions}").random() < 0.5
        info = self._info(won)
        if done:
            info["reason"] = "won" if won else "lost"
        return StepResult("Again." if not done else "End.", float(won), done, False, info)

    def _info(self, won: bool) -> dict[str, Any]:
        return {"won": won, "score": float(won), "admissible_actions": None, "format_valid": True,
                "action_effective": True, "task_id": self.task_id, "task_type": "coin", "step": getattr(self, "step_count", 0)}


class AnyText(ActionParser):
    def parse(self, text: str) -> ParsedAction:
        return ParsedAction(text.strip()[:20], True)


class CoinPrompt(PromptBuilder):
    def system_prompt(self):
        return None

    def first_message(self, observation, info):
        return observation

    def next_message(self, observation, info):
        return observation

    def step_messages(self, initial_observation, history, observation, info):
        return [{"role": "user", "content": observation}]


register("coin", CoinEnv, AnyText, CoinPrompt, overwrite=True)


@pytest.fixture
def coin_config():
    def build(algo: str, *overrides: str):
        extra = ["algo.group_size=4"] if algo == "grpo" else []
        return load_config(
            "configs/smoke.yaml",
            ["env.name=coin", "env.prompt={}", "env.parser={}", "sft.demos=0", "train.eval_at_start=false",
             "env.eval_tasks=4", "rollout.max_new_tokens=6", "optim.lr=1e-3", *extra, *overrides],
            algo=algo,
        )
    return build


@pytest.fixture
def coin_rollouts():
    """``coin_rollouts(config, policy)``: 8 coin episodes (``train/0`` .. ``train/7``) played by ``policy``."""
    def play(config, policy):
        async def run():
            engine = HFEngine.from_policy(policy, seed=1)
            try:
                return await run_episodes(episode_runner(config, engine, policy, episode_settings(config)),
                                          lambda: make("coin"), [f"train/{i}" for i in range(8)], concurrency=8)
            finally:
                await engine.close()

        return asyncio.run(run())
    return play
