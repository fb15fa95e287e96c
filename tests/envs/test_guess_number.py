from __future__ import annotations

import pytest

from streamrl.envs import make, make_parser, make_prompt_builder


def _binary_search(env, task_id: str) -> list:
    env.reset(task_id=task_id)
    low, high, results = 1, 100, []
    while True:
        guess = (low + high) // 2
        result = env.step(str(guess))
        results.append(result)
        if result.terminated or result.truncated:
            return results
        if "too low" in result.observation:
            low = guess + 1
        else:
            assert "too high" in result.observation
            high = guess - 1


def test_binary_search_wins_every_test_task_within_seven_guesses():
    env = make("guess_number")
    secrets = set()
    for task_id in env.task_ids("test"):
        results = _binary_search(env, task_id)
        last = results[-1]
        assert last.terminated and not last.truncated and last.info["won"] and last.reward == 1.0
        assert last.info["reason"] == "won" and len(results) <= 7
        assert all(r.reward == 0.0 and not r.info["won"] for r in results[:-1])
        secrets.add(int(last.observation.split()[0]))
    assert secrets == set(range(1, 101))  # the 1,000 test tasks cover every secret


def test_invalid_text_is_flagged_and_leaves_the_game_state_unchanged():
    env = make("guess_number")
    _, info = env.reset(task_id="test/0")
    for junk in ("fifty", "", "101", "0", "3.5", "<action>7</action>", "1 2"):
        result = env.step(junk)
        assert not result.info["format_valid"] and not result.info["action_effective"]
        assert result.info["anchor"] == info["anchor"]  # the known interval did not move
        assert result.reward == 0.0 and not result.terminated
        if result.truncated:
            break
    assert result.info["step"] == 7 and result.truncated and result.info["reason"] == "max_steps"


def test_truncated_at_max_steps_with_zero_reward():
    secret = int(_binary_search(make("guess_number"), "test/1")[-1].observation.split()[0])
    wrong = [str(g) for g in range(1, 101) if g != secret][:3]
    env = make("guess_number", max_steps=3)
    assert env.spec.max_steps == 3
    env.reset(task_id="test/1")
    results = [env.step(guess) for guess in wrong]
    assert not any(r.truncated or r.terminated for r in results[:-1])
    last = results[-1]
    assert last.truncated and not last.terminated and last.reward == 0.0
    assert last.info["reason"] == "max_steps" and not last.info["won"]
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("50")


def test_same_seed_same_trajectory_and_seed_picks_a_train_task():
    first, second = make("guess_number"), make("guess_number")
    obs_a, info_a = first.reset(seed=11)
    obs_b, info_b = second.reset(task_id="train/11")
    assert (obs_a, info_a) == (obs_b, info_b) and info_a["task_id"] == "train/11"
    trace_a = [first.step(g) for g in ("50", "x", "25", "75")]
    trace_b = [second.step(g) for g in ("50", "x", "25", "75")]
    assert trace_a == trace_b


def test_bad_task_ids_and_options_are_named():
    env = make("guess_number")
    with pytest.raises(ValueError, match="bad task_id"):
        env.reset(task_id="valid/3")
    with pytest.raises(ValueError, match="out of range"):
        env.reset(task_id="test/1000")
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(seed=1, options={"difficulty": 3})
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        env.reset(seed=-1)
    with pytest.raises(RuntimeError, match="reset"):
        make("guess_number").step("50")
    with pytest.raises(ValueError, match="unbounded"):
        env.task_ids("train")
    assert len(env.task_ids("test")) == 1000


def test_parser_accepts_an_action_tag_or_a_bare_integer():
    parser = make_parser("guess_number")
    assert parser.parse("<action>42</action>").action == "42"
    assert parser.parse("I think <action> 7 </action> is right").action == "7"
    assert parser.parse(" 13\n").action == "13" and parser.parse(" 13\n").format_valid
    for bad in ("I guess 42", "<action>forty</action>", "", "4 2"):
        assert not parser.parse(bad).format_valid


def test_prompts_are_short_and_carry_the_feedback():
    env = make("guess_number")
    builder = make_prompt_builder("guess_number")
    initial, info = env.reset(task_id="test/2")
    history, observation = [], initial
    for guess in ("50", "25", "12"):
        result = env.step(guess)
        history.append((observation, guess))
        observation, info = result.observation, result.info
        if result.terminated:
            break
    messages = builder.step_messages(initial, history, observation, info)
    content = messages[0]["content"]
    assert len(content) < 300
    for (_, guess), feedback in zip(history, [obs for obs, _ in history[1:]] + [observation], strict=True):
        assert f"Guess {guess}: {feedback}" in content
    last_only = make_prompt_builder("guess_number", history_length=1).step_messages(initial, history, observation, info)
    assert f"Guess {history[0][1]}:" not in last_only[0]["content"] and observation in last_only[0]["content"]
    assert "<action>N</action>" in builder.first_message(initial, info)
