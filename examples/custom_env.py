"""Bring your own environment: a two-turn word game trained with SPO++ (docs/environments.md).

    python examples/custom_env.py          # from Python; or, from the repository root:
    streamrl train --config smoke --env examples.custom_env:EchoEnv env.prompt={} env.parser={} sft.demos=0
"""

import random

import streamrl
from streamrl.envs import ActionParser, Env, EnvSpec, ParsedAction, PromptBuilder, StepResult

WORDS = ["apple", "river", "stone", "cloud"]


class EchoParser(ActionParser):  # model text -> action; never raises
    def parse(self, text):
        word = text.strip().split()[0].lower() if text.strip() else ""
        return ParsedAction(word, word.isalpha())


class EchoPrompt(PromptBuilder):  # observations -> the chat the model sees
    def system_prompt(self):
        return "Repeat the word you are shown."

    def first_message(self, observation, info):
        return observation

    def next_message(self, observation, info):
        return observation

    def step_messages(self, initial_observation, history, observation, info):
        return [{"role": "user", "content": observation}]


class EchoEnv(Env):
    spec = EnvSpec(name="echo", max_steps=2, splits={"train": None, "test": 8}, eval_split="test")
    action_parser, prompt_builder = EchoParser, EchoPrompt  # what makes module:Class loadable

    def reset(self, seed=None, task_id=None, options=None):
        self.task_id, self.steps = task_id or f"train/{seed or 0}", 0
        self.word = random.Random(self.task_id).choice(WORDS)
        return f"Say: {self.word}", self._info(False)

    def step(self, action):
        self.steps += 1
        won = action == self.word
        done = won or self.steps >= self.spec.max_steps
        return StepResult("Correct." if won else f"Say: {self.word}", float(won), won, done and not won, self._info(won))

    def _info(self, won):
        return {"won": won, "score": float(won), "admissible_actions": None, "format_valid": True,
                "action_effective": True, "task_id": self.task_id, "task_type": "echo", "step": self.steps}


if __name__ == "__main__":
    streamrl.register("echo", EchoEnv, EchoParser, EchoPrompt)
    overrides = ["env.name=echo", "env.prompt={}", "env.parser={}", "sft.demos=0"]
    summary = streamrl.train("smoke", "runs/custom_env", overrides=overrides, overwrite=True)
    print(f"held-out success after {summary['steps']} steps: {summary['eval_after']['success']:.0%}")
