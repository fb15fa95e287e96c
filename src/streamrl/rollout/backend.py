"""Where episodes are played: the dispatcher decides *what* runs, a backend *where*.

``LocalBackend`` plays in this process, against the trainer's own engine (the trainer updates its
weights; ``publish`` has nothing to ship). ``RayBackend`` (``ray_backend.py``) plays on Ray actors,
each owning an engine and its environments, built in the actor's process from a ``WorkerSpec``.
Either way the dispatcher's semantics are the same: it hands a backend a frozen ``DispatchRecord``
and gets back the ``Trajectory`` plus the name of the worker that played it (for the event log).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from streamrl.envs import make
from streamrl.envs.base import ActionParser, AsyncEnv, Env, PromptBuilder
from streamrl.policy.protocols import ChatCodec, InferenceEngine
from streamrl.policy.tool_format import tool_format_of
from streamrl.rollout.env_pool import EnvPool
from streamrl.rollout.episode import EpisodeRunner, EpisodeSettings
from streamrl.rollout.roles import action_parser, prompt_builder
from streamrl.rollout.trajectory import DispatchRecord, Trajectory

#: ``log(event, **fields)``: the dispatcher's event log, for what a backend observes (lost workers)
EventSink = Callable[..., Any]


class EpisodeBackend(Protocol):
    """What the dispatcher needs from a place that plays episodes."""

    @property
    def version(self) -> int:
        """The newest policy version episodes dispatched now are played with."""
        ...

    async def start(self, log: EventSink) -> None: ...

    async def play(self, record: DispatchRecord) -> tuple[Trajectory, str]:
        """Play ``record``'s episode; returns it and the worker's name. Only cancellation raises."""
        ...

    def publish(self, version: int) -> None:
        """The learner published ``version``: make it reach the engines that play episodes."""
        ...

    async def close(self, timeout_s: float) -> list[str]:
        """Stop everything; returns the names of environment calls still running after ``timeout_s``."""
        ...


class LocalBackend:
    """Episodes in this process: one ``EpisodeRunner`` over ``engine``, environments leased from an
    ``EnvPool`` of ``concurrency`` threads. The engine belongs to the trainer, which updates it."""

    def __init__(
        self,
        engine: InferenceEngine,
        codec: ChatCodec,
        env_factory: Callable[[], Env | AsyncEnv],
        parser: ActionParser,
        prompt_builder: PromptBuilder,
        settings: EpisodeSettings,
        concurrency: int,
    ):
        self.engine = engine
        self._runner = EpisodeRunner(engine, codec, parser, prompt_builder, settings)
        self._envs = EnvPool(env_factory, concurrency, call_timeout_s=settings.env_timeout_s)

    @property
    def version(self) -> int:
        return self.engine.version

    async def start(self, log: EventSink) -> None:
        return None

    async def play(self, record: DispatchRecord) -> tuple[Trajectory, str]:
        return await self._runner.run_leased(self._envs, record), "local"

    def publish(self, version: int) -> None:
        return None  # the trainer called engine.update_weights itself

    async def close(self, timeout_s: float) -> list[str]:
        return await self._envs.close(timeout_s)


@dataclass(frozen=True)
class WorkerSpec:
    """What a rollout worker builds in its own process; picklable, so Ray can ship it anywhere.

    ``model`` holds ``streamrl.policy.load_policy`` arguments: the worker builds the policy (its
    tokeniser, chat codec and architecture) and an engine over it, then receives the trainer's
    weights through Ray's object store before its first episode.
    """

    model: dict[str, Any]
    env: str
    env_options: dict[str, Any] = field(default_factory=dict)
    parser_options: dict[str, Any] = field(default_factory=dict)
    prompt_options: dict[str, Any] = field(default_factory=dict)
    episode: EpisodeSettings = field(default_factory=EpisodeSettings)
    #: "hf" or "vllm" (``streamrl.policy.engines.make_engine``)
    engine: str = "hf"
    #: the engine's copy of the weights (``make_engine``'s ``rollout_dtype``)
    rollout_dtype: str = "same"
    #: torch threads of a worker's engine
    engine_threads: int | None = 1
    #: the block whose inputs the engine hands over with each trajectory (``make_engine``), or None
    capture_layer: int | None = None
    #: tokens of finished sequences whose KV the engine keeps (``make_engine``; None: its default)
    prefix_cache_tokens: int | None = None
    #: Ray CPUs and GPUs each worker reserves (Ray shows a worker only the GPUs it reserved;
    #: a fraction lets workers share one)
    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    seed: int = 0
    #: plays the episodes instead of the environment (an agent function): called in the worker with
    #: its engine and policy, it returns the backend those episodes are played in; picklable
    player: Callable[[InferenceEngine, Any], EpisodeBackend] | None = None
    #: the longest one episode may take before its worker is taken for hung (None: bounded by the
    #: episode settings' timeouts, see ``ray_backend``)
    episode_timeout_s: float | None = None

    def make_env(self) -> Env | AsyncEnv:
        return make(self.env, **self.env_options)

    def make_parser(self, codec: ChatCodec) -> ActionParser:
        """The text form's parser, or the tool form's for the tool format ``codec`` writes."""
        tool_format = tool_format_of(codec) if self.episode.tools else None
        return action_parser(self.env, self.parser_options, tool_format)

    def make_prompt_builder(self) -> PromptBuilder:
        return prompt_builder(self.env, self.prompt_options, self.episode.tools)
