"""The endpoint against hostile clients and as OpenAI answers (issue 52): rewards that are not finite
or out of range, bodies without a length, deep JSON, keys and tokens, the context limit, the
``max_tokens`` cap, log-probs, streaming as the engine samples, refused parameters, tools that were
not offered, and transcripts that show what the agent sent back. Through the official ``openai``
client where it can send the request, raw httpx where it cannot."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.agents import AgentBackend, AgentSettings, Endpoint, EndpointServer, EndpointSettings, Session, build_app
from streamrl.agents.protocol import MAX_JSON_DEPTH, MODEL_NAME
from streamrl.agents.sessions import to_trajectory
from streamrl.policy.protocols import GenerationResult
from streamrl.policy.scripted import CharCodec, ScriptedEngine
from streamrl.policy.tool_format import resolve_tool_format
from streamrl.rollout.trajectory import DispatchRecord

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
MUL = {"type": "function", "function": {"name": "mul", "description": "Multiply.", "parameters": {"type": "object", "properties": {}}}}
LONG = "A reply long enough to arrive in several pieces when it is streamed to the client."
HI = [{"role": "user", "content": "hi"}]


def scripted(prompt: str) -> str:
    if "<tool_response>" in prompt:
        return "The sum is " + prompt.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0]
    if "<tools>" in prompt:
        return 'Let me add.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    return LONG if "long" in prompt else "Hello there."


def record(n: int = 0) -> DispatchRecord:
    return DispatchRecord(request_id=f"r{n}", prompt_id=f"train/{n}", seq=n, policy_version=0)


class Served:
    def __init__(self, engine=None, **settings):
        codec = CharCodec()
        self.engine = engine or ScriptedEngine(scripted, codec)
        settings = {"max_new_tokens": 256, **settings}  # the scripted replies are longer than the default 48
        self.endpoint = Endpoint(self.engine, codec, resolve_tool_format(codec)[0], settings=EndpointSettings(**settings))
        self.server = EndpointServer(build_app(self.endpoint, on_reward=lambda session: None))

    async def __aenter__(self):
        await self.server.start()
        return self

    async def __aexit__(self, *exc):
        await self.server.close()

    def session(self, n: int = 0, **fields) -> Session:
        return self.endpoint.sessions.open(Session(f"s{n}", record(n), {"id": f"train/{n}"}, **fields))

    def client(self, session: Session | None = None, key: str | None = None) -> openai.AsyncOpenAI:
        base = f"{self.server.url}/sessions/{session.id}/v1" if session else f"{self.server.url}/v1"
        return openai.AsyncOpenAI(base_url=base, api_key=key or (session.key if session else "none"), max_retries=0)


def served(test, **settings):
    async def main():
        async with Served(**settings) as endpoint:
            await test(endpoint)

    asyncio.run(main())


# -- rewards --------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, phrase, param", [
    (b'{"reward": NaN}', "must be finite", "reward"),
    (b'{"reward": NaN, "call": 0}', "must be finite", "reward"),
    (b'{"reward": -Infinity}', "must be finite", "reward"),
    (b'{"reward": 1e308}', "outside agent.reward_range", "reward"),
    (b'{"reward": "1"}', "must be a number", "reward"),
    (b'{"reward": 1.0, "call": 7}', "call must index", "call"),
], ids=["nan", "nan-per-call", "-inf", "1e308", "string", "bad-call"])
def test_a_bad_reward_over_http_is_refused_with_a_400_naming_the_field_and_keeps_the_episode_out(body, phrase, param):
    async def test(endpoint):
        session = endpoint.session()
        client = endpoint.client(session)
        await client.chat.completions.create(model="any", messages=HI)
        await client.close()
        headers = {"Authorization": f"Bearer {session.key}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(headers=headers) as http:
            answer = await http.post(f"{endpoint.server.url}/sessions/{session.id}/reward", content=body)
        assert answer.status_code == 400 and phrase in answer.json()["error"]["message"]
        assert answer.json()["error"]["param"] == param
        trajectory = to_trajectory(session, "terminated")
        if param == "reward":
            assert trajectory.end_reason == "reward_refused" and trajectory.outcome is None and phrase in trajectory.error
        else:  # a call index that does not exist refuses nothing: the episode stands
            assert not session.refused

    served(test)


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**400, 10**400), st.booleans(),
                 st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2)), st.booleans())
@settings(max_examples=200, deadline=None)
def test_no_reward_however_made_gives_a_non_finite_or_out_of_range_outcome(value, per_call):
    """Property: a reward of any value, final or per call, is accepted inside the range or refused
    with a reason, and the episode's outcome is None or finite inside the range."""
    session = Session("s", record(), {"id": "train/0"}, reward_range=(-1.0, 1.0))
    session.calls.append(None)  # one call to reward (only its index is read)
    try:
        session.give_reward(value, 0 if per_call else None)
    except ValueError as refusal:
        assert session.refused == [str(refusal)]
    if not per_call:
        session.calls.clear()
        trajectory = to_trajectory(session, "terminated")
        outcome = trajectory.outcome
        assert outcome is None or (math.isfinite(outcome) and -1.0 <= outcome <= 1.0)
        assert (outcome is None) == bool(session.refused) and (trajectory.end_reason == "reward_refused") == bool(session.refused)


