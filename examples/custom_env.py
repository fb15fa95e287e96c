"""Bring your own environment: a word game with one tool, trained with SPO++ (docs/environments.md).

    python examples/custom_env.py      # from Python; or, from the repository root, either form:
    streamrl train --config smoke --env examples.custom_env:EchoEnv --out runs/echo                   # text
    streamrl train --config smoke --env examples.custom_env:EchoEnv env.tools=true --out runs/echo    # tool calls
"""

import random

import streamrl
from streamrl.envs import Env, EnvSpec, Step, tool


class EchoEnv(Env):
    spec = EnvSpec(name="echo", max_steps=2, splits={"train": None, "test": 8}, eval_split="test",
                   instructions="Repeat the word you are shown.")

    def start(self, task_id):  # the first observation
        self.word = random.Random(task_id).choice(["apple", "river", "stone", "cloud"])
        return f"Say: {self.word}"

    def act(self, action):  # the text form: the reply is the action
        if action.strip().lower() == self.word:
            return Step("Correct.", reward=1.0, done=True, won=True)
        return f"No. Say: {self.word}"

    @tool
    def say(self, word: str) -> Step | str:
        """Say a word out loud.

        Args:
            word: the word to say
        """
        return self.act(word)


if __name__ == "__main__":
    streamrl.register("echo", EchoEnv)
    summary = streamrl.train("smoke", "runs/custom_env", overrides=["env.name=echo"], overwrite=True)
    print(f"held-out success after {summary['steps']} steps: {summary['eval_after']['success']:.0%}")
