"""The Ray backend on a real local Ray cluster (2 CPUs, tiny policy, guess_number): the same run
delivers the same requests as the local backend, also through a killed and a hung worker; a GRPO
training process killed with SIGKILL resumes with the Ray backend. One cluster serves the module."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from streamrl.policy.hf_engine import HFEngine  # noqa: E402
from streamrl.policy.loading import load_policy  # noqa: E402
from streamrl.policy.protocols import SamplingParams  # noqa: E402
from streamrl.rollout import (  # noqa: E402
    EpisodeSettings,
    Rollout,
    RolloutError,
    RolloutSettings,
    UniformPromptSource,
    WorkerSpec,
    make_backend,
    read_events,
    replay,
)
from streamrl.rollout.ray_backend import RayBackend  # noqa: E402
from streamrl.training.loggers import read_metrics  # noqa: E402

MODEL = {"spec": "tiny", "seed": 0, "threads": 1,
         "model_overrides": {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64}}
EPISODE = EpisodeSettings(layout="per_step", sampling=SamplingParams(max_new_tokens=8), max_turns=3,
                          max_context_tokens=512)
SPEC = WorkerSpec(model=MODEL, env="guess_number", episode=EPISODE, seed=0)
TASKS = [f"train/{i}" for i in range(16)]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def policy():
    return load_policy(**MODEL)


async def _run(kind: str, policy, settings: RolloutSettings, batches: int, log: Path, hook=None):
    """``batches`` learner batches, publishing a new version after each; returns them.
    ``hook(rollout, version, published)`` runs before and after each publish."""
    engine = HFEngine.from_policy(policy, threads=1)
    if kind == "local":
        backend = make_backend("local", SPEC, concurrency=settings.concurrency, engine=engine, codec=policy,
                               weights=policy.state_dict_for_engine)
    else:  # a worker is taken for hung when an episode takes 10 s (they take well under 1 s)
        backend = RayBackend(SPEC, workers=2, concurrency=settings.concurrency, weights=policy.state_dict_for_engine,
                             episode_timeout_s=10.0)
    rollout = Rollout(backend=backend, source=UniformPromptSource(TASKS), settings=settings, event_log=log)
    delivered = []
    try:
        async with rollout:
            for version in range(1, batches + 1):
                delivered.append(await rollout.next_batch())
                if hook is not None:
                    await hook(rollout, version, False)
                engine.update_weights(policy.state_dict_for_engine(), version)
                rollout.publish(version)
                if hook is not None:
                    await hook(rollout, version, True)
    finally:
        await engine.close()
    return delivered


async def _all_in_flight(rollout, count: int) -> None:
    deadline = time.monotonic() + 30
    while rollout.stats()["in_flight"] < count:
        assert time.monotonic() < deadline, f"never {count} episodes in flight"
        await asyncio.sleep(0.001)


def test_ray_run_equals_local_run_through_a_dead_and_a_hung_worker(cluster, policy, tmp_path):
    """max_staleness=0: each version admits exactly one batch, so the run is the same whatever the
    timing. After version 1 worker-0's process is SIGKILLed with its episodes in flight; after
    version 3 (worker-0 restarted by Ray) worker-1's is SIGSTOPped (hung). Their episodes are played
    again on the other worker under the same request ids: nothing is lost or delivered twice."""
    settings = RolloutSettings(concurrency=4, batch_size=4, max_staleness=0, episode=EPISODE)
    log = tmp_path / "ray.jsonl"
    stopped = []

    async def faults(rollout, version, published):
        workers = dict(rollout.backend.workers)
        if version == 1 and published:
            pid = await workers["worker-0"].pid.remote()
            await _all_in_flight(rollout, 4)  # two on each worker
            os.kill(pid, signal.SIGKILL)
        if version == 3 and not published:  # nothing runs until the publish
            deadline = time.monotonic() + 180  # a guard against waiting forever; a loaded machine is slow
            while not any(e["event"] == "worker_back" for e in read_events(log)):
                assert time.monotonic() < deadline, "Ray did not restart worker-0 within 180 s"
                await asyncio.sleep(0.05)
        if version == 3 and published:
            pid = await workers["worker-1"].pid.remote()
            await _all_in_flight(rollout, 4)
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

    try:
        remote = asyncio.run(_run("ray", policy, settings, 6, log, faults))
    finally:
        for pid in stopped:  # Ray has killed it by now; never leave a stopped process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    local = asyncio.run(_run("local", policy, settings, 6, tmp_path / "local.jsonl"))

    def key(batch):
        return sorted((t.request_id, t.prompt_id, t.dispatch.env_seed, t.dispatch.seq) for t in batch)

    assert [key(b) for b in local] == [key(b) for b in remote]
    for version, batch in enumerate(remote):
        for trajectory in batch:  # synchronous: every turn played by the weights of its dispatch
            assert trajectory.outcome is not None and trajectory.dispatch.policy_version == version
            assert trajectory.turns and set(trajectory.turn_versions) == {version}
    events = read_events(log)
    lost = [e for e in events if e["event"] == "worker_lost"]
    # (on a very busy machine a slow episode may be taken for hung too: it is replayed like the others)
    assert {("worker-0", False), ("worker-1", True)} <= {(e["worker"], "hung" in e["error"]) for e in lost}
    assert all(e["replayed"] for e in lost)
    results = {e["request_id"]: e["worker"] for e in events if e["event"] == "result"}
    assert all(results[e["request_id"]] != e["worker"] for e in lost)  # replayed on the other worker
    assert set(results.values()) == {"worker-0", "worker-1"}
    dispatched = [e["request_id"] for e in events if e["event"] == "dispatch"]
    assert len(dispatched) == len(set(dispatched)) == 6 * 4  # a replay is no new dispatch
    assert {e["worker"] for e in read_events(tmp_path / "local.jsonl") if e["event"] == "result"} == {"local"}


def test_more_workers_than_the_cluster_has_cpus_is_refused(cluster, policy):
    backend = RayBackend(SPEC, workers=3, concurrency=6, weights=policy.state_dict_for_engine)
    with pytest.raises(RolloutError, match="rollout.workers=3 needs 3 CPUs of the Ray cluster, which has 2"):
        asyncio.run(backend.start(lambda *args, **kwargs: None))


def test_a_worker_that_cannot_start_fails_the_start_once_with_its_cause(cluster, policy):
    backend = RayBackend(dataclasses.replace(SPEC, env="no_such_env"), workers=1, concurrency=2,
                         weights=policy.state_dict_for_engine)
    with pytest.raises(RolloutError, match="a Ray rollout worker failed to start: .*unknown environment 'no_such_env'"):
        asyncio.run(backend.start(lambda *args, **kwargs: None))
    assert backend.workers == []  # killed again


def test_sigkill_then_resume_with_the_ray_backend(cluster, tmp_path, sigkill_at_checkpoint):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "streamrl", "train", "--out", str(out), "--config", "configs/smoke.yaml",
            "--algo", "grpo", "rollout.backend=ray", "rollout.workers=1", "train.steps=3", "train.checkpoint_every=1",
            "train.eval_at_start=false", "env.eval_tasks=2", "sft.demos=0"]
    env = {**os.environ, "RAY_ADDRESS": cluster}
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    sigkill_at_checkpoint(first, out, step=1, timeout=120)
    second = subprocess.run([*args, "--resume"], capture_output=True, text=True, env=env, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resume: continuing from step_0000000" in second.stdout
    batches = replay(out / "events.jsonl")
    delivered = [rid for batch in batches for rid in batch]
    assert len(batches) == 3 and len(delivered) == len(set(delivered)) == 3 * 8
    events = read_events(out / "events.jsonl")
    assert {e["worker"] for e in events if e["event"] == "result"} == {"worker-0"}
    groups = [e for e in events if e["event"] == "group"]  # group mode (GRPO): whole groups delivered
    assert groups and all(len(e["finished"]) == 8 and not e["partial"] for e in groups)
    assert json.loads((out / "summary.json").read_text())["steps"] == 3


def test_an_agent_function_runs_in_the_ray_workers(cluster, tmp_path):
    """``--agent`` with ``rollout.backend=ray``: each worker serves its own endpoint over its engine
    and runs the agent there; the trainer learns from what the workers' engines generated."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "streamrl", "train", "--out", str(out), "--config", "configs/smoke.yaml",
            "--agent", "examples/openai_agent.py:run", "--tasks", "examples/pick_tasks.jsonl",
            "rollout.backend=ray", "rollout.workers=1", "train.steps=2", "train.batch_size=4", "rollout.concurrency=4",
            "train.eval_at_start=false", "env.eval_tasks=2"]
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "RAY_ADDRESS": cluster}, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    events = read_events(out / "events.jsonl")
    results = [e for e in events if e["event"] == "result"]
    assert results and {e["worker"] for e in results} == {"worker-0"}  # played in the worker, not in the trainer
    assert all(e["end_reason"] == "terminated" for e in results), results
    delivered = [rid for batch in replay(out / "events.jsonl") for rid in batch]
    assert len(delivered) == len(set(delivered)) == 2 * 4
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1, 2]
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