@pytest.mark.parametrize("returned", [float("nan"), float("inf"), -float("inf"), 1e308, 10**400, "1.0", [1.0]])
def test_a_bad_reward_an_agent_function_returns_ends_its_episode_as_refused(returned):
    async def agent(client, task):
        await client.chat.completions.create(model="any", messages=HI)
        return returned

    async def main():
        codec = CharCodec()
        backend = AgentBackend(ScriptedEngine(scripted, codec), codec, resolve_tool_format(codec)[0], agent,
                               [{"id": "train/0", "prompt": "hi"}], AgentSettings(timeout_s=5, reward_range=(0.0, 1.0)))
        try:
            return (await backend.play(record()))[0]
        finally:
            await backend.close()

    trajectory = asyncio.run(main())
    assert trajectory.end_reason == "reward_refused" and trajectory.outcome is None and "reward" in trajectory.error
    assert len(trajectory.turns) == 1  # the transcript is kept, for the record


# -- bodies and errors ----------------------------------------------------------------------------

def test_a_body_without_content_length_is_counted_as_it_arrives_and_refused_at_the_cap():
    """96 MiB sent chunked (no Content-Length) to a 256 KiB cap: 413, and this process (the server's)
    never holds the body: its resident memory grows by far less than what was sent."""
    piece = b" " * (1 << 20)

    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    async def test(endpoint):
        before, peak, sending = resident(), 0, True

        async def watch():
            nonlocal peak
            while sending:
                peak = max(peak, resident())
                await asyncio.sleep(0.005)

        async def chunks():
            for _ in range(96):
                yield piece

        watcher = asyncio.ensure_future(watch())
        async with httpx.AsyncClient(timeout=60) as http:
            try:
                answer = await http.post(f"{endpoint.server.url}/v1/chat/completions", content=chunks())
            except httpx.TransportError:  # the server may close the connection on the rest of the body
                answer = None
        sending = False
        await watcher
        if answer is not None:
            assert answer.status_code == 413 and "exceeds" in answer.json()["error"]["message"]
        assert peak - before < 32 << 20, f"the server grew by {(peak - before) >> 20} MiB for a refused body"

    served(test, max_request_bytes=256 << 10)


def test_deep_json_unknown_routes_and_methods_get_openai_shaped_4xx():
    async def test(endpoint):
        url = endpoint.server.url
        async with httpx.AsyncClient() as http:
            for depth in (MAX_JSON_DEPTH + 1, 100_000):
                deep = b"[" * depth + b"]" * depth
                answer = await http.post(f"{url}/v1/chat/completions", content=deep)
                assert answer.status_code == 400 and "nests deeper" in answer.json()["error"]["message"]
            for method, path, status in (("GET", "/nowhere", 404), ("DELETE", "/v1/chat/completions", 405),
                                         ("GET", "/v1/chat/completions", 405)):
                answer = await http.request(method, f"{url}{path}")
                assert answer.status_code == status and set(answer.json()["error"]) == {"message", "type", "param", "code"}

    served(test)


