"""An OpenAI-compatible chat-completions endpoint over streamrl's engines, recording what the policy
generated (``sessions.py``); what a request may ask is ``protocol.py``'s.

Routes (FastAPI):

* ``POST /sessions/{id}/v1/chat/completions`` (or ``POST /v1/chat/completions`` with the session's
  key as the bearer API key): messages rendered by the model's chat template with the request's
  tools; the reply's calls parsed by the model's tool format and returned as ``tool_calls``.
  ``stream`` sends content as the engine samples it.
* ``GET /v1/models`` (and under a session); ``GET /health`` (the one route without a key).
* ``POST /sessions/{id}/reward``: ``{"reward": float}`` ends the episode's scoring; ``{"reward": r,
  "call": k}`` rewards one call. A reward that is not a finite number inside ``agent.reward_range``
  is refused (400) and keeps the episode out of training.
* ``POST /sessions/next?wait=30`` (``streamrl serve --train``): claim the next dispatched task; the answer
  holds the session's ``base_url``, ``api_key`` and ``task`` (204: nothing yet, ask again).

Access: a session's routes take the session's key (or the endpoint's token); with a token, every
other route but ``/health`` needs it; while training, nothing reaches the engine without one of them.
Every error is an OpenAI-shaped JSON object (unknown routes and methods too); bodies are counted as
they arrive and refused at ``max_request_bytes``. Generation goes through the ``InferenceEngine``
protocol, so the CPU engine and vLLM serve alike.
"""

# no ``from __future__ import annotations``: FastAPI reads the route handlers' annotations, which
# name classes imported inside ``build_app`` (fastapi is an optional dependency)
import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from streamrl.agents.protocol import (
    MODEL_NAME,
    Options,
    RequestError,
    check_fields,
    chunk,
    closing_chunks,
    completion,
    context_exceeded,
    logprobs_content,
    offered_tools,
    options_of,
    parse_json,
    sampling_of,
    template_messages,
)
from streamrl.agents.sessions import Call, Session, SessionStore, request_key, same_reply
from streamrl.policy.protocols import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_TOKENS_CAP,
    GenerationRequest,
    InferenceEngine,
    SamplingParams,
)
from streamrl.policy.tool_format import ToolFormat


@dataclass(frozen=True)
class EndpointSettings:
    #: a reply's tokens when the request gives no ``max_tokens`` (``rollout.max_new_tokens``)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    #: the most tokens a request may ask for (``agent.max_tokens``; above it: 400)
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP
    #: prompt + completion at most (a longer prompt: 400 ``context_length_exceeded``); None: the engine's
    max_context_tokens: int | None = None
    max_request_bytes: int = 1 << 20
    #: when set, every route but ``/health`` needs it as the bearer token (a session's routes also
    #: take the session's own key)
    token: str | None = None
    #: ``/v1/chat/completions`` without a key is served (``streamrl serve`` without a token); never
    #: while training, where only sessions (and the token) reach the engine
    anonymous: bool = True


@dataclass
class Prepared:
    """A checked request, ready to generate (or a retry, answered from the record)."""

    session: Session | None
    key: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    options: Options
    head: dict[str, Any]  # the answer's id, created and model
    prompt: list[int] = field(default_factory=list)
    continues: bool = False
    sampling: SamplingParams | None = None
    answered: dict[str, Any] | None = None


