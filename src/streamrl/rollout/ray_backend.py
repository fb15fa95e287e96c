"""``RayBackend``: episodes played on Ray actors, each owning an engine and its environments.

The dispatcher, the learner and the event log stay in the trainer's process; a ``RolloutWorker``
actor builds its policy, engine and environment pool from a ``WorkerSpec`` and plays whatever
dispatch record it is handed, with the same ``EpisodeRunner`` as the local backend, or, when the
spec names a ``player`` (an agent function, ``--agent``), with that player over its own engine: the
agent then runs in the worker, against an endpoint of the worker's own.

Weights: each published version is put into Ray's object store once (``ray.put``) and its
reference sent to every worker (``sync``); each ``play`` call carries the newest reference too, so
a worker that Ray restarted catches up before its first episode. A worker hands the weights to its
engine, which switches between batches: a turn is never a mix of versions, and each turn records
the version that produced it.

Faults use Ray's own machinery: workers are created with ``max_restarts=-1``, so Ray starts a
replacement process when one dies. The calls that were in flight on it fail with
``RayActorError``; each of those episodes is played again (same request id, same frozen dispatch
record: same task, seed, baseline), on another worker while the dead one restarts (new episodes
avoid it too until it answers again), at most
``max_replays`` times, and then ends with ``end_reason="worker_lost"``. A worker whose call
outlives ``episode_timeout_s`` is taken for hung: Ray kills and restarts it, and the episode is
played again likewise. Cancelling an episode (a group straggler, ``close``) cancels its Ray task.

``ray.init()`` connects to the cluster at ``RAY_ADDRESS`` when it is set, and starts a local one
otherwise (shut down again at ``close``); an already initialised Ray is used as it is.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from streamrl.rollout.backend import EventSink, WorkerSpec
from streamrl.rollout.env_pool import EnvPool
from streamrl.rollout.episode import EpisodeRunner
from streamrl.rollout.settings import RolloutError
from streamrl.rollout.timeouts import CallTimedOut, bounded
from streamrl.rollout.trajectory import DispatchRecord, Trajectory


class RolloutWorker:
    """One Ray actor: a policy (tokeniser, chat codec), an engine over it, environments.

    Its engine starts at version -1 (architecture only); the first ``play`` or ``sync`` loads the
    trainer's weights from the object store.
    """

    def __init__(self, spec: WorkerSpec, slots: int):
        from streamrl.policy.engines import make_engine
        from streamrl.policy.loading import load_policy

        policy = load_policy(**spec.model)
        self._engine = make_engine(spec.engine, policy, version=-1, seed=spec.seed, threads=spec.engine_threads,
                                   rollout_dtype=spec.rollout_dtype, capture_layer=spec.capture_layer,
                                   prefix_cache_tokens=spec.prefix_cache_tokens)
        self._lock = asyncio.Lock()
        #: an agent function's backend over this worker's engine, or None: the environment plays
        self._player = spec.player(self._engine, policy) if spec.player is not None else None
        if self._player is None:
            self._runner = EpisodeRunner(self._engine, policy, spec.make_parser(policy), spec.make_prompt_builder(),
                                         spec.episode)
            self._envs = EnvPool(spec.make_env, slots, call_timeout_s=spec.episode.env_timeout_s)

    def pid(self) -> int:
        return os.getpid()

    async def sync(self, version: int, weights: list[Any]) -> int:
        """Hand weights ``version`` (``weights[0]``: its object reference) to the engine, unless it
        already has that version or a newer one; returns the engine's version."""
        if version > self._engine.version:
            async with self._lock:
                if version > self._engine.version:
                    state = await weights[0]
                    self._engine.update_weights(state, version)
        return self._engine.version

    async def play(self, record: DispatchRecord, version: int, weights: list[Any]) -> Trajectory:
        await self.sync(version, weights)
        if self._player is not None:
            return (await self._player.play(record))[0]
        return await self._runner.run_leased(self._envs, record)

    async def close(self, timeout_s: float) -> list[str]:
        stuck = await (self._player.close(timeout_s) if self._player is not None else self._envs.close(timeout_s))
        await self._engine.close()
        return stuck


@dataclass
class _Worker:
    name: str
    handle: Any
    load: int = 0
    #: lost and not back yet (Ray is restarting it): new episodes go to the others meanwhile
    down: bool = False


