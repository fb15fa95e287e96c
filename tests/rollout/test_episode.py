"""One episode: faults end it with a recorded reason, never with an exception."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from streamrl.envs.base import ActionParser, AsyncEnv, StepResult
from streamrl.policy.protocols import GenerationResult, SamplingParams
from streamrl.policy.scripted import ScriptedEngine
from streamrl.rollout import EpisodeSettings

from .rollout_toys import ToyEnv, ok_policy, play


def episode(engine=None, env=None, prompt_id="t:3", **settings):
    return asyncio.run(play(engine or ScriptedEngine(ok_policy), env, prompt_id, EpisodeSettings(**settings)))


def test_a_clean_episode_records_every_turn():
    trajectory = episode()
    assert trajectory.end_reason == "terminated" and trajectory.won and trajectory.outcome == 1.0
    assert [turn.action for turn in trajectory.turns] == ["ok"] * 3
    assert trajectory.rewards == [0.0, 0.0, 1.0] and trajectory.dones == [False, False, True]
    assert trajectory.turn_versions == [0, 0, 0] and trajectory.task_type == "toy"
    assert all(turn.info["format_valid"] for turn in trajectory.turns)
    assert trajectory.duration_s > 0 and trajectory.finished_at > 0


def test_weight_updates_between_turns_are_recorded_per_turn():
    engine = ScriptedEngine(ok_policy)
    calls = 0

    def policy(prompt: str) -> str:
        nonlocal calls
        calls += 1
        if calls == 2:  # the trainer publishes while the episode is running
            engine.update_weights({}, 7)
        return "<a>ok</a>"

    engine.policy = policy
    trajectory = episode(engine)
    # the engine snapshots its version per request: a result never mixes versions
    assert trajectory.turn_versions == [0, 0, 7]
    assert trajectory.min_policy_version == 0 and trajectory.max_policy_version == 7
    assert trajectory.behaviour_version == 0


def test_malformed_model_output_is_flagged_and_the_episode_continues():
    replies = iter(["garbage", "<a>ok</a>", "<a>ok"])
    trajectory = episode(ScriptedEngine(lambda prompt: next(replies)))
    assert trajectory.end_reason == "terminated" and trajectory.outcome == 0.0
    assert trajectory.invalid_flags == [True, False, True]
    assert [turn.info["format_valid"] for turn in trajectory.turns] == [False, True, False]
    assert trajectory.turns[0].action_effective is False


@pytest.mark.parametrize("where", ["reset", "step"])
def test_an_environment_that_raises_ends_the_episode_without_an_outcome(where):
    trajectory = episode(env=ToyEnv(raise_on={where}))
    assert trajectory.end_reason == "env_error" and trajectory.outcome is None
    assert f"{where} exploded" in trajectory.error
    assert trajectory.turns == []


def test_a_hanging_step_times_out_and_is_released_by_close():
    env = ToyEnv(hang_on_step=2)
    started = time.monotonic()
    trajectory = episode(env=env, env_timeout_s=0.2)
    assert time.monotonic() - started < 5
    assert trajectory.end_reason == "env_timeout" and trajectory.outcome is None
    assert len(trajectory.turns) == 1  # the first step completed
    assert env.closed  # play() closes the env, which releases the hung call


@pytest.mark.parametrize(
    "returned, message",
    [(("obs", 1.0, True), "not StepResult"), (StepResult("o", None, True, False, {}), "reward"),
     (StepResult("o", float("nan"), True, False, {}), "reward"), (StepResult(3, 0.0, True, False, {}), "observation")],
)
def test_an_environment_returning_garbage_is_an_env_error(returned, message):
    class Broken(ToyEnv):
        def step(self, action):
            return returned

    trajectory = episode(env=Broken())
    assert trajectory.end_reason == "env_error" and message in trajectory.error


def test_a_tool_timeout_raised_by_the_environment_is_an_env_error_not_a_hang():
    class SlowTool(ToyEnv):
        def step(self, action):
            raise TimeoutError("tool took too long")

    trajectory = episode(env=SlowTool(), env_timeout_s=5.0)
    assert trajectory.end_reason == "env_error" and "tool took too long" in trajectory.error


class _FixedEngine(ScriptedEngine):
    def __init__(self, result_for):
        super().__init__(ok_policy)
        self.result_for = result_for

    async def generate(self, request):
        return self.result_for(request)


@pytest.mark.parametrize(
    "result, reason",
    [
        (dict(token_ids=[5, 6], logprobs=[-0.1], finish_reason="stop"), "engine_error"),
        (dict(token_ids=[5], logprobs=[-0.1], finish_reason="error", error="CUDA OOM"), "engine_error"),
        (dict(token_ids=[5], logprobs=[float("nan")], finish_reason="stop"), "engine_error"),
        (dict(token_ids=[-1], logprobs=[-0.1], finish_reason="stop"), "engine_error"),
        (dict(token_ids=[5], logprobs=[-0.1], finish_reason="weird"), "engine_error"),
        (dict(token_ids=[5] * 99, logprobs=[-0.1] * 99, finish_reason="length"), "engine_error"),
        (dict(token_ids=[], logprobs=[], finish_reason="abort", error="preempted"), "engine_abort"),
    ],
)
def test_bad_engine_results_end_the_episode(result, reason):
    engine = _FixedEngine(lambda request: GenerationResult(request_id=request.request_id, policy_version=0, **result))
    trajectory = episode(engine, sampling=SamplingParams(max_new_tokens=16))
    assert trajectory.end_reason == reason and trajectory.outcome is None and trajectory.turns == []


def test_engine_exceptions_and_timeouts_end_the_episode():
    def explode(prompt):
        raise RuntimeError("engine died")

    crashed = episode(ScriptedEngine(explode))
    assert crashed.end_reason == "engine_error" and "engine died" in crashed.error
    slow = episode(ScriptedEngine(ok_policy, latency_s=5.0), generate_timeout_s=0.05)
    assert slow.end_reason == "engine_timeout"


def test_a_parser_that_raises_ends_the_episode():
    class BadParser(ActionParser):
        def parse(self, text):
            raise IndexError("oops")

    trajectory = asyncio.run(play(ScriptedEngine(ok_policy), parser=BadParser()))
    assert trajectory.end_reason == "parser_error" and "oops" in trajectory.error


def test_max_turns_cuts_the_episode_and_keeps_an_outcome():
    trajectory = episode(prompt_id="t:9", max_turns=2)
    assert trajectory.end_reason == "max_turns" and trajectory.outcome == 0.0 and len(trajectory.turns) == 2
    assert trajectory.cut and trajectory.trailing_context_ids


def test_the_end_of_turn_token_is_always_a_stop_token():
    engine = ScriptedEngine(ok_policy)
    episode(engine, sampling=SamplingParams(stop_token_ids=(99,)))
    assert all(set(r.sampling.stop_token_ids) == {99, engine.codec.end_of_turn_id} for r in engine.requests)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("layout", "tree", "layout"),
        ("max_turns", 0, "max_turns"),
        ("max_context_tokens", 10, "max_context_tokens"),
        ("env_timeout_s", 0, "env_timeout_s"),
    ],
)
def test_bad_settings_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        EpisodeSettings(**{field: value}, sampling=SamplingParams(max_new_tokens=16))


def test_env_steps_run_concurrently_in_the_bounded_pool():
    """Steps run in pool threads, several at once, and the pool's threads end on shutdown."""
    from streamrl.envs.base import AsyncEnv
    from streamrl.rollout import EpisodeRunner
    from streamrl.rollout.threads import EnvThreadPool

    from .rollout_toys import ToyParser, ToyPromptBuilder, make_record

    lock = threading.Lock()
    running = peak = 0

    class Overlapping(ToyEnv):
        def step(self, action):
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
            try:
                return super().step(action)
            finally:
                with lock:
                    running -= 1

    pool = EnvThreadPool(4)
    engine = ScriptedEngine(ok_policy)
    runner = EpisodeRunner(engine, engine.codec, ToyParser(), ToyPromptBuilder())

    async def main():
        envs = [AsyncEnv(Overlapping(step_delay_s=0.1), executor=pool) for _ in range(6)]
        return await asyncio.gather(*(runner.run(env, make_record("t:1", f"r{i}")) for i, env in enumerate(envs)))

    results = asyncio.run(main())
    assert all(t.end_reason == "terminated" for t in results)
    assert 2 <= peak <= 4  # concurrent, and never more threads than the pool's size
    assert pool.shutdown(timeout=5) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("streamrl-env") and t.is_alive()]