class Endpoint:
    """The chat-completions logic, independent of the HTTP framework (the FastAPI app calls it)."""

    def __init__(self, engine: InferenceEngine, codec: Any, tool_format: ToolFormat,
                 sessions: SessionStore | None = None, settings: EndpointSettings | None = None):
        self.engine = engine
        self.codec = codec
        self.tool_format = tool_format
        self.sessions = sessions or SessionStore()
        self.settings = settings or EndpointSettings()
        self.calls_served = 0

    def session_of(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError(f"no open session {session_id!r} (it ended, or was never opened)", None, 404, "not_found_error")
        return session

    def prepare(self, body: Any, session: Session | None) -> Prepared:
        """Check a request and render its prompt; a ``RequestError`` names the first problem."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        check_fields(body)
        if session is None and body.get("model") not in (None, MODEL_NAME):  # as vLLM's server answers
            raise RequestError(f"The model `{body['model']}` does not exist (this endpoint serves {MODEL_NAME!r})",
                               "model", 404, "NotFoundError", "model_not_found")
        messages = template_messages(body.get("messages"))
        tools = offered_tools(body)
        options = options_of(body, self.settings.max_tokens_cap)
        key = request_key(body)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": MODEL_NAME}
        if session is not None and session.calls and session.calls[-1].key == key:
            session.retries += 1  # a retry of the last call: the same answer, not generated or trained twice
            answered = session.calls[-1].response
            return Prepared(session, key, messages, tools, options, {k: answered[k] for k in head}, answered=answered)
        prompt, continues = self._prompt(messages, tools, session)
        limit = self.settings.max_context_tokens
        room = None if limit is None else limit - len(prompt)
        if room is not None and (room < 1 or (options.max_tokens or 0) > room):
            raise context_exceeded(limit, len(prompt), options.max_tokens)  # type: ignore[arg-type]
        new_tokens = min(options.max_tokens or self.settings.max_new_tokens, room or self.settings.max_tokens_cap)
        trainer = None if session is None or session.temperature is None else (
            session.temperature, session.top_p if session.top_p is not None else 1.0)
        sampling = sampling_of(options, new_tokens, self.codec.end_of_turn_id, trainer)
        return Prepared(session, key, messages, tools, options, head, prompt, continues, sampling)

    async def run(self, prepared: Prepared, on_token: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Generate the answer to ``prepared`` (a ``chat.completion``), calling ``on_token`` with each
        id as the engine samples it (engines that cannot: not at all), and record it in the session."""
        if prepared.answered is not None:
            return prepared.answered
        session = prepared.session
        request = GenerationRequest(f"{session.id if session else 'anon'}:{prepared.head['id'][9:]}", prepared.prompt,
                                    prepared.sampling or SamplingParams(), on_token=on_token)
        result = await self.engine.generate(request)
        if result.error is not None or result.finish_reason in ("error", "abort"):
            raise RequestError(f"generation failed ({result.finish_reason}): {result.error or 'the engine aborted it'}",
                               None, 503 if result.finish_reason == "abort" else 500, "server_error")
        ids = list(result.token_ids)
        text = self.codec.decode(ids[:-1] if ids[-1:] == [self.codec.end_of_turn_id] else ids)
        tools = prepared.tools
        parsed = self.tool_format.parse(text) if tools else {"content": text.strip(), "tool_calls": []}
        offered = {t["function"]["name"] for t in tools or []}
        decoded = [c for c in parsed.get("tool_calls") or [] if c.get("error") is None]
        errors = [str(c["error"]) for c in parsed.get("tool_calls") or [] if c.get("error") is not None]
        errors += [f"unknown_tool: {c['name']!r} was not offered" for c in decoded if c["name"] not in offered]
        reply: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or ""}
        if decoded:
            reply["tool_calls"] = [{"type": "function", "id": f"call_{prepared.head['id'][9:]}_{i}",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}} for i, c in enumerate(decoded)]
        finish = "tool_calls" if decoded else ("length" if result.finish_reason == "length" else "stop")
        logprobs = logprobs_content([self.codec.decode([i]) for i in ids], list(result.logprobs)) if prepared.options.logprobs else None
        response = completion(prepared.head, reply, finish, len(prepared.prompt), len(ids), logprobs)
        self.calls_served += 1
        if session is not None:
            session.calls.append(Call(prepared.key, prepared.messages, reply, response, prepared.prompt, ids,
                                      list(result.logprobs), result.policy_version, result.finish_reason, text, errors,
                                      prepared.continues))
        return response

    async def complete(self, body: Any, session: Session | None) -> dict[str, Any]:
        """One chat completion (a ``chat.completion`` object)."""
        return await self.run(self.prepare(body, session))

    def _prompt(self, messages: list[dict[str, Any]], tools: Any, session: Session | None) -> tuple[list[int], bool]:
        """The prompt ids, and whether they continue the session's previous call (prompt + completion)."""
        previous = session.calls[-1] if session is not None and session.calls else None
        if previous is not None:
            seen = len(previous.messages)
            if (len(messages) > seen + 1 and messages[:seen] == previous.messages
                    and messages[seen].get("role") == "assistant" and same_reply(previous.reply, messages[seen])):
                with contextlib.suppress(Exception):  # messages a bridge cannot append: rendered afresh
                    closing = [] if previous.completion_ids[-1:] == [self.codec.end_of_turn_id] else [self.codec.end_of_turn_id]
                    bridge = self.codec.encode_bridge(messages[seen + 1:], tools=tools)
                    return previous.prompt_ids + previous.completion_ids + closing + list(bridge), True
        try:
            prompt = list(self.codec.encode_chat(messages, add_generation_prompt=True, tools=tools))
        except Exception as error:
            raise RequestError(f"the chat template cannot render these messages: {error}", "messages") from None
        extended = previous is not None and prompt[: len(previous.prompt_ids) + len(previous.completion_ids)] == (
            previous.prompt_ids + previous.completion_ids)
        return prompt, extended


