"""The rollout service: keeps episodes in flight and hands finished ones to the learner.

One dispatcher serves both modes on the same code path:

* ``mode="stream"`` (single-stream, SPO/SPO++): one episode per dispatch, up to ``concurrency`` in
  flight, at most ``per_prompt_inflight`` per prompt; the learner receives trajectories in the
  order they finish.
* ``mode="group"`` (GRPO): a dispatch is ``group_size`` episodes of one prompt sharing a group id;
  a group is delivered once all its members finished (the barrier), or partially once
  ``group_timeout_s`` has passed (stragglers are cancelled and discarded).

Where an episode is played is the backend's (``backend.py``: this process; ``ray_backend.py``: Ray
actors); the dispatcher hands it frozen dispatch records and logs the worker of each trajectory.

Admission (``staleness.admission_capacity``) bounds how far dispatches run ahead of the learner's
published version; with ``max_staleness=0`` group mode is exactly synchronous RL.
"""

from __future__ import annotations

import asyncio
import random
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from streamrl.envs.base import ActionParser, AsyncEnv, Env, PromptBuilder
from streamrl.policy.protocols import ChatCodec, InferenceEngine
from streamrl.rollout.backend import EpisodeBackend, LocalBackend
from streamrl.rollout.collect import Group
from streamrl.rollout.events import EventLog, dispatch_fields, result_fields
from streamrl.rollout.modes import make_mode
from streamrl.rollout.rollout_state import STATE_FORMAT, STATE_KEYS, Counters, check_state, rng_state, set_rng_state
from streamrl.rollout.settings import (
    DeadEnvironmentError,
    EnvFaultWatch,
    RolloutError,
    RolloutSettings,
    RolloutStalledError,
)
from streamrl.rollout.sources import DispatchMeta, PromptSource
from streamrl.rollout.staleness import admission_capacity, is_stale, sample_lag
from streamrl.rollout.trajectory import ENV_FAULT_END_REASONS, DispatchRecord, Trajectory, env_seed


@dataclass
class _InFlight:
    record: DispatchRecord
    task: asyncio.Task
    started: float


