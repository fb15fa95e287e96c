"""``eval_difficulty="options"``: the same held-out tasks, at the env's difficulty, still fixed."""

from __future__ import annotations

import pytest

from streamrl.envs import make

EASY = {"max_receptacles": 5, "hidden_prob": 0.3, "distractors": (2, 5)}


def _initial(env, task_id):
    observation, info = env.reset(task_id=task_id)
    return observation, info["task_type"], info["goal"], len(env.expert_plan())


def test_default_keeps_the_standard_eval_sets():
    standard, easy_train_only = make("alfworld_lite"), make("alfworld_lite", **EASY)
    for task_id in ("unseen/0", "seen/5"):
        assert _initial(standard, task_id) == _initial(easy_train_only, task_id)


def test_options_rebuild_eval_sets_deterministically_with_the_same_goals():
    standard = make("alfworld_lite")
    easy_a = make("alfworld_lite", **EASY, eval_difficulty="options")
    easy_b = make("alfworld_lite", **EASY, eval_difficulty="options")
    for index in range(10):
        task_id = f"unseen/{index}"
        obs_a = _initial(easy_a, task_id)
        assert obs_a == _initial(easy_b, task_id)
        rooms = obs_a[0].split("you see ", 1)[1].split(".")[0]
        assert rooms.count(",") + 1 <= 5
        obs_standard = _initial(standard, task_id)
        assert obs_a[1] == obs_standard[1]  # same task type


def test_bad_eval_difficulty_is_named():
    with pytest.raises(ValueError, match="eval_difficulty"):
        make("alfworld_lite", eval_difficulty="hard")


def test_compact_prompt_can_remember_visited_receptacles():
    from streamrl.envs import make_prompt_builder

    env = make("alfworld_lite")
    observation, info = env.reset(task_id="train/3")
    builder = make_prompt_builder("alfworld_lite", style="compact", history_length=1, visited=True)
    history = [(observation, "go to shelf 1"), ("...", "open shelf 1"), ("...", "go to cabinet 2"), ("...", "go to shelf 1")]
    text = builder.step_messages(observation, history, "You arrive at shelf 1.", info)[0]["content"]
    assert "Visited: shelf 1, cabinet 2\n" in text
    plain = make_prompt_builder("alfworld_lite", style="compact", history_length=1)
    assert "Visited:" not in plain.step_messages(observation, history, "You arrive at shelf 1.", info)[0]["content"]