class ContentStream:
    """The content of a reply as its ids arrive, held back where it might still turn out to be a
    tool call or a stop string (so what was streamed is always a prefix of the final content)."""

    def __init__(self, endpoint: Endpoint, prepared: Prepared):
        self.endpoint, self.tools = endpoint, prepared.tools
        self.hold = max([16, *map(len, prepared.options.stop)])  # longer than any call's opening tag
        self.ids: list[int] = []
        self.sent = ""
        self.calls_started = False

    def push(self, token: int) -> str:
        """The content that can be sent now that ``token`` came ('' if none)."""
        self.ids.append(token)
        if self.calls_started or token == self.endpoint.codec.end_of_turn_id:
            return ""
        text = self.endpoint.codec.decode(self.ids)
        parsed = self.endpoint.tool_format.parse(text) if self.tools else {"content": text.strip()}
        if parsed.get("tool_calls"):
            self.calls_started = True
            return ""
        content = parsed.get("content") or ""
        safe = content[: max(0, len(content) - self.hold)]
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta


def _event(value: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(value)}\n\n".encode()


async def stream_events(endpoint: Endpoint, prepared: Prepared) -> AsyncIterator[bytes]:
    """Server-sent events of one completion, content sent as the engine samples it."""
    arrived: asyncio.Queue[int | None] = asyncio.Queue()
    task = asyncio.ensure_future(endpoint.run(prepared, on_token=arrived.put_nowait))
    task.add_done_callback(lambda _: arrived.put_nowait(None))
    content = ContentStream(endpoint, prepared)
    try:
        yield _event(chunk(prepared.head, {"role": "assistant", "content": ""}))
        while (token := await arrived.get()) is not None:
            if delta := content.push(token):
                yield _event(chunk(prepared.head, {"content": delta}))
        try:
            response = task.result()
        except RequestError as exc:  # the stream has begun: the error travels as an event
            yield _event(exc.body())
        else:
            for event in closing_chunks(response, content.sent, prepared.options.include_usage):
                yield _event(event)
        yield b"data: [DONE]\n\n"
    finally:
        if not task.done():  # the client went away: stop generating for nobody
            task.cancel()