# -- access ---------------------------------------------------------------------------------------

def test_with_a_token_every_route_but_health_needs_it_and_a_session_takes_its_own_key():
    async def test(endpoint):
        session, other = endpoint.session(0), endpoint.session(1)
        url = endpoint.server.url
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/health")).status_code == 200
            for path in ("/v1/models", f"/sessions/{session.id}/v1/models"):
                assert (await http.get(f"{url}{path}")).status_code == 401
            anonymous = await http.post(f"{url}/v1/chat/completions", json={"messages": HI})
            assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == "authentication_error"
            # knowing a session's id is not enough: its routes want its key (or the token)
            for key in ("none", other.key, session.id):
                answer = await http.post(f"{url}/sessions/{session.id}/reward", json={"reward": 1.0},
                                         headers={"Authorization": f"Bearer {key}"})
                assert answer.status_code == 401 and session.reward is None
            answer = await http.post(f"{url}/sessions/{session.id}/reward", json={"reward": 1.0},
                                     headers={"Authorization": "Bearer secret"})
            assert answer.status_code == 200 and session.reward == 1.0
        for client in (endpoint.client(session), endpoint.client(key=session.key), endpoint.client(key="secret")):
            reply = await client.chat.completions.create(model=MODEL_NAME, messages=HI)
            assert reply.choices[0].message.content == "Hello there."
            await client.close()
        assert len(session.calls) == 1  # the plain route with the session's key is the session's call

    served(test, token="secret")


def test_while_training_anonymous_callers_get_401():
    async def agent(client, task):
        async with httpx.AsyncClient() as http:  # a local process that found the port
            stray = await http.post(str(client.base_url).split("/sessions/")[0] + "/v1/chat/completions", json={"messages": HI})
        reply = await client.chat.completions.create(model="gpt-4o", messages=HI)  # any model name within a session
        return float(stray.status_code == 401 and reply.choices[0].message.content == "Hello there.")

    async def main():
        codec = CharCodec()
        backend = AgentBackend(ScriptedEngine(scripted, codec), codec, resolve_tool_format(codec)[0], agent,
                               [{"id": "train/0", "prompt": "hi"}], AgentSettings(timeout_s=5))
        try:
            return (await backend.play(record()))[0]
        finally:
            await backend.close()

    assert asyncio.run(main()).outcome == 1.0


# -- the protocol ---------------------------------------------------------------------------------

def test_a_prompt_over_the_context_is_context_length_exceeded_and_max_tokens_above_the_cap_names_it():
    async def test(endpoint):
        client = endpoint.client()
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x" * 300}])
        assert refused.value.code == "context_length_exceeded" and "maximum context length is 200" in refused.value.message
        with pytest.raises(openai.BadRequestError) as refused:  # fits alone, not with the completion asked for
            await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x" * 100}], max_tokens=120)
        assert refused.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model=MODEL_NAME, messages=HI, max_tokens=500)
        assert "cap of 128" in refused.value.message and refused.value.param == "max_tokens"
        await client.close()

    served(test, max_context_tokens=200, max_tokens_cap=128)


def test_logprobs_are_the_engines_in_openais_shape():
    async def test(endpoint):
        session = endpoint.session()
        client = endpoint.client(session)
        reply = await client.chat.completions.create(model=MODEL_NAME, messages=HI, logprobs=True, top_logprobs=0)
        content = reply.choices[0].logprobs.content
        assert [entry.logprob for entry in content] == session.calls[0].logprobs
        assert "".join(entry.token for entry in content).startswith("Hello there.")
        with pytest.raises(openai.BadRequestError, match="top_logprobs"):
            await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], logprobs=True,
                                                 top_logprobs=3)
        await client.close()

    served(test)


@pytest.mark.parametrize("field, value", [("response_format", {"type": "json_object"}), ("frequency_penalty", 0.5),
                                          ("logit_bias", {"1": 5}), ("functions", []), ("best_of", 2)])
def test_parameters_that_would_be_ignored_are_refused(field, value):
    async def test(endpoint):
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"{endpoint.server.url}/v1/chat/completions", json={"messages": HI, field: value})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == field

    served(test)


