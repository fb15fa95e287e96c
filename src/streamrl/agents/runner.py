"""Training an agent function: ``async def run(client, task) -> float``.

``AgentBackend`` is an ``EpisodeBackend``: for each dispatched task it opens a session on an
in-process endpoint, hands the agent an ``openai.AsyncOpenAI`` client bound to that session
(``base_url`` .../sessions/<id>/v1, the session's key as API key), awaits its reward (the return
value, or what it posted to ``/sessions/<id>/reward``), and returns the session as a trajectory. An
agent that raises, overruns ``timeout_s``, gives no reward or a refused one (not a finite number
inside ``reward_range``) ends its episode with ``agent_error``, ``agent_timeout``, ``no_reward`` or
``reward_refused`` and the reason text; such an episode has no outcome and is not trained on. The
endpoint serves sessions only: an anonymous caller gets 401. The dispatcher is unchanged: SPO++'s sampler and frozen baselines choose tasks as they
choose prompts, GRPO's groups replay them.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.agents.server import Endpoint, EndpointServer, EndpointSettings, build_app
from streamrl.agents.sessions import DEFAULT_REWARD_RANGE, Session, to_trajectory
from streamrl.policy.protocols import DEFAULT_MAX_NEW_TOKENS, DEFAULT_MAX_TOKENS_CAP, InferenceEngine
from streamrl.policy.tool_format import ToolFormat, tool_format_of
from streamrl.rollout.trajectory import DispatchRecord, Trajectory

AgentFunction = Callable[[Any, dict[str, Any]], Awaitable[Any]]


class AgentLoadError(ValueError):
    """``--agent`` or ``--tasks`` names something that cannot be loaded; the message says what."""


def load_agent(spec: str) -> AgentFunction:
    """``path/to/file.py:function`` or ``package.module:function`` -> the async function."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise AgentLoadError(f"agent.function: {spec!r} must look like path/to/agent.py:run or package.module:run")
    try:
        if where.endswith(".py"):
            path = Path(where).expanduser()
            if not path.is_file():
                raise AgentLoadError(f"agent.function: no file {path}")
            module_spec = importlib.util.spec_from_file_location(f"streamrl_agent_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
            sys.modules[module_spec.name] = module  # type: ignore[union-attr]
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(where)
    except AgentLoadError:
        raise
    except Exception as error:
        raise AgentLoadError(f"agent.function: cannot import {where} ({type(error).__name__}: {error})") from None
    function = getattr(module, name, None)
    if function is None or not asyncio.iscoroutinefunction(function):
        raise AgentLoadError(f"agent.function: {where} has no async function {name!r} (async def {name}(client, task) -> float)")
    return function


def read_tasks(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """A JSONL file of tasks (one JSON object per line) -> tasks by split. Each task gets an ``id``
    (its own ``id``, else ``<split>/<n>``); ``split`` defaults to ``train``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise AgentLoadError(f"agent.tasks: no file {path}")
    splits: dict[str, list[dict[str, Any]]] = {}
    seen: dict[str, int] = {}  # id -> line
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise AgentLoadError(f"agent.tasks: {path}:{number} is not UTF-8 text (byte {error.start})") from None
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as error:
            raise AgentLoadError(f"agent.tasks: {path}:{number} is not JSON ({error})") from None
        if not isinstance(task, dict):
            raise AgentLoadError(f"agent.tasks: {path}:{number} must be a JSON object")
        split = str(task.get("split", "train"))
        rows = splits.setdefault(split, [])
        task = {**task, "id": str(task.get("id", f"{split}/{len(rows)}"))}
        if task["id"] in seen:  # two tasks under one id would share one prompt's statistics
            raise AgentLoadError(f"agent.tasks: {path}:{number} repeats id {task['id']!r} (first on line {seen[task['id']]})")
        seen[task["id"]] = number
        rows.append(task)
    if not splits.get("train"):
        raise AgentLoadError(f"agent.tasks: {path} has no training task (rows without split, or split 'train')")
    return splits


@dataclass(frozen=True)
class AgentSettings:
    timeout_s: float = 300.0
    #: the sampling every session uses, whatever the agent asks (None: the agent's own)
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    #: a reply's tokens when the request names none (``rollout.max_new_tokens``) and at most (``agent.max_tokens``)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    max_tokens: int = DEFAULT_MAX_TOKENS_CAP
    #: prompt + completion at most (None: the engine's own limit)
    max_context_tokens: int | None = None
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE

    def endpoint(self, token: str | None = None) -> EndpointSettings:
        """The endpoint's settings while training: sessions only (and ``token``'s holder)."""
        return EndpointSettings(max_new_tokens=self.max_new_tokens, max_tokens_cap=self.max_tokens,
                                max_context_tokens=self.max_context_tokens, token=token, anonymous=False)

    def session(self, record: DispatchRecord, task: dict[str, Any]) -> Session:
        return Session(uuid.uuid4().hex, record, task, self.temperature, self.top_p, self.reward_range)


class AgentBackend:
    """Episodes played by an agent function against an in-process endpoint over ``engine``."""

    def __init__(self, engine: InferenceEngine, codec: Any, tool_format: ToolFormat, agent: AgentFunction,
                 tasks: list[dict[str, Any]], settings: AgentSettings = AgentSettings()):
        self.engine = engine
        self.agent = agent
        self.tasks = {task["id"]: task for task in tasks}
        self.settings = settings
        self.endpoint = Endpoint(engine, codec, tool_format, settings=settings.endpoint())
        self.server: EndpointServer | None = None

    @property
    def version(self) -> int:
        return self.engine.version

    async def start(self, log: Any = None) -> None:
        if self.server is None:
            self.server = await EndpointServer(build_app(self.endpoint)).start()

    async def play(self, record: DispatchRecord) -> tuple[Trajectory, str]:
        import openai

        await self.start()
        assert self.server is not None
        task = self.tasks[record.prompt_id]
        session = self.endpoint.sessions.open(self.settings.session(record, task))
        client = openai.AsyncOpenAI(base_url=f"{self.server.url}/sessions/{session.id}/v1", api_key=session.key,
                                    max_retries=1, timeout=self.settings.timeout_s)
        end_reason, error = "terminated", None
        try:
            returned = await asyncio.wait_for(self.agent(client, dict(task)), self.settings.timeout_s)
            if returned is not None:
                try:
                    session.give_reward(returned)
                except ValueError:
                    pass  # noted in session.refused: the trajectory says reward_refused
            if session.reward is None and not session.refused:
                end_reason, error = "no_reward", "the agent returned None and posted no reward"
        except asyncio.TimeoutError:
            end_reason, error = "agent_timeout", f"the agent ran past {self.settings.timeout_s:g} s"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an agent's failure ends its episode, never the training
            end_reason, error = "agent_error", f"{type(exc).__name__}: {exc}"
        finally:
            self.endpoint.sessions.close(session.id)
            await client.close()
        return to_trajectory(session, end_reason, error), "agent"

    async def play_all(self, task_ids: list[str], *, concurrency: int, request_prefix: str) -> list[Trajectory]:
        """Each task once, at most ``concurrency`` at a time, outside the training stream (evaluation,
        an algorithm's warm start); results in ``task_ids`` order."""
        slots = asyncio.Semaphore(concurrency)

        async def one(index: int, task_id: str) -> Trajectory:
            async with slots:
                record = DispatchRecord(request_id=f"{request_prefix}-{index}", prompt_id=task_id, seq=index, policy_version=self.version)
                return (await self.play(record))[0]

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(task_ids))))

    def publish(self, version: int) -> None:
        return None  # the trainer updated the engine's weights itself

    async def close(self, timeout_s: float = 5.0) -> list[str]:
        if self.server is not None:
            await self.server.close()
            self.server = None
        return []


