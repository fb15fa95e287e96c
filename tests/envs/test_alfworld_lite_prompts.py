"""verl-agent-style and compact prompts, and the projection parser (alfworld_lite item 12)."""

from __future__ import annotations

import pytest

from streamrl.envs import make, make_parser, make_prompt_builder
from streamrl.envs.alfworld_lite.prompts import task_of, without_banner


def _episode(steps: int):
    """(initial observation, history, current observation, info) after ``steps`` expert steps."""
    env = make("alfworld_lite")
    initial, info = env.reset(task_id="unseen/4")
    history, observation = [], initial
    for _ in range(steps):
        action = info["expert_plan"][0]
        result = env.step(action)
        history.append((observation, action))
        observation, info = result.observation, result.info
    return initial, history, observation, info


def test_first_step_prompt():
    initial, _, _, info = _episode(0)
    builder = make_prompt_builder("alfworld_lite")
    [message] = builder.step_messages(initial, [], initial, info)
    content = message["content"]
    assert message["role"] == "user"
    assert content.startswith("You are an expert agent operating in the ALFRED Embodied Environment.\n")
    assert f"Your current observation is: {initial}\n" in content
    quoted = "\n ".join(f"'{a}'" for a in info["admissible_actions"] if a != "help")
    assert f"Your admissible actions of the current situation are: [{quoted}]." in content
    assert "'help'" not in content and "help" in info["admissible_actions"]
    assert "<think> </think>" in content and "<action> </action>" in content
    assert "Prior to this step" not in content


def test_later_step_prompt_shows_the_last_two_steps():
    initial, history, observation, info = _episode(3)
    content = make_prompt_builder("alfworld_lite").step_messages(initial, history, observation, info)[0]["content"]
    assert content.startswith(
        "You are an expert agent operating in the ALFRED Embodied Environment. "
        f"Your task is to: {task_of(initial)}\n"
    )
    assert "Prior to this step, you have already taken 3 step(s)." in content
    for k in (2, 3):
        obs, action = history[k - 1]
        assert f"[Observation {k}: '{obs}', Action {k}: '{action}']" in content
    assert "[Observation 1:" not in content
    assert f"You are now at step 4 and your current observation is: {observation}\n" in content
    assert "\n '" in content and "'help'" not in content
    wide = make_prompt_builder("alfworld_lite", history_length=5).step_messages(initial, history, observation, info)
    assert "[Observation 1:" in wide[0]["content"]


def test_projection_flags_missing_think_or_action():
    parser = make_parser("alfworld_lite")
    good = parser.parse("<think>the apple is hidden</think><action>Open Fridge 1</action>")
    assert good.action == "open fridge 1" and good.format_valid
    assert not parser.parse("<action>open fridge 1</action>").format_valid
    no_action = parser.parse("<think>hmm</think> open fridge 1")
    assert not no_action.format_valid and no_action.action == "<think>hmm</think> open fridge 1"[-30:]
    assert make_parser("alfworld_lite", require_think=False).parse("<action>look</action>").format_valid


def test_compact_style_is_short_and_complete():
    initial, history, observation, info = _episode(3)
    verl = make_prompt_builder("alfworld_lite").step_messages(initial, history, observation, info)[0]["content"]
    compact_builder = make_prompt_builder("alfworld_lite", style="compact", require_think=False)
    compact = compact_builder.step_messages(initial, history, observation, info)[0]["content"]
    assert len(compact) < 0.6 * len(verl)
    assert compact.startswith(f"Task: {task_of(initial)}\n")
    for _, action in history[-2:]:
        assert f"> {action}\n" in compact
    assert f"{observation}\n" in compact and "think" not in compact
    actions = [a for a in info["admissible_actions"] if a != "help"]
    listed = compact.split("Go to: ", 1)[1]
    for action in actions:
        assert action.removeprefix("go to ") in listed
    assert compact.endswith("Reply <action>one action</action>.")
    first = compact_builder.step_messages(initial, [], initial, _episode(0)[3])[0]["content"]
    assert without_banner(initial) in first and "Welcome" not in first


def test_full_history_messages():
    initial, _, observation, info = _episode(1)
    verl = make_prompt_builder("alfworld_lite")
    assert verl.system_prompt().startswith("You are an expert agent") and "<action>" in verl.system_prompt()
    assert initial in verl.first_message(initial, info)
    assert verl.next_message(observation, info).startswith(f"Your current observation is: {observation}")
    compact = make_prompt_builder("alfworld_lite", style="compact")
    assert compact.system_prompt() is None
    assert compact.first_message(initial, info).startswith(f"Task: {task_of(initial)}")
    assert compact.next_message(observation, info).startswith(observation)


def test_custom_instruction_and_bad_options():
    builder = make_prompt_builder("alfworld_lite", instruction="Answer in <action></action>.")
    initial, history, observation, info = _episode(1)
    content = builder.step_messages(initial, history, observation, info)[0]["content"]
    assert content.endswith("Answer in <action></action>.")
    with pytest.raises(ValueError, match="style"):
        make_prompt_builder("alfworld_lite", style="chatty")
    with pytest.raises(ValueError, match="history_length"):
        make_prompt_builder("alfworld_lite", history_length=-1)