def test_run_episodes_plays_each_task_once_in_order_and_cleans_up():
    from streamrl.rollout import EpisodeRunner, run_episodes

    from .rollout_toys import ToyParser, ToyPromptBuilder, env_threads

    built: list[ToyEnv] = []

    def factory():
        built.append(ToyEnv())
        return built[-1]

    engine = ScriptedEngine(ok_policy, latency_s=0.001)
    runner = EpisodeRunner(engine, engine.codec, ToyParser(), ToyPromptBuilder(), EpisodeSettings(env_timeout_s=0.3))
    tasks = ["a:1", "boom:2", "c:3", "hang:2", "e:2", "f:1"]
    results = asyncio.run(run_episodes(runner, factory, tasks, concurrency=2))
    assert [t.prompt_id for t in results] == tasks
    assert [t.end_reason for t in results] == ["terminated", "env_error", "terminated", "env_timeout", "terminated", "terminated"]
    assert len({t.request_id for t in results}) == len(tasks)
    assert 2 <= len(built) <= 4  # environments are reused, failed ones replaced
    assert all(env.closed for env in built) and env_threads() == []


@pytest.mark.parametrize(
    "token_ids, message",
    [([5, 300], "outside the vocabulary"), ([5, 7], "banned"), ([True], "non-negative ints")],
)
def test_engine_ids_outside_the_action_vocabulary_end_the_episode(token_ids, message):
    """Issue 12: value-token or out-of-vocabulary ids must end the episode here, not crash the learner."""
    from streamrl.rollout import EpisodeRunner

    from .rollout_toys import ToyParser, ToyPromptBuilder, make_record

    engine = _FixedEngine(lambda request: GenerationResult(
        request_id=request.request_id, token_ids=list(token_ids), logprobs=[-0.1] * len(token_ids),
        finish_reason="stop", policy_version=0,
    ))
    runner = EpisodeRunner(engine, engine.codec, ToyParser(), ToyPromptBuilder(), vocab_size=300, banned_token_ids=(7,))
    env = ToyEnv()
    try:
        trajectory = asyncio.run(runner.run(AsyncEnv(env), make_record("t:2")))
    finally:
        env.close()
    assert trajectory.end_reason == "engine_error" and trajectory.outcome is None and trajectory.turns == []
    assert message in trajectory.error


def test_the_policy_codec_supplies_its_vocabulary_and_banned_value_tokens():
    from streamrl.policy.loading import load_policy
    from streamrl.rollout import EpisodeRunner

    from .rollout_toys import ToyParser, ToyPromptBuilder, make_record

    policy = load_policy("tiny")
    assert policy.value_token_ids is not None
    runner = EpisodeRunner(ScriptedEngine(ok_policy), policy, ToyParser(), ToyPromptBuilder())
    assert runner.vocab_size == policy.model.get_output_embeddings().weight.shape[0]
    assert set(policy.value_token_ids) <= runner.banned_token_ids
    for bad in (policy.value_token_ids[0], runner.vocab_size):
        engine = _FixedEngine(lambda request, bad=bad: GenerationResult(
            request_id=request.request_id, token_ids=[policy.end_of_turn_id, bad][::-1], logprobs=[-0.5, -0.5],
            finish_reason="stop", policy_version=0,
        ))
        runner.engine = engine
        env = ToyEnv()
        try:
            trajectory = asyncio.run(runner.run(AsyncEnv(env), make_record("t:2")))
        finally:
            env.close()
        assert trajectory.end_reason == "engine_error" and trajectory.turns == [], trajectory.error
