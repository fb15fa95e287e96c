"""A tool-form episode end to end on the tiny model's real tokenizer and tool template: the engine's
reply ids are parsed as calls, run, answered with tool messages and bridged. Token-in/token-out: the
transcript is the engine's ids plus the bridge ids, equal to the template's rendering of the whole
conversation (the tiny template is append-only); call ids are action tokens (mask 1), template and
tool-result ids are not (mask 0), and the action-token count ``L_i`` counts only the former."""

from __future__ import annotations

import asyncio
import random

import pytest

from streamrl.envs import Env, EnvSpec, Step, tool
from streamrl.envs.base import AsyncEnv
from streamrl.envs.registry import ChatPromptBuilder
from streamrl.policy.chat import ChatTemplateCodec
from streamrl.policy.protocols import GenerationResult
from streamrl.policy.tiny import load_tiny_tokenizer
from streamrl.policy.tool_format import resolve_tool_format
from streamrl.rollout import EpisodeRunner, EpisodeSettings
from streamrl.rollout.tool_calls import ToolCallParser
from streamrl.training.batch import collate

from .rollout_toys import make_record


class Vault(Env):
    """Open the vault: ``dial(number)`` until the right one, ``peek()`` says nothing useful."""

    spec = EnvSpec(name="vault", max_steps=5, splits={"train": None}, instructions="Open the vault.")

    def start(self, task_id):
        self.code = 3
        return "A vault with a dial."

    @tool
    def dial(self, number: int) -> Step | str:
        """Turn the dial to a number.

        Args:
            number: the number to dial
        """
        if number == self.code:
            return Step("Click. The vault opens.", reward=1.0, done=True, won=True)
        return f"Nothing happens at {number}."

    @tool
    def peek(self) -> str:
        """Look at the dial."""
        return "The dial shows scratches."


def tiny_codec() -> ChatTemplateCodec:
    return ChatTemplateCodec(load_tiny_tokenizer())


class ReplyEngine:
    """Answers each request with the next scripted text, tokenised by the tiny tokenizer and closed
    with the end-of-turn id; records what it generated."""

    def __init__(self, codec: ChatTemplateCodec, replies: list[str]):
        self.codec = codec
        self.replies = iter(replies)
        self.prompts: list[list[int]] = []
        self.generated: list[list[int]] = []
        self.version = 0

    async def generate(self, request):
        text = next(self.replies)
        ids = self.codec.tokenizer.encode(text, add_special_tokens=False) + [self.codec.end_of_turn_id]
        self.prompts.append(list(request.prompt_ids))
        self.generated.append(ids)
        rng = random.Random(len(self.generated))
        return GenerationResult(request.request_id, ids, [-rng.uniform(0.1, 2) for _ in ids], "stop", 0, text=self.codec.decode(ids))

    def update_weights(self, state_dict, version):
        self.version = version

    async def close(self):
        return None


def calls(*pairs: tuple[str, dict]) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "id": f"call_{i}", "function": {"name": n, "arguments": a}}
                           for i, (n, a) in enumerate(pairs)]}


def play(replies: list[str], **settings):
    codec = tiny_codec()
    tool_format, _ = resolve_tool_format(codec.tokenizer)
    engine = ReplyEngine(codec, replies)
    env = Vault()
    runner = EpisodeRunner(engine, codec, ToolCallParser(tool_format), ChatPromptBuilder(instructions="Open the vault."),
                           EpisodeSettings(tools=True, **settings))
    trajectory = asyncio.run(runner.run(AsyncEnv(env), make_record("train/0")))
    return codec, engine, env, trajectory


def written(codec, message) -> str:
    return codec.render_reply(message, tools=Vault().tools())