class RayBackend:
    """``workers`` ``RolloutWorker`` actors sharing ``concurrency`` episode slots (see the module
    docstring). ``weights()`` gives the trainer's engine weights; it is read at ``start`` and at
    each ``publish``."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        workers: int,
        concurrency: int,
        weights: Callable[[], dict[str, Any]],
        version: int = 0,
        max_replays: int = 2,
        episode_timeout_s: float | None = None,
    ):
        if workers < 1:
            raise ValueError(f"RayBackend: workers must be >= 1, got {workers}")
        if max_replays < 0:
            raise ValueError(f"RayBackend: max_replays must be >= 0, got {max_replays}")
        self.spec = spec
        self._count = workers
        self._slots = math.ceil(concurrency / workers)
        self._weights = weights
        self._version = version
        self._max_replays = max_replays
        self._episode_timeout_s = episode_timeout_s if episode_timeout_s is not None else _episode_bound(spec)
        self._workers: list[_Worker] = []
        self._watches: set[asyncio.Task] = set()
        self._ref: Any = None
        self._log: EventSink = lambda *args, **kwargs: None
        self._owns_ray = False

    @property
    def version(self) -> int:
        return self._version

    @property
    def workers(self) -> list[tuple[str, Any]]:
        """(name, actor handle) of every worker."""
        return [(w.name, w.handle) for w in self._workers]

    async def start(self, log: EventSink) -> None:
        self._log = log
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False, log_to_driver=False)
            self._owns_ray = True
        try:
            await self._spawn()
        except BaseException:
            await self.close(0.1)  # the Ray it started, and any worker, go with it
            raise
        for worker in self._workers:
            log("worker", worker=worker.name, slots=self._slots)

    async def _spawn(self) -> None:
        resources = ray.cluster_resources()
        for name, each in (("CPU", self.spec.worker_cpus), ("GPU", self.spec.worker_gpus)):
            needed, has = self._count * each, resources.get(name, 0.0)
            if needed > has:
                raise RolloutError(
                    f"rollout.workers={self._count} needs {needed:g} {name}s of the Ray cluster, which has {has:g}"
                )
        self._ref = ray.put(self._weights())
        actor = ray.remote(RolloutWorker).options(num_cpus=self.spec.worker_cpus, num_gpus=self.spec.worker_gpus,
                                                  max_restarts=-1, max_task_retries=0)
        self._workers = [_Worker(f"worker-{i}", actor.remote(self.spec, self._slots)) for i in range(self._count)]
        try:  # construction errors surface here, once, rather than as lost episodes
            await asyncio.gather(*(w.handle.sync.remote(self._version, [self._ref]) for w in self._workers))
        except RayActorError as error:
            cause = str(error).strip().splitlines()[-1]  # the exception its constructor raised, last in the traceback
            raise RolloutError(f"a Ray rollout worker failed to start: {cause}") from None

    def publish(self, version: int) -> None:
        self._version = version
        self._ref = ray.put(self._weights())  # one copy in the object store, whatever the worker count
        for worker in self._workers:
            if not worker.down:  # one that is down catches up at its next play
                worker.handle.sync.remote(version, [self._ref])

    async def play(self, record: DispatchRecord) -> tuple[Trajectory, str]:
        avoid: set[str] = set()
        problem = ""
        for attempt in range(self._max_replays + 1):
            worker = self._pick(avoid)
            worker.load += 1
            call = worker.handle.play.remote(record, self._version, [self._ref])
            try:
                return await bounded(call, self._episode_timeout_s), worker.name
            except CallTimedOut:
                problem = f"{worker.name} did not return the episode within {self._episode_timeout_s} s (hung)"
                if not worker.down:  # its other episodes time out too: kill it once
                    ray.kill(worker.handle, no_restart=False)  # Ray restarts it
            except RayActorError as error:
                problem = f"{worker.name} died: {type(error).__name__}"
            except asyncio.CancelledError:
                ray.cancel(call)
                raise
            finally:
                worker.load -= 1
            avoid.add(worker.name)
            self._watch(worker)
            replay = attempt < self._max_replays
            self._log("worker_lost", worker=worker.name, request_id=record.request_id, attempt=attempt,
                      replayed=replay, error=problem)
        return Trajectory(dispatch=record, layout=self.spec.episode.layout, end_reason="worker_lost",
                          error=problem, finished_at=time.time()), worker.name

    def _pick(self, avoid: set[str]) -> _Worker:
        """The least-loaded worker that is up and has not failed this episode (``avoid``), else
        one that is up, else any (its call waits for Ray to restart it)."""
        up = [w for w in self._workers if not w.down]
        candidates = [w for w in up if w.name not in avoid] or up or self._workers
        return min(candidates, key=lambda w: w.load)

    def _watch(self, worker: _Worker) -> None:
        """Mark ``worker`` down until it answers again (a call to a restarting actor waits for it)."""
        if worker.down:
            return
        worker.down = True

        async def back() -> None:
            while True:
                try:
                    pid = await worker.handle.pid.remote()
                    break
                except ActorUnavailableError:  # still restarting
                    await asyncio.sleep(0.2)
                except RayActorError:
                    return  # gone for good
            worker.down = False
            self._log("worker_back", worker=worker.name, pid=pid)

        task = asyncio.ensure_future(back())
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    async def close(self, timeout_s: float) -> list[str]:
        stuck: list[str] = []
        for task in list(self._watches):
            task.cancel()
        try:
            calls = [asyncio.wrap_future(w.handle.close.remote(timeout_s).future()) for w in self._workers]
            done = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout_s + 5.0)
            for worker, result in zip(self._workers, done):
                if isinstance(result, list):
                    stuck.extend(f"{worker.name}:{name}" for name in result)
        except asyncio.TimeoutError:
            stuck.extend(f"{w.name}:close" for w in self._workers)
        finally:
            for worker in self._workers:
                ray.kill(worker.handle, no_restart=True)
            self._workers = []
            if self._owns_ray:
                ray.shutdown()
                self._owns_ray = False
        return stuck


def _episode_bound(spec: WorkerSpec) -> float | None:
    """The longest a sound episode can take when every call in it is bounded (reset, then per turn
    a generate and a step), with a minute's slack for scheduling; None when some call is not."""
    if spec.episode_timeout_s is not None:
        return spec.episode_timeout_s
    episode = spec.episode
    env, generate, turns = episode.env_timeout_s, episode.generate_timeout_s, episode.max_turns
    if env is None or generate is None or turns is None:
        return None
    return env + turns * (generate + env) + 60.0

