"""Token masks of both training layouts (environments.md section 5.3), on real episodes."""

from __future__ import annotations

import asyncio
import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.policy.protocols import SamplingParams
from streamrl.policy.scripted import CharCodec, ScriptedEngine
from streamrl.rollout import EpisodeSettings, full_history_sample, per_step_samples, to_samples

from .rollout_toys import RecordingEngine, ToyEnv, ToyPromptBuilder, play

replies = st.lists(st.text(alphabet="ab <>/!ok", max_size=14), min_size=1, max_size=6)


def scripted(reply_list: list[str]) -> RecordingEngine:
    queue = iter(reply_list * 10)
    return RecordingEngine(ScriptedEngine(lambda prompt: next(queue)))


def run(engine, turns: int, **episode) -> object:
    return asyncio.run(play(engine, ToyEnv(), f"t:{turns}", EpisodeSettings(**episode)))


def check_masks(sample, trajectory, calls, codec: CharCodec | None) -> None:
    """The section 5.3 properties; ``codec`` also checks the decoded text (exact for CharCodec)."""
    ids, mask, logprobs = sample.token_ids, sample.action_mask, sample.rollout_logprobs
    assert len(ids) == len(mask) == len(logprobs)
    results = [result for _, result in calls]
    assert sum(mask) == sum(len(r.token_ids) for r in results) == trajectory.num_action_tokens
    assert [i for i, m in zip(ids, mask) if m] == [i for r in results for i in r.token_ids]
    if codec is not None:
        assert codec.decode([i for i, m in zip(ids, mask) if m]) == "".join(r.text for r in results)
    inside = set()
    for (start, end), (request, result) in zip(sample.turn_spans, calls):
        assert ids[start:end] == result.token_ids
        assert logprobs[start:end] == result.logprobs
        # token-in/token-out: the sample holds exactly the prompt the engine was given
        assert ids[:start] == request.prompt_ids
        inside.update(range(start, end))
    # no environment or template token has mask 1, and none carries a log-prob
    assert all(mask[p] == (p in inside) for p in range(len(ids)))
    assert all(logprobs[p] == 0.0 for p in range(len(ids)) if p not in inside)


@settings(max_examples=40, deadline=None)
@given(reply_list=replies, turns=st.integers(1, 5), max_new=st.integers(2, 16), stop=st.booleans())
def test_full_history_masks_and_append_only_transcript(reply_list, turns, max_new, stop):
    engine = scripted(reply_list)
    sampling = SamplingParams(max_new_tokens=max_new, stop_strings=("!",) if stop else ())
    trajectory = run(engine, turns, sampling=sampling)
    sample = full_history_sample(trajectory)
    check_masks(sample, trajectory, engine.calls, engine.codec)
    assert len(sample.turn_spans) == len(trajectory.turns) == turns
    for position, (start, end) in zip(sample.pre_action_positions, sample.turn_spans):
        assert position == start - 1
    for (start, end), post in zip(sample.turn_spans, sample.post_action_positions):
        assert post == end - 1
    # a turn that lacks its end-of-turn token (cut by length or a stop string) is closed by an
    # inserted end-of-turn id that belongs to the environment (mask 0)
    end_id = engine.codec.end_of_turn_id
    for (start, end), turn in zip(sample.turn_spans[:-1], trajectory.turns):
        if not turn.action_ids or turn.action_ids[-1] != end_id:
            assert sample.token_ids[end] == end_id and sample.action_mask[end] == 0
        else:
            assert sample.token_ids[end] != end_id


@settings(max_examples=25, deadline=None)
@given(reply_list=st.lists(st.text(alphabet="ab <>/ok", max_size=10), min_size=1, max_size=5), turns=st.integers(1, 5))
def test_full_history_equals_one_rendering_of_the_whole_chat(reply_list, turns):
    """No re-templating drift: the grown transcript is what the chat template renders at once."""
    engine = scripted(reply_list)
    trajectory = run(engine, turns)
    builder = ToyPromptBuilder()
    messages = [{"role": "system", "content": builder.system_prompt()},
                {"role": "user", "content": builder.first_message(trajectory.initial_observation, {})}]
    for index, turn in enumerate(trajectory.turns):
        messages.append({"role": "assistant", "content": turn.action_text.removesuffix("<|im_end|>")})
        if index < len(trajectory.turns) - 1:
            messages.append({"role": "user", "content": builder.next_message(turn.observation, {})})
    rendered = engine.codec.encode_chat(messages, add_generation_prompt=False)
    assert full_history_sample(trajectory).token_ids == rendered[: -len("\n")]


