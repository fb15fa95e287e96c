"""The rollout service: keeps episodes in flight and hands finished ones to the learner.

One dispatcher serves both modes on the same code path:

* ``mode="stream"`` (single-stream, SPO/SPO++): one episode per dispatch, up to ``concurrency`` in
  flight, at most ``per_prompt_inflight`` per prompt; the learner receives trajectories in the
  order they finish.
* ``mode="group"`` (GRPO): a dispatch is ``group_size`` episodes of one prompt sharing a group id;
  a group is delivered once all its members finished (the barrier), or partially once
  ``group_timeout_s`` has passed (stragglers are cancelled and discarded).

Where an episode is played is the backend's business (``backend.py``: this process, or Ray actors
with ``ray_backend.py``); the dispatcher hands it frozen dispatch records and logs which worker
returned each trajectory.

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
from streamrl.policy.api import ChatCodec, InferenceEngine
from streamrl.rollout.backend import EpisodeBackend, LocalBackend
from streamrl.rollout.collect import Group, GroupBuffer, StreamBuffer
from streamrl.rollout.events import EventLog
from streamrl.rollout.settings import DeadEnvironmentError, RolloutError, RolloutSettings, RolloutStalledError
from streamrl.rollout.sources import DispatchMeta, PromptSource
from streamrl.rollout.staleness import admission_capacity, is_stale, sample_lag
from streamrl.rollout.trajectory import ENV_FAULT_END_REASONS, DispatchRecord, Trajectory, env_seed

STATE_FORMAT = 1
_STATE_KEYS = (
    "format", "mode", "group_size", "dispatch_seq", "group_seq", "admitted", "start_version", "learner_version",
    "batches_delivered", "event_seq", "end_reasons", "finished_ids", "rng", "inflight", "buffer",
)


@dataclass
class _InFlight:
    record: DispatchRecord
    task: asyncio.Task
    started: float


class Rollout:
    """Asynchronous rollout over a prompt source and a backend that plays the episodes.

    The backend is ``LocalBackend`` over ``engine``, ``env_factory``, ``parser``, ``prompt_builder``
    and ``codec`` unless one is given (``backend.make_backend``: ``RayBackend`` plays on Ray actors).

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
        if backend is None:
            parts = {"engine": engine, "env_factory": env_factory, "parser": parser, "prompt_builder": prompt_builder,
                     "codec": codec}
            missing = [name for name, value in parts.items() if value is None]
            if missing:
                raise TypeError(f"Rollout: without a backend, pass {', '.join(missing)}")
            backend = LocalBackend(engine, codec, env_factory, parser, prompt_builder, self.settings.episode,
                                   self.settings.concurrency)
        self.backend = backend
        self._log = EventLog(event_log)
        self._buffer: StreamBuffer | GroupBuffer = (
            GroupBuffer(self.settings.group_size) if self.settings.mode == "group" else StreamBuffer()
        )
        self._rng = random.Random(self.settings.seed)
        # counters (checkpointed)
        self._dispatch_seq = 0
        self._group_seq = 0
        self._admitted = 0  # dispatched minus discarded stragglers
        self._start_version = self._learner_version = backend.version
        self._batches = 0
        self._end_reasons: Counter[str] = Counter()
        self._finished_ids: set[str] = set()
        self._reissue: list[DispatchRecord] = []
        # live state
        self._env_faults: list[Trajectory] = []  # the current run of environment faults
        self._inflight: dict[str, _InFlight] = {}
        self._prompt_load: Counter[str] = Counter()
        self._group_timers: dict[str, asyncio.TimerHandle] = {}
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
        if isinstance(self._buffer, GroupBuffer):
            for group in self._buffer.open_groups():
                self._prompt_load[group.prompt_id] += 1
                self._arm_group_timer(group.group_id)
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
        if all(t.end_reason in ENV_FAULT_END_REASONS for t in batch):
            self._fail(self._dead_environment(batch))
            self._raise_if_stopped()
        for trajectory in batch:
            trajectory.lag = sample_lag(self._learner_version, trajectory.behaviour_version)
            trajectory.excluded_from_loss = is_stale(trajectory.lag, self.settings.max_staleness)
        self._log.write(
            "deliver",
            batch=self._batches,
            learner_version=self._learner_version,
            request_ids=[t.request_id for t in batch],
            lags=[t.lag for t in batch],
            excluded=[t.excluded_from_loss for t in batch],
        )
        self._batches += 1
        return batch

    def publish(self, version: int) -> None:
        """Record that the learner published weights ``version`` (after ``engine.update_weights``)."""
        if not isinstance(version, int) or version < self._learner_version:
            raise ValueError(f"publish: version must be an int >= {self._learner_version}, got {version!r}")
        self._learner_version = version
        self.backend.publish(version)
        self.source.on_publish(version)
        self._log.write("publish", version=version)
        self._wake.set()

    @property
    def learner_version(self) -> int:
        return self._learner_version

    def stats(self) -> dict[str, Any]:
        """Counters for logging: dispatches, arrivals, deliveries, end reasons, slot utilisation."""
        now = time.monotonic()
        busy = self._busy_s + sum(now - f.started for f in self._inflight.values())
        elapsed = now - self._started_at if self._started_at is not None else 0.0
        return {
            "dispatched": self._dispatch_seq,
            "finished": len(self._finished_ids),
            "in_flight": len(self._inflight),
            "buffered": len(self._buffer),
            "batches_delivered": self._batches,
            "learner_version": self._learner_version,
            "end_reasons": dict(self._end_reasons),
            "busy_slot_s": busy,
            "slot_utilisation": busy / (self.settings.concurrency * elapsed) if elapsed > 0 else 0.0,
        }

    async def close(self) -> None:
        """Cancel every episode, close environments, stop threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for timer in self._group_timers.values():
            timer.cancel()
        self._group_timers.clear()
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
        version, internal, gauss = self._rng.getstate()
        inflight = [f.record for f in self._inflight.values()] + self._reissue
        state = {
            "format": STATE_FORMAT,
            "mode": self.settings.mode,
            "group_size": self.settings.group_size,
            "dispatch_seq": self._dispatch_seq,
            "group_seq": self._group_seq,
            "admitted": self._admitted,
            "start_version": self._start_version,
            "learner_version": self._learner_version,
            "batches_delivered": self._batches,
            "event_seq": self._log.next_seq,
            "end_reasons": dict(self._end_reasons),
            "finished_ids": sorted(self._finished_ids),
            "rng": [version, list(internal), gauss],
            "inflight": [record.to_dict() for record in sorted(inflight, key=lambda r: r.seq)],
            "buffer": self._buffer.state_dict(),
        }
        assert set(state) == set(_STATE_KEYS)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint; call before ``start``/``next_batch``."""
        if self._dispatcher is not None or self._closed:
            raise RolloutError("load_state_dict must be called before the rollout starts")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"rollout state has format {state.get('format')!r}, expected {STATE_FORMAT}")
        missing = sorted(set(_STATE_KEYS) - set(state))
        if missing:
            raise ValueError(f"rollout state lacks {', '.join(missing)}")
        for key in ("mode", "group_size"):
            if state[key] != getattr(self.settings, key):
                raise ValueError(f"rollout state was saved with {key}={state[key]!r}, settings have {getattr(self.settings, key)!r}")
        self._dispatch_seq = int(state["dispatch_seq"])
        self._group_seq = int(state["group_seq"])
        self._admitted = int(state["admitted"])
        self._start_version = int(state["start_version"])
        self._learner_version = int(state["learner_version"])
        self._batches = int(state["batches_delivered"])
        self._log.next_seq = int(state["event_seq"])
        self._end_reasons = Counter(state["end_reasons"])
        self._finished_ids = set(state["finished_ids"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
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
                    learner_steps=self._learner_version - self._start_version,
                    batch_size=settings.batch_size,
                    admitted=self._admitted,
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
        if self.settings.mode == "stream":
            self._launch(self._new_record(prompt_id, None, self._dispatch_seq))
            return
        group_id = f"{self.settings.request_prefix}-g{self._group_seq}"
        self._group_seq += 1
        records = [self._new_record(prompt_id, group_id, group_id) for _ in range(self.settings.group_size)]
        self._buffer.open(group_id, prompt_id, [r.request_id for r in records])
        self._arm_group_timer(group_id)
        for record in records:
            self._launch(record)

    def _new_record(self, prompt_id: str, group_id: str | None, seed_key: object) -> DispatchRecord:
        meta = self.source.on_dispatch(prompt_id)
        if not isinstance(meta, DispatchMeta):
            raise TypeError(f"PromptSource.on_dispatch must return DispatchMeta, got {type(meta).__name__}")
        seq = self._dispatch_seq
        self._dispatch_seq += 1
        self._admitted += 1
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
            env_seed=env_seed(self.settings.seed, seed_key),
            dispatched_at=time.time(),
        )

    def _launch(self, record: DispatchRecord, reissued: bool = False) -> None:
        if reissued and self.settings.mode == "stream":
            self._prompt_load[record.prompt_id] += 1
        task = asyncio.create_task(self._episode(record), name=f"streamrl-episode-{record.request_id}")
        self._inflight[record.request_id] = _InFlight(record, task, time.monotonic())
        if reissued:
            self._log.write("reissue", request_id=record.request_id)
        else:
            self._log.write(
                "dispatch",
                request_id=record.request_id,
                prompt_id=record.prompt_id,
                group_id=record.group_id,
                dispatch_seq=record.seq,
                policy_version=record.policy_version,
                learner_version=self._learner_version,
                admitted=self._admitted,
                z=record.z,
                baseline=record.baseline,
            )

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
                self._admitted -= 1
                self._log.write("discard", request_id=record.request_id, group_id=record.group_id)
            self._wake.set()

    def _on_finished(self, trajectory: Trajectory, worker: str) -> None:
        request_id = trajectory.request_id
        if request_id in self._finished_ids:
            self._log.write("duplicate", request_id=request_id)
            return
        if isinstance(self._buffer, GroupBuffer):
            accepted, closed = self._buffer.add(trajectory)
            if not accepted:  # its group already timed out
                self._admitted -= 1
                self._log.write("discard", request_id=request_id, group_id=trajectory.group_id)
                return
        else:
            self._buffer.add(trajectory)
            self._prompt_load[trajectory.prompt_id] -= 1
            closed = None
        self._finished_ids.add(request_id)
        self._end_reasons[trajectory.end_reason] += 1
        self._count_env_fault(trajectory)
        self._log.write(
            "result",
            request_id=request_id,
            prompt_id=trajectory.prompt_id,
            group_id=trajectory.group_id,
            end_reason=trajectory.end_reason,
            outcome=trajectory.outcome,
            turns=len(trajectory.turns),
            num_action_tokens=trajectory.num_action_tokens,
            dispatch_version=trajectory.dispatch.policy_version,
            turn_versions=trajectory.turn_versions,
            learner_version=self._learner_version,
            duration_s=trajectory.duration_s,
            worker=worker,
        )
        try:
            self.source.on_result(trajectory)
        except Exception as error:
            self._fail(error)
        if closed is not None:
            self._group_closed(closed)
        self._arrived.set()

    # -- groups ------------------------------------------------------------------------------

    def _arm_group_timer(self, group_id: str) -> None:
        if self.settings.group_timeout_s is None:
            return
        loop = asyncio.get_running_loop()
        self._group_timers[group_id] = loop.call_later(self.settings.group_timeout_s, self._expire_group, group_id)

    def _expire_group(self, group_id: str) -> None:
        self._group_timers.pop(group_id, None)
        assert isinstance(self._buffer, GroupBuffer)
        group = self._buffer.expire(group_id)
        if group is None:
            return
        for request_id in group.pending:
            inflight = self._inflight.get(request_id)
            if inflight is not None:
                inflight.task.cancel()
        self._group_closed(group)
        self._arrived.set()

    def _group_closed(self, group: Group) -> None:
        timer = self._group_timers.pop(group.group_id, None)
        if timer is not None:
            timer.cancel()
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

    def _count_env_fault(self, trajectory: Trajectory) -> None:
        if trajectory.end_reason not in ENV_FAULT_END_REASONS:
            self._env_faults = []
            return
        self._env_faults.append(trajectory)
        if len(self._env_faults) >= self.settings.env_fault_limit:
            self._fail(self._dead_environment(self._env_faults))

    def _dead_environment(self, faults: list[Trajectory]) -> DeadEnvironmentError:
        first = faults[0]
        return DeadEnvironmentError(
            f"environment {self.settings.env_name!r} is failing: {len(faults)} episodes in a row ended in "
            f"{'/'.join(sorted({t.end_reason for t in faults}))}; the first: {first.error or first.end_reason}"
        )

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
