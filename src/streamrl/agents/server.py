"""An OpenAI-compatible chat-completions endpoint over streamrl's engines, recording what the policy
generated (``sessions.py``).

Routes (FastAPI):

* ``POST /sessions/{id}/v1/chat/completions`` (or ``POST /v1/chat/completions`` with the session id
  as the bearer API key): messages, ``tools``, ``tool_choice`` (``auto``/``none``), ``temperature``,
  ``top_p``, ``max_tokens``/``max_completion_tokens``, ``stop``, ``n`` (1 only), ``stream`` (server-sent
  events). Messages are rendered by the model's chat template with the tools; the reply's calls are
  parsed by the model's tool format and returned as ``tool_calls`` (arguments as JSON strings).
* ``GET /v1/models`` (and under a session).
* ``POST /sessions/{id}/reward``: ``{"reward": float}`` ends the episode's scoring; ``{"reward": r,
  "call": k}`` rewards one call.
* ``POST /sessions/next?wait=30`` (``streamrl serve --train``): claim the next dispatched task; the answer
  holds the session's ``base_url``, ``api_key`` and ``task`` (204: nothing yet, ask again).

Every bad request is answered with an OpenAI-style error object and a 4xx status; request bodies
are bounded (``max_request_bytes``). Generation goes through the ``InferenceEngine`` protocol, so the
CPU engine and vLLM serve alike.
"""

# no ``from __future__ import annotations``: FastAPI reads the route handlers' annotations, which
# name classes imported inside ``build_app`` (fastapi is an optional dependency)
import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from streamrl.agents.sessions import Call, Session, SessionStore, request_key, same_reply
from streamrl.policy.protocols import GenerationRequest, InferenceEngine, SamplingParams
from streamrl.policy.tool_format import ToolFormat

MODEL_NAME = "streamrl-policy"


class RequestError(Exception):
    """A bad request: its status and the OpenAI error fields."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass(frozen=True)
class EndpointSettings:
    max_new_tokens: int = 256  # when the request gives none
    max_request_bytes: int = 1 << 20
    #: requests without a session (``streamrl serve`` alone) need this bearer token when set
    token: str | None = None


def _wire_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI wire ``tool_calls`` (arguments as a JSON string) -> the template's (a dict)."""
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    converted = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}.tool_calls[{index}] needs function.name", f"{where}.tool_calls")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                raise RequestError(f"{where}.tool_calls[{index}].function.arguments is not JSON", f"{where}.tool_calls") from None
        converted.append({"type": "function", "id": str(call.get("id") or f"call_{index}"),
                          "function": {"name": function["name"], "arguments": arguments}})
    return converted


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages in the form chat templates render; a ``RequestError`` naming the first problem."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    converted = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object", where)
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(f"{where}.role must be system, user, assistant or tool, got {role!r}", f"{where}.role")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"{where}.content: only text parts are supported", f"{where}.content")
            content = "".join(p.get("text", "") for p in content)
        if content is not None and not isinstance(content, str):
            raise RequestError(f"{where}.content must be a string", f"{where}.content")
        out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content or ""}
        if role == "assistant" and message.get("tool_calls"):
            out["tool_calls"] = _wire_calls(message["tool_calls"], where)
        if role == "tool":
            out["tool_call_id"] = str(message.get("tool_call_id", ""))
            if message.get("name"):
                out["name"] = str(message["name"])
        converted.append(out)
    return converted


def _number(body: dict[str, Any], name: str, low: float, high: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{name} must be a number in [{low}, {high}], got {value!r}", name)
    return float(value)


def sampling_of(body: dict[str, Any], session: Session | None, settings: EndpointSettings, end_id: int) -> SamplingParams:
    if body.get("n") not in (None, 1):
        raise RequestError("n must be 1 (one completion per request)", "n")
    temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if session is not None and session.temperature is not None:  # training: the trainer's sampling wins
        temperature, top_p = session.temperature, session.top_p if session.top_p is not None else 1.0
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is None:
        limit = settings.max_new_tokens
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise RequestError(f"max_tokens must be a positive integer, got {limit!r}", "max_tokens")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop must be a string or a list of up to 4 non-empty strings", "stop")
    return SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=min(limit, settings.max_new_tokens * 8),
                          stop_token_ids=(end_id,), stop_strings=tuple(stop))


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

    def session_of(self, session_id: str | None) -> Session | None:
        if session_id is None:
            return None
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError(f"no open session {session_id!r} (it ended, or was never opened)", None, 404, "not_found_error")
        return session

    async def complete(self, body: Any, session: Session | None) -> dict[str, Any]:
        """One chat completion (a ``chat.completion`` object)."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        messages = template_messages(body.get("messages"))
        tools = body.get("tools") or None
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                                                          and isinstance(t.get("function"), dict) for t in tools)):
            raise RequestError("tools must be a list of {type: function, function: {...}}", "tools")
        if body.get("tool_choice") not in (None, "auto", "none"):
            raise RequestError("tool_choice: only 'auto' and 'none' are supported", "tool_choice")
        if body.get("tool_choice") == "none":
            tools = None
        sampling = sampling_of(body, session, self.settings, self.codec.end_of_turn_id)
        key = request_key(body)
        if session is not None and session.calls and session.calls[-1].key == key:
            session.retries += 1  # a retry of the last call: the same answer, not generated or trained twice
            return session.calls[-1].response
        prompt, continues = self._prompt(messages, tools, session)
        result = await self.engine.generate(GenerationRequest(f"{session.id if session else 'anon'}:{uuid.uuid4().hex[:8]}", prompt, sampling))
        ids = list(result.token_ids)
        text = self.codec.decode(ids[:-1] if ids[-1:] == [self.codec.end_of_turn_id] else ids)
        parsed = self.tool_format.parse(text) if tools else {"content": text.strip(), "tool_calls": []}
        decoded = [c for c in parsed.get("tool_calls") or [] if c.get("error") is None]
        errors = [str(c["error"]) for c in parsed.get("tool_calls") or [] if c.get("error") is not None]
        call_id = uuid.uuid4().hex[:12]
        reply: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or ""}
        if decoded:
            reply["tool_calls"] = [{"type": "function", "id": f"call_{call_id}_{i}",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}} for i, c in enumerate(decoded)]
        finish = "tool_calls" if decoded else ("length" if result.finish_reason == "length" else "stop")
        response = self._response(call_id, reply, finish, len(prompt), len(result.token_ids))
        self.calls_served += 1
        if session is not None:
            session.calls.append(Call(key, messages, reply, response, prompt, list(result.token_ids), list(result.logprobs),
                                      result.policy_version, result.finish_reason, text, errors, continues))
        return response

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

    @staticmethod
    def _response(call_id: str, reply: dict[str, Any], finish: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply["content"] or None}
        if reply.get("tool_calls"):
            message["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
                for c in reply["tool_calls"]
            ]
        return {
            "id": f"chatcmpl-{call_id}", "object": "chat.completion", "created": int(time.time()), "model": MODEL_NAME,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


def stream_chunks(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion as ``chat.completion.chunk`` events: the role, the content, the calls, the finish."""
    choice = response["choices"][0]
    message = choice["message"]
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"], "model": response["model"]}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        chunks.append(chunk({"content": message["content"]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    return chunks