def test_a_tool_episode_is_the_engines_ids_plus_bridges_and_rerenders_identically():
    codec = tiny_codec()
    replies = [
        written(codec, calls(("peek", {}))),
        written(codec, calls(("dial", {"number": 1}))),
        written(codec, calls(("dial", {"number": 3}))),
    ]
    codec, engine, env, trajectory = play(replies)
    assert trajectory.end_reason == "terminated" and trajectory.won
    assert [turn.action for turn in trajectory.turns] == ["peek()", "dial(1)", "dial(3)"]
    assert [turn.tool_calls for turn in trajectory.turns][1] == [{"id": "call_0", "name": "dial", "arguments": {"number": 1}}]
    assert trajectory.turns[1].reply == [{"role": "tool", "tool_call_id": "call_0", "name": "dial", "content": "Nothing happens at 1."}]
    # token-in/token-out: what was trained on is what the engine generated, between bridges
    transcript: list[int] = []
    for turn, generated, prompt in zip(trajectory.turns, engine.generated, engine.prompts):
        assert turn.action_ids == generated
        assert prompt == transcript + turn.context_ids  # each prompt is the transcript so far
        transcript += turn.context_ids + turn.action_ids
    # the append-only template renders the whole conversation to exactly those ids
    messages = [{"role": "system", "content": "Open the vault."}, {"role": "user", "content": "A vault with a dial."}]
    for turn in trajectory.turns:
        messages += [calls(*[(c["name"], c["arguments"]) for c in turn.tool_calls])]
        if not turn.done:
            messages += turn.reply
    whole = codec.encode_chat(messages, add_generation_prompt=False, tools=env.tools())
    assert transcript == whole[: len(transcript)] and len(whole) - len(transcript) <= 1  # a trailing newline at most


def test_masks_mark_call_ids_as_actions_and_tool_results_as_observations():
    codec = tiny_codec()
    replies = [written(codec, calls(("dial", {"number": 1}))), written(codec, calls(("dial", {"number": 3})))]
    codec, engine, _, trajectory = play(replies)
    batch = collate([trajectory])
    ids, mask = batch.input_ids[0].tolist(), batch.action_mask[0].tolist()
    generated = [i for turn in engine.generated for i in turn]
    assert [i for i, m in zip(ids, mask) if m] == generated
    assert int(batch.action_mask.sum()) == trajectory.num_action_tokens == len(generated)
    assert batch.turns.action_tokens.tolist() == [len(g) for g in engine.generated]
    # the tool result's text lies in the observation ids, never under the action mask
    observed = codec.decode([i for i, m in zip(ids, mask) if not m])
    assert "Nothing happens at 1." in observed and "<tool_response>" in observed
    assert "Nothing happens" not in codec.decode(generated)


@pytest.mark.parametrize("reply, kind", [
    ('<tool_call>\n{"name": "dial", "arguments": {"number": \n</tool_call>', "unparseable_call"),
    ('<tool_call>\n{"name": "spin", "arguments": {}}\n</tool_call>', "unknown_tool"),
    ('<tool_call>\n{"name": "dial", "arguments": {}}\n</tool_call>', "bad_arguments"),
    ('<tool_call>\n{"name": "dial", "arguments": {"number": "three"}}\n</tool_call>', "bad_arguments"),
    ('<tool_call>\n{"name": "dial", "arguments": {"number": 1, "force": true}}\n</tool_call>', "bad_arguments"),
    ('<tool_call>\n{"name": "peek", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "peek", "arguments": {}}\n</tool_call>',
     "too_many_calls"),
    ("I would dial 3.", "no_tool_call"),
])
def test_a_malformed_turn_is_recorded_with_its_reason_and_the_episode_goes_on(reply, kind):
    codec = tiny_codec()
    _, engine, _, trajectory = play([reply, written(codec, calls(("dial", {"number": 3})))])
    first = trajectory.turns[0]
    assert not first.format_valid and first.info["format_problem"] == kind and first.format_reason
    assert first.action_ids == engine.generated[0]  # the ids trained on are still the engine's
    assert trajectory.end_reason == "terminated" and trajectory.won and trajectory.invalid_flags == [True, False]
    # the agent was told what went wrong, in the next prompt
    assert first.format_reason.split(";")[0] in codec.decode(engine.prompts[1])
