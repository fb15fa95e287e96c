"""The OpenAI-compatible endpoint, driven by the official ``openai`` client: plain and streamed
completions, tool calls both ways, what a session records (the engine's ids and log-probs, merged
into one transcript when calls continue each other), retries, bad requests and agents that fail."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from streamrl.agents import (
    AgentBackend,
    AgentSettings,
    Endpoint,
    EndpointServer,
    EndpointSettings,
    Session,
    build_app,
    to_trajectory,
)
from streamrl.agents.protocol import MODEL_NAME
from streamrl.policy.scripted import CharCodec, ScriptedEngine
from streamrl.policy.tool_format import resolve_tool_format
from streamrl.rollout.trajectory import DispatchRecord

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def scripted(prompt: str) -> str:
    """Calls add while the conversation has no tool result yet, then answers with it."""
    if "<tool_response>" in prompt:
        return "The sum is " + prompt.rsplit("<tool_response>", 1)[1].split("</tool_response>")[0]
    if "<tools>" in prompt:
        return 'Let me add.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    return "Hello there."


def record(n: int = 0) -> DispatchRecord:
    return DispatchRecord(request_id=f"r{n}", prompt_id=f"train/{n}", seq=n, policy_version=0)


class Served:
    """An endpoint over a scripted engine, served on a free port, with an engine that remembers results."""

    def __init__(self, policy=scripted, **settings):
        codec = CharCodec()
        self.engine = ScriptedEngine(policy, codec)
        self.results = []
        generate = self.engine.generate

        async def remembered(request):
            result = await generate(request)
            self.results.append((request, result))
            return result

        self.engine.generate = remembered
        self.endpoint = Endpoint(self.engine, codec, resolve_tool_format(codec)[0], settings=EndpointSettings(max_new_tokens=256))
        self.server = EndpointServer(build_app(self.endpoint))

    async def __aenter__(self):
        await self.server.start()
        return self

    async def __aexit__(self, *exc):
        await self.server.close()

    def client(self, session: Session | None = None, **kwargs) -> openai.AsyncOpenAI:
        base = f"{self.server.url}/sessions/{session.id}/v1" if session else f"{self.server.url}/v1"
        return openai.AsyncOpenAI(base_url=base, api_key=session.key if session else "none", max_retries=0, **kwargs)

    def session(self, n: int = 0) -> Session:
        return self.endpoint.sessions.open(Session(f"s{n}", record(n), {"id": f"train/{n}"}))


def test_plain_and_streamed_completions_and_models():
    async def main():
        async with Served() as served:
            client = served.client()
            reply = await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content == "Hello there." and reply.choices[0].finish_reason == "stop"
            assert reply.usage.completion_tokens == len("Hello there.") + 1  # and the end-of-turn id
            stream = await client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], stream=True)
            parts = [chunk.choices[0].delta.content or "" async for chunk in stream]
            assert "".join(parts) == "Hello there."
            assert [m.id for m in (await client.models.list()).data] == ["streamrl-policy"]
            await client.close()

    asyncio.run(main())


def test_tool_calls_round_trip_and_the_session_records_the_engines_ids():
    async def main():
        async with Served() as served:
            session = served.session()
            client = served.client(session)
            messages = [{"role": "user", "content": "What is 2 + 3?"}]
            first = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
            message = first.choices[0].message
            assert first.choices[0].finish_reason == "tool_calls" and message.content == "Let me add."
            call = message.tool_calls[0]
            assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
            messages += [message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
            second = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
            assert second.choices[0].message.content == "The sum is 5"
            await client.close()
            # what was recorded is what the engine generated, and the second call continued the first
            assert [c.completion_ids for c in session.calls] == [r.token_ids for _, r in served.results]
            assert [c.logprobs for c in session.calls] == [r.logprobs for _, r in served.results]
            assert [c.prompt_ids for c in session.calls] == [q.prompt_ids for q, _ in served.results]
            assert session.calls[1].continues
            session.give_reward(1.0)
            trajectory = to_trajectory(session, "terminated")
            assert trajectory.layout == "full_history" and trajectory.outcome == 1.0 and trajectory.won
            assert trajectory.turns[1].context_ids == served.results[1][0].prompt_ids[
                len(served.results[0][0].prompt_ids) + len(served.results[0][1].token_ids):]
            assert trajectory.info["prefix_breaks"] == 0
            assert trajectory.turns[0].tool_calls == [{"name": "add", "arguments": {"a": 2, "b": 3}}]

    asyncio.run(main())


def test_rewritten_history_breaks_the_prefix_and_becomes_per_step_samples():
    async def main():
        async with Served() as served:
            session = served.session()
            client = served.client(session)
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])  # history dropped
            await client.close()
            session.give_reward(0.0)
            trajectory = to_trajectory(session, "terminated")
            assert trajectory.layout == "per_step" and trajectory.info["prefix_breaks"] == 1
            assert [t.context_ids for t in trajectory.turns] == [q.prompt_ids for q, _ in served.results]

    asyncio.run(main())


def test_a_retry_is_answered_from_the_record_and_not_trained_twice():
    async def main():
        async with Served() as served:
            session = served.session()
            client = served.client(session)
            messages = [{"role": "user", "content": "hi"}]
            first = await client.chat.completions.create(model="m", messages=messages)
            again = await client.chat.completions.create(model="m", messages=messages)
            await client.close()
            assert again.id == first.id and len(session.calls) == 1 and session.retries == 1
            assert len(served.results) == 1

    asyncio.run(main())


def test_concurrent_sessions_do_not_mix():
    async def main():
        async with Served() as served:
            sessions = [served.session(n) for n in range(6)]

            async def one(session, n):
                client = served.client(session)
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"user {n}"}])
                await client.close()

            await asyncio.gather(*(one(s, n) for n, s in enumerate(sessions)))
            for n, session in enumerate(sessions):
                assert len(session.calls) == 1 and session.calls[0].messages[0]["content"] == f"user {n}"

    asyncio.run(main())


BAD_REQUESTS = {
    "no messages": ({"messages": []}, 400, "messages must be a non-empty list"),
    "bad role": ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    "n > 1": ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n must be 1"),
    "temperature": ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, 400, "temperature"),
    "max_tokens": ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    "bad tools": ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, 400, "tools must be"),
    "bad arguments": ({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, 400, "is not JSON"),
    "tool_choice": ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, 400, "tool_choice"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_get_openai_errors(case):
    body, status, phrase = BAD_REQUESTS[case]

    async def main():
        import httpx

        async with Served() as served:
            async with httpx.AsyncClient() as http:
                answer = await http.post(f"{served.server.url}/v1/chat/completions", json=body)
                assert answer.status_code == status
                assert phrase in answer.json()["error"]["message"] and answer.json()["error"]["type"] == "invalid_request_error"
                # not JSON, too large, an unknown session: errors too, and the server still answers
                assert (await http.post(f"{served.server.url}/v1/chat/completions", content=b"{")).status_code == 400
                huge = {"messages": [{"role": "user", "content": "x" * (2 << 20)}]}
                assert (await http.post(f"{served.server.url}/v1/chat/completions", json=huge)).status_code == 413
                gone = await http.post(f"{served.server.url}/sessions/nope/v1/chat/completions", json=body)
                assert gone.status_code == 401  # no key of an open session: nothing said about which ids exist
                ok = await http.post(f"{served.server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
                assert ok.status_code == 200

    asyncio.run(main())


async def _good(client, task):
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["prompt"]}])
    return float(reply.choices[0].message.content == "Hello there.")


async def _crashes(client, task):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    raise RuntimeError("the agent fell over")


async def _hangs(client, task):
    await asyncio.sleep(60)


async def _silent(client, task):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


async def _nan(client, task):
    return float("nan")


async def _posts_reward(client, task):
    import httpx

    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    session = str(client.base_url).rstrip("/").rsplit("/", 2)[-2]
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {client.api_key}"}) as http:
        await http.post(str(client.base_url).split("/sessions/")[0] + f"/sessions/{session}/reward", json={"reward": 0.25})


@pytest.mark.parametrize("agent, reason, outcome, phrase", [
    (_good, "terminated", 1.0, None),
    (_posts_reward, "terminated", 0.25, None),
    (_crashes, "agent_error", None, "RuntimeError: the agent fell over"),
    (_hangs, "agent_timeout", None, "ran past 0.5 s"),
    (_silent, "no_reward", None, "no reward"),
    (_nan, "reward_refused", None, "must be finite"),
])
def test_an_agent_episode_ends_with_a_reason_never_an_exception(agent, reason, outcome, phrase):
    async def main():
        codec = CharCodec()
        engine = ScriptedEngine(scripted, codec)
        backend = AgentBackend(engine, codec, resolve_tool_format(codec)[0], agent, [{"id": "train/0", "prompt": "hi"}],
                               AgentSettings(timeout_s=0.5))
        try:
            trajectory, worker = await backend.play(record())
        finally:
            await backend.close()
        assert trajectory.end_reason == reason and trajectory.outcome == outcome and worker == "agent"
        assert (phrase is None and trajectory.error is None) or phrase in trajectory.error
        assert len(backend.endpoint.sessions) == 0  # closed, whatever happened

    asyncio.run(main())


def test_an_external_agent_claims_a_dispatched_task_and_reports_its_reward():
    """``streamrl serve --train``: the dispatcher's task waits for an agent elsewhere to claim it."""
    import httpx

    from streamrl.agents.runner import ExternalAgentBackend

    async def main():
        codec = CharCodec()
        backend = ExternalAgentBackend(ScriptedEngine(scripted, codec), codec, resolve_tool_format(codec)[0],
                                       [{"id": "train/0", "prompt": "hi"}, {"id": "train/1", "prompt": "yo"}],
                                       AgentSettings(timeout_s=5))
        await backend.start()
        try:
            async def elsewhere():
                async with httpx.AsyncClient() as http:
                    claimed = (await http.post(f"{backend.server.url}/sessions/next?wait=5")).json()
                    assert claimed["task"] == {"id": "train/1", "prompt": "yo"}
                    client = openai.AsyncOpenAI(base_url=claimed["base_url"], api_key=claimed["api_key"], max_retries=0)
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": claimed["task"]["prompt"]}])
                    await client.close()
                    await http.post(f"{backend.server.url}/sessions/{claimed['session_id']}/reward", json={"reward": 1.0},
                                    headers={"Authorization": f"Bearer {claimed['api_key']}"})
                    # nothing else dispatched: an empty answer, not an error
                    assert (await http.post(f"{backend.server.url}/sessions/next?wait=0")).status_code == 204

            (trajectory, worker), _ = await asyncio.gather(backend.play(record(1)), elsewhere())
            assert trajectory.end_reason == "terminated" and trajectory.outcome == 1.0 and worker == "external"
            assert len(trajectory.turns) == 1
            backend.settings = AgentSettings(timeout_s=0.2)
            unclaimed, _ = await backend.play(record(0))
            assert unclaimed.end_reason == "agent_timeout" and unclaimed.outcome is None
        finally:
            await backend.close()

    asyncio.run(main())