def build_app(endpoint: Endpoint, on_reward: Callable[[Session], None] | None = None,
              claim: Callable[[float], Any] | None = None) -> Any:
    """The FastAPI application over ``endpoint``. ``on_reward`` hears each session's final reward;
    ``claim(wait_s)`` (``streamrl serve --train``) hands out the next dispatched session, or None."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.requests import ClientDisconnect

    app = FastAPI(title="streamrl endpoint", docs_url=None, redoc_url=None)

    def error(exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    async def read_body(request: Request) -> Any:
        size = int(request.headers.get("content-length") or 0)
        if size > endpoint.settings.max_request_bytes:
            raise RequestError(f"request body of {size} bytes exceeds {endpoint.settings.max_request_bytes}", None, 413)
        raw = await request.body()
        if len(raw) > endpoint.settings.max_request_bytes:
            raise RequestError(f"request body exceeds {endpoint.settings.max_request_bytes} bytes", None, 413)
        try:
            return json.loads(raw or b"null")
        except ValueError:
            raise RequestError("the request body is not valid JSON") from None

    def bearer(request: Request) -> str | None:
        value = request.headers.get("authorization", "")
        return value[7:].strip() if value.lower().startswith("bearer ") else None

    async def completions(request: Request, session_id: str | None) -> Any:
        try:
            session = endpoint.session_of(session_id)
            if session is None and endpoint.settings.token is not None and bearer(request) != endpoint.settings.token:
                raise RequestError("a valid bearer token is required", None, 401, "authentication_error")
            body = await read_body(request)
            response = await endpoint.complete(body, session)
        except RequestError as exc:
            return error(exc)
        except ClientDisconnect:  # the agent went away (its episode was cancelled): nobody to answer
            return Response(status_code=499)
        except Exception as exc:  # the engine failed: an error answer, never a crashed server
            return error(RequestError(f"generation failed: {type(exc).__name__}: {exc}", None, 500, "server_error"))
        if isinstance(body, dict) and body.get("stream"):
            async def events() -> AsyncIterator[bytes]:
                for chunk in stream_chunks(response):
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse(response)

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def session_completions(session_id: str, request: Request) -> Any:
        return await completions(request, session_id)

    @app.post("/v1/chat/completions")
    async def plain_completions(request: Request) -> Any:
        token = bearer(request)  # a session's id is also its API key
        return await completions(request, token if token and endpoint.sessions.get(token) else None)

    @app.get("/v1/models")
    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str | None = None) -> Any:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "streamrl"}]}

    @app.post("/sessions/next")
    async def next_session(request: Request) -> Any:
        if claim is None:
            return error(RequestError("this endpoint hands out no tasks (start it with streamrl serve --train)", None, 404,
                                      "not_found_error"))
        if endpoint.settings.token is not None and bearer(request) != endpoint.settings.token:
            return error(RequestError("a valid bearer token is required", None, 401, "authentication_error"))
        wait = request.query_params.get("wait", "30")
        try:
            session = await claim(min(max(float(wait), 0.0), 300.0))
        except ValueError:
            return error(RequestError("wait must be a number of seconds", "wait"))
        if session is None:
            return Response(status_code=204)  # nothing dispatched yet: ask again
        return {"session_id": session.id, "base_url": f"{str(request.base_url).rstrip('/')}/sessions/{session.id}/v1",
                "api_key": session.id, "task": session.task}

    @app.post("/sessions/{session_id}/reward")
    async def reward(session_id: str, request: Request) -> Any:
        try:
            session = endpoint.session_of(session_id)
            assert session is not None  # session_of(a str) returns a session or raises
            body = await read_body(request)
            value = body.get("reward") if isinstance(body, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RequestError("reward must be a number", "reward")
            call = body.get("call")
            if call is None:
                session.finished_reward(float(value))
            elif isinstance(call, int) and 0 <= call < len(session.calls):
                session.call_rewards[call] = float(value)
            else:
                raise RequestError(f"call must index one of the session's {len(session.calls)} calls", "call")
        except ValueError as exc:
            return error(RequestError(str(exc), "reward"))
        except RequestError as exc:
            return error(exc)
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