class Rollout:
    """Asynchronous rollout over a prompt source and a backend that plays the episodes.

    The backend is ``LocalBackend`` over ``engine``, ``env_factory``, ``parser``, ``prompt_builder``
    and ``codec`` unless one is given (``backends.make_backend``: ``RayBackend`` plays on Ray actors).

    The trainer calls ``await next_batch()`` to receive trajectories, ``publish(version)`` after
    each optimiser step (having called ``engine.update_weights`` itself), ``state_dict()`` when it
    checkpoints, and ``await close()`` at the end (or uses ``async with``).

    Versions: the learner's steps are counted from the backend's version at construction (restored
    by ``load_state_dict``). A trajectory's ``lag`` is set when it is delivered: the learner version
    then, minus the version behind its oldest turn. The rollout does not own the engine and never
    closes it.
    """

    def __init__(
        self,
        *,
        source: PromptSource,
        settings: RolloutSettings | None = None,
        event_log: str | Path | None = None,
        backend: EpisodeBackend | None = None,
        engine: InferenceEngine | None = None,
        env_factory: Callable[[], Env | AsyncEnv] | None = None,
        parser: ActionParser | None = None,
        prompt_builder: PromptBuilder | None = None,
        codec: ChatCodec | None = None,
    ):
        self.settings = settings or RolloutSettings()
        self.source = source
        if backend is None:  # the local backend over the given parts
            if engine is None or env_factory is None or parser is None or prompt_builder is None or codec is None:
                raise TypeError("Rollout: pass a backend, or engine, env_factory, parser, prompt_builder and codec")
            backend = LocalBackend(engine, codec, env_factory, parser, prompt_builder, self.settings.episode,
                                   self.settings.concurrency)
        self.backend = backend
        self._log = EventLog(event_log)
        self._mode = make_mode(self.settings, self._expire_group)
        self._buffer = self._mode.buffer
        self._rng = random.Random(self.settings.seed)
        self._n = Counters(start_version=backend.version, learner_version=backend.version)  # checkpointed
        self._reissue: list[DispatchRecord] = []
        # live state
        self._env_faults = EnvFaultWatch(self.settings.env_fault_limit, self.settings.env_name)
        self._inflight: dict[str, _InFlight] = {}
        self._prompt_load: Counter[str] = Counter()
        self._dispatcher: asyncio.Task | None = None
        self._start_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._arrived = asyncio.Event()
        self._error: BaseException | None = None
        self._blocked: str | None = None
        self._closed = False
        self._busy_s = 0.0
        self._started_at: float | None = None

    # -- public API --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start dispatching (``next_batch`` starts it on first use). Re-issues restored requests."""
        async with self._start_lock:  # the backend starts once, whoever asks first
            if self._closed:
                raise RolloutError("the rollout is closed")
            if self._dispatcher is None:
                await self.backend.start(self._log.write)
                self._begin()

    def _begin(self) -> None:
        self._started_at = time.monotonic()
        for prompt_id in self._mode.resume():
            self._prompt_load[prompt_id] += 1
        for record in self._reissue:
            self._launch(record, reissued=True)
        self._reissue = []
        self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="streamrl-dispatcher")

    async def next_batch(self, batch_size: int | None = None) -> list[Trajectory]:
        """Wait for and return the next learner batch (first-finished, or complete groups).

        Sets ``lag`` and ``excluded_from_loss`` on each trajectory against the learner version.
        """
        size = batch_size or self.settings.batch_size
        if self.settings.mode == "group" and size % self.settings.group_size:
            raise ValueError(f"batch_size {size} must be a multiple of group_size {self.settings.group_size}")
        await self.start()
        while not self._buffer.ready(size):
            self._raise_if_stopped()
            if not self._inflight and self._dispatch_ready() == 0:
                self._raise_if_stopped()
                raise RolloutStalledError(
                    f"the learner asked for {size} trajectories, {len(self._buffer)} are buffered, none "
                    f"is in flight and none can be dispatched ({self._blocked}); publish a new version, "
                    "raise max_staleness, or ask for smaller batches"
                )
            self._arrived.clear()
            await self._arrived.wait()
        self._raise_if_stopped()
        batch = self._buffer.pop(size)
        if len(batch) >= self.settings.env_fault_limit and all(t.end_reason in ENV_FAULT_END_REASONS for t in batch):
            self._fail(self._env_faults.dead(batch))
            self._raise_if_stopped()
        for trajectory in batch:
            trajectory.lag = sample_lag(self._n.learner_version, trajectory.behaviour_version)
            trajectory.excluded_from_loss = is_stale(trajectory.lag, self.settings.max_staleness)
        self._log.write(
            "deliver",
            batch=self._n.batches,
            learner_version=self._n.learner_version,
            request_ids=[t.request_id for t in batch],
            lags=[t.lag for t in batch],
            excluded=[t.excluded_from_loss for t in batch],
        )
        self._n.batches += 1
        return batch

    def publish(self, version: int) -> None:
        """Record that the learner published weights ``version`` (after ``engine.update_weights``)."""
        if not isinstance(version, int) or version < self._n.learner_version:
            raise ValueError(f"publish: version must be an int >= {self._n.learner_version}, got {version!r}")
        self._n.learner_version = version
        self.backend.publish(version)
        self.source.on_publish(version)
        self._log.write("publish", version=version)
        self._wake.set()

    @property
    def learner_version(self) -> int:
        return self._n.learner_version

    def stats(self) -> dict[str, Any]:
        """Counters for logging: dispatches, arrivals, deliveries, end reasons, slot utilisation."""
        now = time.monotonic()
        busy = self._busy_s + sum(now - f.started for f in self._inflight.values())
        elapsed = now - self._started_at if self._started_at is not None else 0.0
        return {
            "dispatched": self._n.dispatch_seq,
            "finished": len(self._n.finished_ids),
            "in_flight": len(self._inflight),
            "buffered": len(self._buffer),
            "batches_delivered": self._n.batches,
            "learner_version": self._n.learner_version,
            "end_reasons": dict(self._n.end_reasons),
            "busy_slot_s": busy,
            "slot_utilisation": busy / (self.settings.concurrency * elapsed) if elapsed > 0 else 0.0,
        }

    async def close(self) -> None:
        """Cancel every episode, close environments, stop threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._mode.close()
        tasks = [f.task for f in self._inflight.values()]
        if self._dispatcher is not None:
            tasks.append(self._dispatcher)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stuck = await self.backend.close(self.settings.shutdown_timeout_s)
        if stuck:
            warnings.warn(f"rollout closed with {len(stuck)} environment call(s) still running: {stuck}", stacklevel=2)
        self._log.close()
        self._arrived.set()

    async def __aenter__(self) -> Rollout:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable: undelivered trajectories, in-flight dispatch records and counters.

        After ``load_state_dict`` the in-flight requests are re-issued under their original
        request ids and dispatch metadata; what was buffered is delivered as if never interrupted.
        """
        inflight = [f.record for f in self._inflight.values()] + self._reissue
        state = {
            "format": STATE_FORMAT, "mode": self.settings.mode, "group_size": self.settings.group_size,
            **self._n.to_dict(), "group_seq": self._mode.seq, "event_seq": self._log.next_seq,
            "rng": rng_state(self._rng), "buffer": self._buffer.state_dict(),
            "inflight": [record.to_dict() for record in sorted(inflight, key=lambda r: r.seq)],
        }
        assert set(state) == set(STATE_KEYS)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint; call before ``start``/``next_batch``."""
        if self._dispatcher is not None or self._closed:
            raise RolloutError("load_state_dict must be called before the rollout starts")
        check_state(state, self.settings)
        self._n = Counters.from_dict(state)
        self._mode.seq = int(state["group_seq"])
        self._log.next_seq = int(state["event_seq"])
        set_rng_state(self._rng, state["rng"])
        self._reissue = [DispatchRecord.from_dict(r) for r in state["inflight"]]
        self._buffer.load_state_dict(state["buffer"])

    # -- dispatching -------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            self._wake.clear()
            self._dispatch_ready()
            await self._wake.wait()

    def _dispatch_ready(self) -> int:
        """Dispatch every unit admission allows; returns how many episodes were dispatched."""
        if self._closed or self._error is not None:
            return 0
        settings = self.settings
        dispatched = 0
        try:
            while True:
                allowed = admission_capacity(
                    free_slots=settings.concurrency - len(self._inflight),
                    max_staleness=settings.max_staleness,
                    learner_steps=self._n.learner_version - self._n.start_version,
                    batch_size=settings.batch_size,
                    admitted=self._n.admitted,
                )
                if allowed < settings.unit:
                    full = len(self._inflight) + settings.unit > settings.concurrency
                    self._blocked = "all slots busy" if full else "the staleness bound (max_staleness)"
                    return dispatched
                candidates = [p for p in self.source.prompt_ids() if self._prompt_load[p] < settings.per_prompt_inflight]
                if not candidates:
                    self._blocked = "every prompt is at its in-flight cap (per_prompt_inflight)"
                    return dispatched
                prompt_id = self.source.select(candidates, self._rng)
                if prompt_id not in set(candidates):
                    raise ValueError(f"the prompt source selected {prompt_id!r}, which is not one of the candidates")
                self._dispatch_unit(prompt_id)
                dispatched += settings.unit
        except Exception as error:
            self._fail(error)
            return dispatched

    def _dispatch_unit(self, prompt_id: str) -> None:
        self._prompt_load[prompt_id] += 1
        for record in self._mode.dispatch(prompt_id, self._new_record):
            self._launch(record)

    def _new_record(self, prompt_id: str, group_id: str | None) -> DispatchRecord:
        meta = self.source.on_dispatch(prompt_id)
        if not isinstance(meta, DispatchMeta):
            raise TypeError(f"PromptSource.on_dispatch must return DispatchMeta, got {type(meta).__name__}")
        seq = self._n.dispatch_seq
        self._n.dispatch_seq += 1
        self._n.admitted += 1
        return DispatchRecord(
            request_id=f"{self.settings.request_prefix}-{seq}",
            prompt_id=prompt_id,
            seq=seq,
            policy_version=self.backend.version,
            group_id=group_id,
            z=meta.z,
            baseline=meta.baseline,
            extra=dict(meta.extra),
            # group members share a seed: the same task in the same initial state
            env_seed=env_seed(self.settings.seed, seq if group_id is None else group_id),
            dispatched_at=time.time(),
        )

    def _launch(self, record: DispatchRecord, reissued: bool = False) -> None:
        slot = self._mode.reissued_slot(record) if reissued else None
        if slot is not None:
            self._prompt_load[slot] += 1
        task = asyncio.create_task(self._episode(record), name=f"streamrl-episode-{record.request_id}")
        self._inflight[record.request_id] = _InFlight(record, task, time.monotonic())
        if reissued:
            self._log.write("reissue", request_id=record.request_id)
        else:
            self._log.write("dispatch", **dispatch_fields(record), learner_version=self._n.learner_version,
                            admitted=self._n.admitted)

    # -- episodes ----------------------------------------------------------------------------

    async def _episode(self, record: DispatchRecord) -> None:
        started = time.monotonic()
        finished = False
        try:
            trajectory, worker = await self.backend.play(record)
            self._inflight.pop(record.request_id, None)
            self._on_finished(trajectory, worker)
            finished = True
        except Exception as error:  # a bug in the rollout itself: stop and tell the learner
            self._fail(error)
        finally:
            self._busy_s += time.monotonic() - started
            self._inflight.pop(record.request_id, None)
            if not finished and not self._closed:
                # cancelled as a group straggler: it will never reach the learner
                self._n.admitted -= 1
                self._log.write("discard", request_id=record.request_id, group_id=record.group_id)
            self._wake.set()

    def _on_finished(self, trajectory: Trajectory, worker: str) -> None:
        request_id = trajectory.request_id
        if request_id in self._n.finished_ids:
            self._log.write("duplicate", request_id=request_id)
            return
        accepted, freed, closed = self._mode.add(trajectory)
        if not accepted:  # its group already timed out
            self._n.admitted -= 1
            self._log.write("discard", request_id=request_id, group_id=trajectory.group_id)
            return
        if closed is None and freed is not None:
            self._prompt_load[freed] -= 1
        self._n.finished_ids.add(request_id)
        self._n.end_reasons[trajectory.end_reason] += 1
        dead = self._env_faults.count(trajectory)
        if dead is not None:
            self._fail(dead)
        self._log.write("result", **result_fields(trajectory), learner_version=self._n.learner_version, worker=worker)
        try:
            self.source.on_result(trajectory)
        except Exception as error:
            self._fail(error)
        if closed is not None:
            self._group_closed(closed)
        self._arrived.set()

    # -- groups ------------------------------------------------------------------------------

    def _expire_group(self, group: Group) -> None:
        for request_id in group.pending:
            inflight = self._inflight.get(request_id)
            if inflight is not None:
                inflight.task.cancel()
        self._group_closed(group)
        self._arrived.set()

    def _group_closed(self, group: Group) -> None:
        self._prompt_load[group.prompt_id] -= 1
        self._log.write(
            "group",
            group_id=group.group_id,
            prompt_id=group.prompt_id,
            finished=[m.request_id for m in group.members],
            partial=group.partial,
        )
        self._wake.set()

    # -- failure -----------------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._arrived.set()

    def _raise_if_stopped(self) -> None:
        if isinstance(self._error, DeadEnvironmentError):
            raise DeadEnvironmentError(str(self._error)) from None
        if self._error is not None:
            raise RolloutError(f"the rollout stopped: {type(self._error).__name__}: {self._error}") from self._error
        if self._closed:
            raise RolloutError("the rollout is closed")