def test_serve_train_learns_from_an_agent_in_another_process(tmp_path):
    """``streamrl serve --train``: the trainer dispatches, this test plays the agent elsewhere."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "-m", "streamrl", "serve", "--config", "smoke", "--train", "--tasks", "examples/pick_tasks.jsonl",
         "--port", "0", "train.steps=2", "train.batch_size=2", "rollout.concurrency=2", "--out", str(tmp_path / "run")],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        for line in process.stdout:
            found = re.search(r"POST (http://\S+)/sessions/next", line)
            if found:
                url = found.group(1)
                break
        assert url, "the endpoint's address was never printed"
        played = 0
        with httpx.Client(timeout=30) as http:
            while process.poll() is None and played < 8:
                try:
                    answer = http.post(f"{url}/sessions/next?wait=2")
                except httpx.TransportError:  # the trainer finished and the endpoint closed
                    break
                if answer.status_code == 204:
                    continue
                claimed = answer.json()
                client = openai.OpenAI(base_url=claimed["base_url"], api_key=claimed["api_key"], max_retries=0)
                try:
                    client.chat.completions.create(model="m", max_tokens=4,
                                                   messages=[{"role": "user", "content": claimed["task"]["prompt"]}])
                    http.post(f"{url}/sessions/{claimed['session_id']}/reward", json={"reward": float(played % 2)},
                              headers={"Authorization": f"Bearer {claimed['api_key']}"})
                except (openai.NotFoundError, openai.APIConnectionError, httpx.TransportError):
                    break  # the trainer finished meanwhile and closed the session
                played += 1
        output = process.communicate(timeout=120)[0]
        assert process.returncode == 0, output
        assert played >= 4
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["trajectories"] == 4
    finally:
        process.kill()