@dataclass(frozen=True)
class AgentPlayer:
    """What a Ray rollout worker builds to play agent episodes on its own engine (picklable: the
    agent is named by its ``module:function`` spec and loaded in the worker, which therefore needs
    the file at the same path, as a local Ray cluster has)."""

    function: str
    tasks: list[dict[str, Any]]
    settings: AgentSettings

    def __call__(self, engine: InferenceEngine, policy: Any) -> AgentBackend:
        tool_format = tool_format_of(policy)  # the worker's policy was loaded with model.tool_format
        return AgentBackend(engine, policy, tool_format, load_agent(self.function), self.tasks, self.settings)


class ExternalAgentBackend:
    """Episodes played by agents outside this process (``streamrl serve --train``): each dispatched
    task opens a session that an agent claims with ``POST /sessions/next`` (it gets the task, the
    session's ``base_url`` and API key), talks to through the endpoint, and ends by posting its reward
    to ``/sessions/<id>/reward``. A task nobody claims, or a session without a reward, within
    ``timeout_s`` ends with ``agent_timeout`` (not trained on)."""

    def __init__(self, engine: InferenceEngine, codec: Any, tool_format: ToolFormat, tasks: list[dict[str, Any]],
                 settings: AgentSettings = AgentSettings(), host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        self.engine = engine
        self.tasks = {task["id"]: task for task in tasks}
        self.settings = settings
        self.endpoint = Endpoint(engine, codec, tool_format, settings=settings.endpoint(token))
        self.pending: asyncio.Queue[Session] = asyncio.Queue()
        self._rewarded: dict[str, asyncio.Event] = {}
        self.server = EndpointServer(build_app(self.endpoint, on_reward=self._on_reward, claim=self._claim), host, port)
        self._started = False

    @property
    def version(self) -> int:
        return self.engine.version

    async def start(self, log: Any = None) -> None:
        if not self._started:
            await self.server.start()
            self._started = True
            print(f"agents claim tasks at POST {self.server.url}/sessions/next", flush=True)

    async def _claim(self, wait_s: float) -> Session | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                session = await asyncio.wait_for(self.pending.get(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return None
            if not session.closed:  # a dispatch the trainer gave up on (timed out, shut down) is skipped
                return session

    def _on_reward(self, session: Session) -> None:
        event = self._rewarded.get(session.id)
        if event is not None:
            event.set()

    async def play(self, record: DispatchRecord) -> tuple[Trajectory, str]:
        await self.start()
        session = self.endpoint.sessions.open(self.settings.session(record, self.tasks[record.prompt_id]))
        event = self._rewarded[session.id] = asyncio.Event()
        await self.pending.put(session)
        end_reason, error = "terminated", None
        try:
            await asyncio.wait_for(event.wait(), self.settings.timeout_s)
        except asyncio.TimeoutError:
            end_reason, error = "agent_timeout", f"no reward within {self.settings.timeout_s:g} s"
        finally:
            self._rewarded.pop(session.id, None)
            self.endpoint.sessions.close(session.id)
        return to_trajectory(session, end_reason, error), "external"

    def publish(self, version: int) -> None:
        return None

    async def close(self, timeout_s: float = 5.0) -> list[str]:
        if self._started:
            await self.server.close()
            self._started = False
        return []
