"""Small in-test environment, parser and prompt builder for rollout tests (pure Python)."""

from __future__ import annotations

import threading
import time
from typing import Any

from streamrl.envs.base import ActionParser, Env, EnvSpec, ParsedAction, PromptBuilder, StepResult
from streamrl.policy.scripted import ScriptedEngine


class ToyEnv(Env):
    """Task ``"<name>:<turns>"`` ends after ``turns`` steps with reward 1 if every action was
    ``"ok"`` (0 otherwise). Each step says ``obs <n>``; ``step_delay_s`` sleeps in the thread.

    Faults for tests: ``raise_on`` = {"reset"} or {"step"}; ``hang_on_step`` blocks the step until
    ``close`` is called (or ``hang_limit_s`` passes), as a hung tool would. Task names can ask for
    them too: ``boom...`` raises on step, ``hang...`` hangs on step 1, ``slow...`` sleeps 50 ms a step.
    """

    spec = EnvSpec(name="toy", max_steps=20)

    def __init__(self, *, step_delay_s: float = 0.0, raise_on: set[str] | None = None,
                 hang_on_step: int | None = None, hang_limit_s: float = 30.0, truncate_at: int | None = None):
        self.step_delay_s = step_delay_s
        self.raise_on = raise_on or set()
        self.hang_on_step = hang_on_step
        self.hang_limit_s = hang_limit_s
        self.truncate_at = truncate_at
        self._released = threading.Event()
        self.closed = False
        self.turns = 0
        self.step_count = 0
        self.all_ok = True

    def reset(self, seed: int | None = None, task_id: str | None = None, options: dict[str, Any] | None = None):
        if "reset" in self.raise_on:
            raise RuntimeError("reset exploded")
        name, _, turns = (task_id or "t:2").partition(":")
        self.turns = int(turns or 2)
        if name.startswith("boom"):
            self.raise_on = {"step"}
        if name.startswith("hang"):
            self.hang_on_step = 1
        if name.startswith("slow"):
            self.step_delay_s = 0.05
        self.step_count = 0
        self.all_ok = True
        return f"start {name}", {"won": False, "task_type": "toy", "task_id": task_id, "step": 0}

    def step(self, action: str) -> StepResult:
        if "step" in self.raise_on:
            raise RuntimeError("step exploded")
        self.step_count += 1
        if self.hang_on_step == self.step_count:
            self._released.wait(self.hang_limit_s)
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        self.all_ok &= action == "ok"
        done = self.step_count >= self.turns
        won = done and self.all_ok
        truncated = not done and self.truncate_at is not None and self.step_count >= self.truncate_at
        info = {"won": won, "action_effective": action == "ok", "task_type": "toy", "step": self.step_count}
        return StepResult(f"obs {self.step_count}", 1.0 if won else 0.0, done, truncated, info)

    def close(self) -> None:
        self.closed = True
        self._released.set()


class ToyParser(ActionParser):
    """``<a>X</a>`` -> X; anything else is invalid and sends the raw tail."""

    def parse(self, text: str) -> ParsedAction:
        start, end = text.find("<a>"), text.find("</a>")
        if start < 0 or end < start:
            return ParsedAction(text[-8:], False, "no <a> tag")
        return ParsedAction(text[start + 3 : end], True)


class ToyPromptBuilder(PromptBuilder):
    def __init__(self, history_length: int = 2):
        self.history_length = history_length

    def system_prompt(self) -> str | None:
        return "Answer with <a>ok</a>."

    def first_message(self, observation: str, info: dict[str, Any]) -> str:
        return f"Task: {observation}"

    def next_message(self, observation: str, info: dict[str, Any]) -> str:
        return f"Now: {observation}"

    def step_messages(self, initial_observation, history, observation, info):
        recent = history[-self.history_length :] if self.history_length else []
        lines = [f"[{o} -> {a}]" for o, a in recent]
        return [
            {"role": "system", "content": self.system_prompt()},
            {"role": "user", "content": "\n".join([f"Task: {initial_observation}", *lines, f"Now: {observation}"])},
        ]


def ok_policy(prompt: str) -> str:
    return "<a>ok</a>"


def make_record(prompt_id: str = "t:2", request_id: str = "req-0", version: int = 0, **extra: Any):
    from streamrl.rollout import DispatchRecord

    return DispatchRecord(request_id=request_id, prompt_id=prompt_id, seq=0, policy_version=version, **extra)


async def play(engine, env: Env | None = None, prompt_id: str = "t:2", settings=None, parser=None, builder=None):
    """One episode through ``EpisodeRunner`` with the toy parser and builder."""
    from streamrl.envs.base import AsyncEnv
    from streamrl.rollout import EpisodeRunner

    runner = EpisodeRunner(engine, engine.codec, parser or ToyParser(), builder or ToyPromptBuilder(), settings)
    env = env or ToyEnv()
    try:
        return await runner.run(AsyncEnv(env), make_record(prompt_id))
    finally:
        env.close()


class RecordingEngine:
    """Wraps an engine and keeps every (request, result) pair, to compare with samples."""

    def __init__(self, inner, codec=None):
        self.inner = inner
        self.codec = codec or inner.codec
        self.calls: list = []

    @property
    def version(self) -> int:
        return self.inner.version

    async def generate(self, request):
        result = await self.inner.generate(request)
        self.calls.append((request, result))
        return result

    def update_weights(self, state_dict, version):
        self.inner.update_weights(state_dict, version)

    async def close(self):
        await self.inner.close()


class RecordingSource:
    """Uniform choice; freezes ``baseline = seq / 100`` and ``z = version``; records every hook."""

    def __init__(self, prompt_ids: list[str]):
        self.pool = list(prompt_ids)
        self.dispatches: list[str] = []
        self.results: list[str] = []
        self.published: list[int] = []
        self.version = 0

    def prompt_ids(self):
        return self.pool

    def select(self, candidates, rng):
        return rng.choice(list(candidates))

    def on_dispatch(self, prompt_id):
        from streamrl.rollout import DispatchMeta

        self.dispatches.append(prompt_id)
        return DispatchMeta(z=float(self.version), baseline=len(self.dispatches) / 100, extra={"n": len(self.dispatches)})

    def on_result(self, trajectory):
        self.results.append(trajectory.request_id)

    def on_publish(self, version):
        self.published.append(version)
        self.version = version


def make_rollout(prompts, *, engine=None, env_factory=ToyEnv, source=None, log=None, episode=None, **settings):
    from streamrl.rollout import EpisodeSettings, Rollout, RolloutSettings, UniformPromptSource

    engine = engine or ScriptedEngine(ok_policy, latency_s=0.002)
    return Rollout(
        engine=engine,
        codec=engine.codec,
        env_factory=env_factory,
        parser=ToyParser(),
        prompt_builder=ToyPromptBuilder(),
        source=source or UniformPromptSource(prompts),
        settings=RolloutSettings(episode=episode or EpisodeSettings(env_timeout_s=0.5), **settings),
        event_log=log,
    )


def env_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("streamrl-env") and t.is_alive()]


async def learn(rollout, engine, batches: int, pause_s: float = 0.0) -> list[list]:
    """A fake learner: take a batch, optionally 'train', publish the next version."""
    import asyncio

    received = []
    for _ in range(batches):
        batch = await rollout.next_batch()
        received.append(batch)
        if pause_s:
            await asyncio.sleep(pause_s)
        engine.update_weights({}, rollout.learner_version + 1)
        rollout.publish(rollout.learner_version + 1)
    return received
