"""The Ray backend on a real local Ray cluster (2 CPUs, tiny policy, guess_number): the same run
delivers the same requests as the local backend, a killed worker loses nothing, and a training
process killed with SIGKILL resumes with the Ray backend. One cluster serves the whole module."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from streamrl.policy.engine import HFEngine  # noqa: E402
from streamrl.policy.loading import load_policy  # noqa: E402
from streamrl.policy.api import SamplingParams  # noqa: E402
from streamrl.rollout import (  # noqa: E402
    EpisodeSettings,
    Rollout,
    RolloutSettings,
    UniformPromptSource,
    WorkerSpec,
    make_backend,
    read_events,
    replay,
)

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


async def _run(kind: str, policy, settings: RolloutSettings, batches: int, log: Path, after_publish=None):
    """``batches`` learner batches, publishing a new version after each; returns them."""
    engine = HFEngine.from_policy(policy, threads=1)
    backend = make_backend(kind, SPEC, concurrency=settings.concurrency, engine=engine, codec=policy,
                           weights=policy.state_dict_for_engine, workers=2)
    rollout = Rollout(backend=backend, source=UniformPromptSource(TASKS), settings=settings, event_log=log)
    delivered = []
    try:
        async with rollout:
            for version in range(1, batches + 1):
                delivered.append(await rollout.next_batch())
                engine.update_weights(policy.state_dict_for_engine(), version)
                rollout.publish(version)
                if after_publish is not None:
                    await after_publish(rollout, version)
    finally:
        await engine.close()
    return delivered


def _same_requests(local, remote):
    def key(batch):
        return sorted((t.request_id, t.prompt_id, t.group_id, t.dispatch.env_seed, t.dispatch.seq) for t in batch)

    assert [key(b) for b in local] == [key(b) for b in remote]
    for version, batch in enumerate(remote):
        for trajectory in batch:  # synchronous: every turn played by the weights of its dispatch
            assert trajectory.outcome is not None and trajectory.dispatch.policy_version == version
            assert trajectory.turns and set(trajectory.turn_versions) == {version}


def _workers(log: Path) -> set[str]:
    return {e["worker"] for e in read_events(log) if e["event"] == "result"}


def test_local_and_ray_deliver_the_same_requests(cluster, policy, tmp_path):
    # max_staleness=0: each version admits exactly one batch, so the run is the same whatever the timing
    settings = RolloutSettings(concurrency=4, batch_size=4, max_staleness=0, episode=EPISODE)
    local = asyncio.run(_run("local", policy, settings, 3, tmp_path / "local.jsonl"))
    remote = asyncio.run(_run("ray", policy, settings, 3, tmp_path / "ray.jsonl"))
    _same_requests(local, remote)
    assert _workers(tmp_path / "ray.jsonl") == {"worker-0", "worker-1"}
    assert _workers(tmp_path / "local.jsonl") == {"local"}


def test_a_worker_killed_mid_run_loses_nothing(cluster, policy, tmp_path):
    """Group mode; worker-0's process is SIGKILLed with its episodes of batch 2 in flight: they are
    played again under their request ids, Ray starts a replacement, and the run is the local one."""
    settings = RolloutSettings(mode="group", group_size=2, concurrency=4, batch_size=4, max_staleness=0,
                               episode=EPISODE)
    killed = []

    async def kill_worker_0(rollout, version):
        if version != 1:
            return
        name, handle = rollout.backend.workers[0]
        pid = await handle.pid.remote()
        while rollout.stats()["in_flight"] < 4:  # the next two groups are dispatched, on both workers
            await asyncio.sleep(0.001)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    log = tmp_path / "ray.jsonl"
    remote = asyncio.run(_run("ray", policy, settings, 5, log, kill_worker_0))
    local = asyncio.run(_run("local", policy, settings, 5, tmp_path / "local.jsonl"))
    assert killed
    _same_requests(local, remote)
    events = read_events(log)
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert lost and {e["worker"] for e in lost} == {"worker-0"} and all(e["replayed"] for e in lost)
    results = {e["request_id"]: e["worker"] for e in events if e["event"] == "result"}
    assert {results[e["request_id"]] for e in lost} == {"worker-1"}  # replayed on the survivor
    dispatched = [e["request_id"] for e in events if e["event"] == "dispatch"]
    assert len(dispatched) == len(set(dispatched)) == 5 * 4  # a replay is no new dispatch


def test_sigkill_then_resume_with_the_ray_backend(cluster, tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "streamrl", "train", "--out", str(out), "--config", "configs/smoke.yaml",
            "rollout.backend=ray", "rollout.workers=2", "train.steps=4", "train.checkpoint_every=1",
            "train.eval_at_start=false", "env.eval_tasks=2", "sft.demos=0"]
    env = {**os.environ, "RAY_ADDRESS": cluster}
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (out / "checkpoints" / "step_00000002" / "manifest.json").exists():
        assert first.poll() is None, first.stdout.read()
        assert time.monotonic() < deadline, "no checkpoint at step 2 in time"
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    second = subprocess.run([*args, "--resume"], capture_output=True, text=True, env=env, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resume: continuing from step_0000000" in second.stdout
    batches = replay(out / "events.jsonl")
    delivered = [rid for batch in batches for rid in batch]
    assert len(batches) == 4 and len(delivered) == len(set(delivered)) == 4 * 8
    workers = {e["worker"] for e in read_events(out / "events.jsonl") if e["event"] == "result"}
    assert workers == {"worker-0", "worker-1"}
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