@settings(max_examples=25, deadline=None)
@given(reply_list=replies, turns=st.integers(1, 5), window=st.integers(40, 140))
def test_per_step_masks_and_left_truncation(reply_list, turns, window):
    engine = scripted(reply_list)
    max_new = 8
    trajectory = run(engine, turns, layout="per_step", max_context_tokens=window,
                     sampling=SamplingParams(max_new_tokens=max_new))
    samples = per_step_samples(trajectory, trajectory_index=3)
    assert len(samples) == len(trajectory.turns) == turns
    builder = ToyPromptBuilder()
    history = []
    observation = trajectory.initial_observation
    for index, (sample, turn, call) in enumerate(zip(samples, trajectory.turns, engine.calls)):
        check_masks(sample, dataclasses.replace(trajectory, turns=[turn]), [call], engine.codec)
        assert sample.trajectory_index == 3 and sample.turn_indices == [index]
        full = engine.codec.encode_chat(builder.step_messages(trajectory.initial_observation, history, observation, {}))
        start = sample.turn_spans[0][0]
        prompt = sample.token_ids[:start]
        assert len(prompt) <= window - max_new
        # left truncation keeps the most recent tokens; the pre-action boundary is unchanged
        assert prompt == full[-len(prompt):]
        assert turn.prompt_truncated == (len(full) > window - max_new)
        assert sample.token_ids[sample.pre_action_positions[0]] == full[-1]
        history.append((observation, turn.action))
        observation = turn.observation


def test_truncated_episode_flags_and_masks_trailing_environment_text():
    engine = scripted(["<a>ok</a>"])
    env = ToyEnv(truncate_at=2)
    trajectory = asyncio.run(play(engine, env, "t:5"))
    assert trajectory.end_reason == "truncated" and trajectory.outcome == 0.0
    assert trajectory.cut
    sample = full_history_sample(trajectory)
    trailing = trajectory.trailing_context_ids
    assert trailing and sample.token_ids[-len(trailing):] == trailing
    assert sample.action_mask[-len(trailing):] == [0] * len(trailing)
    assert sample.bootstrap_position == len(sample.token_ids) - 1
    assert "Now: obs 2" in engine.codec.decode(trailing)


def test_context_limit_ends_the_episode_within_the_window():
    engine = scripted(["<a>ok</a>"])
    trajectory = run(engine, 20, max_context_tokens=200, sampling=SamplingParams(max_new_tokens=12))
    assert trajectory.end_reason == "context_limit"
    assert 1 <= len(trajectory.turns) < 20
    assert trajectory.outcome == 0.0  # an outcome exists: the episode was cut, not crashed
    sample = full_history_sample(trajectory)
    assert len(sample.token_ids) <= 200 and trajectory.cut
    # every generation had room for a full reply
    assert all(len(request.prompt_ids) + 12 <= 200 for request, _ in engine.calls)


def test_to_samples_follows_each_trajectory_layout_and_skips_empty_ones():
    full = run(scripted(["<a>ok</a>"]), 3)
    step = run(scripted(["<a>ok</a>"]), 3, layout="per_step")
    crashed = asyncio.run(play(scripted(["x"]), ToyEnv(raise_on={"reset"})))
    samples = to_samples([full, crashed, step])
    assert [s.trajectory_index for s in samples] == [0, 2, 2, 2]
    assert samples[0].turn_indices == [0, 1, 2]
    assert sum(s.num_action_tokens for s in samples[1:]) == step.num_action_tokens


def test_layout_mismatch_is_refused():
    step = run(scripted(["<a>ok</a>"]), 2, layout="per_step")
    try:
        full_history_sample(step)
    except ValueError as error:
        assert "per_step" in str(error)
    else:
        raise AssertionError("a per-step trajectory must not be packed as full history")
