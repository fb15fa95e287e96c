"""Issue 33: an environment's error text is kept where a user looks (events.jsonl, samples.jsonl),
and long texts in samples are cut, the cut marked."""

from __future__ import annotations

import asyncio
import json

from streamrl.envs import Env, EnvSpec, Step, register
from streamrl.training.config_files import load_config
from streamrl.training.loop import train


class Flaky(Env):
    """Every third task raises on its first step; observations are long."""

    spec = EnvSpec(name="flaky", max_steps=2, splits={"train": None, "test": 4}, eval_split="test")

    def start(self, task_id):
        self.fails = int(task_id.split("/")[1]) % 3 == 0
        return "Say anything. " + "word " * 150

    def act(self, action):
        if self.fails:
            raise ValueError("the simulator lost its map of the kitchen")
        return Step("Fine.", reward=1.0, done=True, won=True)


def test_environment_errors_keep_their_text_and_samples_are_capped(tmp_path):
    register("flaky", Flaky)
    config = load_config("configs/smoke.yaml", [
        "env.name=flaky", "sft.demos=0", "train.steps=2", "train.batch_size=6", "rollout.concurrency=6",
        "logging.samples_every=1", "logging.samples_per_step=6", "logging.sample_text_chars=200", "env.eval_tasks=2",
    ], note=lambda _: None)
    asyncio.run(train(config, tmp_path / "run", echo=lambda *_: None))
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["event"] == "result" and e["end_reason"] == "env_error"]
    assert failed and all("ValueError: the simulator lost its map of the kitchen" in e["error"] for e in failed)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    crashed = [s for s in samples if s["end_reason"] == "env_error"]
    assert crashed and "the simulator lost its map" in crashed[0]["error"]
    assert all(len(s["task"]) < 300 and s["task"].endswith("more characters cut]") for s in samples)
    index = (tmp_path / "run" / "report" / "index.md").read_text()
    assert "training episodes crashed (env_error: " in index and "the simulator lost its map of the kitchen" in index


class Breaks(Env):
    """Works for the first 12 episodes of the process, then every step raises."""

    spec = EnvSpec(name="breaks", max_steps=1, splits={"train": None, "test": 2}, eval_split="test")
    played = 0

    def start(self, task_id):
        return "Say anything."

    def act(self, action):
        Breaks.played += 1
        if Breaks.played > 12:
            raise OSError("the simulator's socket closed")
        return Step("Fine.", reward=float(Breaks.played % 2), done=True, won=bool(Breaks.played % 2))


def test_a_dead_environment_stops_training_after_its_own_setting_with_a_checkpoint(tmp_path):
    from streamrl.rollout import DeadEnvironmentError
    from streamrl.training.checkpoint import latest_valid

    register("breaks", Breaks)
    Breaks.played = 0
    config = load_config("configs/smoke.yaml", [
        "env.name=breaks", "sft.demos=0", "train.steps=50", "train.batch_size=4", "rollout.concurrency=2",
        "train.eval_at_start=false", "train.checkpoint_every=0", "rollout.max_env_faults_in_row=3",
        "rollout.max_staleness=0",
    ], note=lambda _: None)
    try:
        asyncio.run(train(config, tmp_path / "run", echo=lambda *_: None))
    except DeadEnvironmentError as error:
        assert "socket closed" in str(error) or "3" in str(error)
    else:
        raise AssertionError("training should have stopped on the failing environment")
    checkpoint = latest_valid(tmp_path / "run" / "checkpoints")
    assert checkpoint is not None and checkpoint.step >= 2  # what was learned before it broke is kept