def build_app(endpoint: Endpoint, on_reward: Callable[[Session], None] | None = None,
              claim: Callable[[float], Any] | None = None) -> Any:
    """The FastAPI application over ``endpoint``. ``on_reward`` hears each session's final reward
    (or its refusal); ``claim(wait_s)`` (``streamrl serve --train``) hands out the next dispatched
    session, or None."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    app = FastAPI(title="streamrl endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    settings = endpoint.settings

    def error(exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:  # unknown routes, wrong methods
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error(RequestError(f"{request.method} {request.url.path}: {exc.detail}", None, exc.status_code, kind))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(RequestError(f"invalid request: {exc.errors()[:1]}"))

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError) -> JSONResponse:  # any route's bad request
        return error(exc)

    async def read_body(request: Request) -> Any:
        """The JSON body, counted as it streams in (with or without Content-Length) and refused at the cap."""
        cap = settings.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise RequestError(f"request body of {declared} bytes exceeds {cap}", None, 413)
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > cap:
                raise RequestError(f"request body exceeds {cap} bytes", None, 413)
            parts.append(part)
        return parse_json(b"".join(parts))

    def bearer(request: Request) -> str:
        value = request.headers.get("authorization", "")
        return value[7:].strip() if value.lower().startswith("bearer ") else ""

    def is_token(key: str) -> bool:
        return settings.token is not None and hmac.compare_digest(key.encode(), settings.token.encode())

    def unauthorised(what: str) -> RequestError:
        return RequestError(f"{what} needs a valid API key (Authorization: Bearer ...)", None, 401, "authentication_error")

    def caller(request: Request, session_id: str | None) -> Session | None:
        """Who may call: a session (by its key, or the token on its route), or anonymous; else 401."""
        key = bearer(request)
        if session_id is not None:
            expected = endpoint.sessions.key_of(session_id)
            if not is_token(key) and not (expected and key and hmac.compare_digest(key.encode(), expected.encode())):
                raise unauthorised(f"session {session_id[:8]}...")
            return endpoint.session_of(session_id)  # the key's holder hears when its session ended (404)
        session = endpoint.sessions.by_key(key) if key else None
        if session is not None or is_token(key) or (settings.token is None and settings.anonymous):
            return session
        raise unauthorised("this endpoint")

    async def completions(request: Request, session_id: str | None) -> Any:
        try:
            prepared = endpoint.prepare(await read_body(request), caller(request, session_id))
            if prepared.options.stream:
                return StreamingResponse(stream_events(endpoint, prepared), media_type="text/event-stream")
            return JSONResponse(await endpoint.run(prepared))
        except RequestError as exc:
            return error(exc)
        except ClientDisconnect:  # the agent went away (its episode was cancelled): nobody to answer
            return Response(status_code=499)
        except Exception as exc:  # the engine failed: an error answer, never a crashed server
            return error(RequestError(f"generation failed: {type(exc).__name__}: {exc}", None, 500, "server_error"))

    @app.get("/health")
    async def health() -> Any:
        return {"ok": True}

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def session_completions(session_id: str, request: Request) -> Any:
        return await completions(request, session_id)

    @app.post("/v1/chat/completions")
    async def plain_completions(request: Request) -> Any:
        return await completions(request, None)

    @app.get("/v1/models")
    @app.get("/sessions/{session_id}/v1/models")
    async def models(request: Request, session_id: str | None = None) -> Any:
        caller(request, session_id)
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "streamrl"}]}

    @app.post("/sessions/next")
    async def next_session(request: Request) -> Any:
        if claim is None:
            raise RequestError("this endpoint hands out no tasks (start it with streamrl serve --train)", None, 404,
                               "not_found_error")
        if settings.token is not None and not is_token(bearer(request)):
            raise unauthorised("claiming a task")
        try:
            wait = min(max(float(request.query_params.get("wait", "30")), 0.0), 300.0)
        except ValueError:
            raise RequestError("wait must be a number of seconds", "wait") from None
        session = await claim(wait)
        if session is None:
            return Response(status_code=204)  # nothing dispatched yet: ask again
        return {"session_id": session.id, "base_url": f"{str(request.base_url).rstrip('/')}/sessions/{session.id}/v1",
                "api_key": session.key, "task": session.task}

    @app.post("/sessions/{session_id}/reward")
    async def reward(session_id: str, request: Request) -> Any:
        session = caller(request, session_id)
        assert session is not None  # caller(a session id) returns its session or raises
        body = await read_body(request)
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object {reward, call?}")
        call = body.get("call")
        if call is not None and (isinstance(call, bool) or not isinstance(call, int)):
            raise RequestError(f"call must be an integer index, got {call!r}", "call")
        refusals = len(session.refused)
        try:
            session.give_reward(body.get("reward"), call)
        except ValueError as exc:
            refused = len(session.refused) > refusals
            if refused and call is None and on_reward is not None:
                on_reward(session)  # a refused final reward ends the episode (not trained on)
            raise RequestError(str(exc), "reward" if refused else "call") from None
        if on_reward is not None and call is None:
            on_reward(session)
        return {"ok": True}

    return app


class EndpointServer:
    """The app served by uvicorn inside the caller's event loop (the engine's loop), on
    ``host:port`` (port 0: a free one). Signals are left to the caller."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        self.app, self.host, self.port = app, host, port
        self._server: Any = None
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> "EndpointServer":
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # the trainer owns SIGINT/SIGTERM
                yield

        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start (port in use, ...)
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._task is not None:
                with contextlib.suppress(Exception):
                    await self._task
            self._server = None

