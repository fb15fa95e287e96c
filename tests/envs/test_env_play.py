"""``python -m streamrl.envs play|list`` driven through a subprocess, as a person would."""

from __future__ import annotations

import subprocess
import sys

from streamrl.envs import make


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrl.envs", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def test_play_an_alfworld_lite_episode_to_the_win():
    env = make("alfworld_lite")
    env.reset(seed=7)
    plan = env.expert_plan()
    commands = ["dance wildly", "take the moon", *plan]
    result = _cli("play", "alfworld_lite", "--seed", "7", stdin="\n".join(commands) + "\n")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Your task is to: " in out and "Admissible actions: " in out
    assert out.count("Nothing happens.") == 2
    assert "[episode over: won; reward 1; " in out
    assert "Traceback" not in out + result.stderr


def test_end_of_input_and_quit_exit_cleanly():
    eof = _cli("play", "alfworld_lite", "--task-id", "unseen/2", "--option", "grammar='legacy'", stdin="look\n")
    assert eof.returncode == 0 and "Bye." in eof.stdout
    assert "You are in the middle of a room." in eof.stdout
    quit_ = _cli("play", "guess_number", "--task-id", "test/0", stdin="50\nquit\n40\n")
    assert quit_.returncode == 0 and "50 is too" in quit_.stdout and "40 is" not in quit_.stdout


def test_errors_are_messages_not_tracebacks():
    unknown = _cli("play", "alfworld_lit", stdin="")
    assert unknown.returncode == 2 and "did you mean 'alfworld_lite'" in unknown.stderr
    bad_task = _cli("play", "alfworld_lite", "--task-id", "seen/999", stdin="")
    assert bad_task.returncode == 2 and "out of range" in bad_task.stderr
    assert "Traceback" not in unknown.stderr + bad_task.stderr


def test_list_names_every_environment():
    result = _cli("list")
    assert result.returncode == 0
    names = [line.split("\t")[0] for line in result.stdout.splitlines()]
    assert {"guess_number", "alfworld_lite", "alfworld_real"} <= set(names)