def test_an_unknown_model_is_404_outside_a_session_as_vllm_answers():
    async def test(endpoint):
        client = endpoint.client()
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model="gpt-4o", messages=HI)
        assert missing.value.code == "model_not_found"
        await client.close()

    served(test)


def test_streaming_sends_content_as_the_engine_samples_it_with_usage_when_asked():
    async def test(endpoint):
        client = endpoint.client()
        stream = await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "long"}],
                                                      stream=True, stream_options={"include_usage": True})
        pieces, usage, finish = [], None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert "".join(pieces) == LONG and finish == "stop"
        assert len([p for p in pieces if p]) > 10  # piece by piece, not the whole text in one chunk
        assert usage.completion_tokens == len(LONG) + 1
        # tool calls arrive whole, and no piece of their markup leaks into the content
        stream = await client.chat.completions.create(model=MODEL_NAME, messages=HI, tools=[ADD], stream=True)
        content, calls = "", []
        async for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            calls += delta.tool_calls or []
        assert content == "Let me add." and [c.function.name for c in calls] == ["add"]
        await client.close()

    served(test)


def test_a_generation_error_is_a_5xx_never_an_empty_200():
    class Failing(ScriptedEngine):
        async def generate(self, request):
            return GenerationResult(request.request_id, [], [], "error", 0, error="prompt leaves no room")

    async def test(endpoint):
        client = endpoint.client()
        with pytest.raises(openai.InternalServerError, match="prompt leaves no room"):
            await client.chat.completions.create(model=MODEL_NAME, messages=HI)
        await client.close()

    asyncio.run(_with(Served(Failing(scripted, CharCodec())), test))


async def _with(endpoint: Served, test):
    async with endpoint:
        await test(endpoint)


# -- transcripts ----------------------------------------------------------------------------------

def test_a_transcript_records_what_the_agent_sent_back_and_calls_to_tools_not_offered():
    async def test(endpoint):
        session = endpoint.session()
        client = endpoint.client(session)
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        first = await client.chat.completions.create(model="any", messages=messages, tools=[MUL])  # add was not offered
        message = first.choices[0].message
        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": message.tool_calls[0].id, "name": "add", "content": "5"}]
        await client.chat.completions.create(model="any", messages=messages, tools=[MUL])
        await client.close()
        session.give_reward(1.0)
        trajectory = to_trajectory(session, "terminated")
        first_turn = trajectory.turns[0]
        assert not first_turn.format_valid and "unknown_tool" in first_turn.format_reason
        assert first_turn.reply == [{"role": "tool", "name": "add", "content": "5"}]
        assert first_turn.observation == "tool add: 5"
        assert "user: What is 2 + 3?" in trajectory.initial_observation
        assert json.loads(json.dumps(first_turn.reply))  # serialisable as samples.jsonl stores it

    served(test)


# -- a run ----------------------------------------------------------------------------------------

HOSTILE = '''
import itertools

BAD = itertools.cycle([float("nan"), 1e308, -float("inf"), None])
count = itertools.count()


async def run(client, task):
    reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}],
                                                 max_tokens=8)
    n = next(count)
    if n % 3 == 0:  # one episode in three sends a hostile reward
        bad = next(BAD)
        return bad if bad is not None else "a string"
    return float(n % 3 == 1 and bool(reply.choices[0].message.content))
'''


def test_a_run_with_an_agent_sending_nan_1e308_and_inf_rewards_finishes_and_counts_the_refused(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "hostile.py").write_text(HOSTILE)
    run = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "streamrl", "train", "--config", "smoke", "--agent", f"{tmp_path}/hostile.py:run",
                             "--tasks", "examples/pick_tasks.jsonl", "train.steps=3", "env.eval_tasks=2", "train.eval_at_start=false",
                             "--out", str(run)], cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "after 3 RL steps" in result.stdout
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [m["policy_loss"] for m in metrics if "policy_loss" in m]
    assert losses and all(math.isfinite(loss) for loss in losses)
    report = (run / "report" / "index.md").read_text()
    assert "reward_refused" in report and "pick_tasks.jsonl" in report
