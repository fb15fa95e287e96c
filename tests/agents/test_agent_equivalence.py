"""An agent trained through the endpoint trains on exactly what the environment's own tool form would:
``examples/openai_agent.py`` on pick_object's tasks and the ``pick_object`` environment with
``env.tools=true``, answered by the same engine, give the same prompt ids, generated ids, log-probs,
masks and rewards. So the tool form's learning test (tests/training/test_tool_learning.py) vouches for
what the agent path feeds the learner too."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import re
from pathlib import Path

import pytest

from streamrl.agents import AgentBackend, AgentSettings
from streamrl.envs import make
from streamrl.envs.base import AsyncEnv
from streamrl.envs.pick_object import PickObjectPromptBuilder, task
from streamrl.policy.loading import load_policy
from streamrl.policy.protocols import GenerationResult
from streamrl.policy.tool_format import resolve_tool_format
from streamrl.rollout import EpisodeRunner, EpisodeSettings
from streamrl.rollout.tool_calls import ToolCallParser
from streamrl.rollout.trajectory import DispatchRecord
from streamrl.training.batch import collate

ROOT = Path(__file__).resolve().parents[2]


def example_agent():
    spec = importlib.util.spec_from_file_location("openai_agent", ROOT / "examples" / "openai_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run


class Picker:
    """An engine that takes the object the prompt names (or a wrong one), as the tiny tokenizer writes it."""

    def __init__(self, policy, right: bool):
        self.policy, self.right, self.version = policy, right, 0

    async def generate(self, request):
        prompt = self.policy.decode(request.prompt_ids)
        target, listed = re.findall(r"Take the (\w+)\. You see: ([\w, ]+)\.", prompt)[-1]
        chosen = target if self.right else next(o for o in listed.split(", ") if o != target)
        text = f'<tool_call>\n{{"name": "take", "arguments": {{"object": "{chosen}"}}}}\n</tool_call>'
        ids = self.policy.tokenizer.encode(text, add_special_tokens=False) + [self.policy.end_of_turn_id]
        rng = random.Random(request.prompt_ids[-5:].__repr__())
        return GenerationResult(request.request_id, ids, [-rng.uniform(0.1, 2) for _ in ids], "stop", 0, text=text)

    def update_weights(self, state_dict, version):
        self.version = version

    async def close(self):
        return None


@pytest.mark.parametrize("right", [True, False])
def test_the_agent_path_and_the_tool_form_train_on_the_same_ids(right):
    policy = load_policy("tiny:hidden=64,layers=2,heads=4,kv_heads=2,intermediate=128", seed=0)
    engine = Picker(policy, right)
    tool_format = resolve_tool_format(policy)[0]
    task_id = "train/7"
    record = DispatchRecord(request_id="r0", prompt_id=task_id, seq=0, policy_version=0)

    runner = EpisodeRunner(engine, policy, ToolCallParser(tool_format), PickObjectPromptBuilder(tools=True),
                           EpisodeSettings(tools=True))
    env = make("pick_object")
    through_env = asyncio.run(runner.run(AsyncEnv(env), record))
    env.close()

    listed, target = task(task_id, 3)
    agent_task = {"id": task_id, "target": target, "prompt": f"Take the {target}. You see: {', '.join(listed)}."}

    async def through_agent():
        backend = AgentBackend(engine, policy, tool_format, example_agent(), [agent_task], AgentSettings(timeout_s=30))
        try:
            return (await backend.play(record))[0]
        finally:
            await backend.close()

    agent = asyncio.run(through_agent())
    assert (agent.outcome, agent.won) == (through_env.outcome, through_env.won) == (float(right), right)
    assert len(agent.turns) == len(through_env.turns) == 1
    mine, theirs = agent.turns[0], through_env.turns[0]
    assert mine.context_ids == theirs.context_ids  # the same prompt ids: messages and tool schema render alike
    assert (mine.action_ids, mine.logprobs, mine.reward) == (theirs.action_ids, theirs.logprobs, theirs.reward)
    a, b = collate([agent]), collate([through_env])
    assert a.input_ids.tolist() == b.input_ids.tolist() and a.action_mask.tolist() == b.action_mask.tolist()
