"""What the OpenAI-compatible endpoint costs per call, against calling the engine directly.

The same requests (a two-message chat with one tool, greedy, a fixed number of new tokens, the tiny
model on the CPU engine) are made ``calls`` times, one at a time and then ``concurrency`` at a time,
(a) straight to ``engine.generate`` with prompt ids rendered by the codec, and (b) through the
endpoint with the official ``openai`` client inside a session (rendering, HTTP, JSON, parsing the
reply's calls, recording the session). Alternating repetitions; the medians are reported.

    python benchmarks/agent_endpoint.py [--quick] [--calls N] [--concurrency C]

RESULT line: ``overhead_ms`` (endpoint minus direct, per call, sequential), ``ratio_seq`` and
``ratio_conc`` (endpoint time / direct time).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import openai

from streamrl.agents import Endpoint, EndpointServer, Session, build_app
from streamrl.policy.dtype_choice import processor_name
from streamrl.policy.hf_engine import HFEngine
from streamrl.policy.loading import load_policy
from streamrl.policy.protocols import GenerationRequest, SamplingParams
from streamrl.policy.tool_format import resolve_tool_format
from streamrl.rollout.trajectory import DispatchRecord

TOOL = {"type": "function", "function": {"name": "take", "description": "Take an object.", "parameters": {
    "type": "object", "properties": {"object": {"type": "string", "description": "the object"}}, "required": ["object"]}}}
MESSAGES = [{"role": "system", "content": "You are an agent in a room."},
            {"role": "user", "content": "Take the mug. You see: pen, mug, egg. Call take with the object."}]


async def measure(calls: int, concurrency: int, new_tokens: int, repetitions: int) -> dict[str, float]:
    policy = load_policy(spec="tiny", dtype="float32")
    engine = HFEngine.from_policy(policy, seed=0)
    endpoint = Endpoint(engine, policy, resolve_tool_format(policy)[0])
    server = await EndpointServer(build_app(endpoint)).start()
    prompt = policy.encode_chat(MESSAGES, tools=[TOOL])

    async def direct(n: int) -> None:  # what the endpoint asks of the engine for the same call
        sampling = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, stop_token_ids=(policy.end_of_turn_id,),
                                  stop_strings=(f"@@never{n}@@",))
        await engine.generate(GenerationRequest(f"d{n}", list(prompt), sampling))

    session = endpoint.sessions.open(Session("bench", DispatchRecord("r", "t", 0, 0), {"id": "t"}, temperature=0.0))
    client = openai.AsyncOpenAI(base_url=f"{server.url}/sessions/bench/v1", api_key=session.key, max_retries=0)

    async def through(n: int) -> None:
        # a distinct stop string per call keeps retry detection out of the way; it never matches
        await client.chat.completions.create(model="m", messages=MESSAGES, tools=[TOOL], max_tokens=new_tokens,
                                             stop=[f"@@never{n}@@"])

    async def timed(one, parallel: int) -> float:
        started = time.perf_counter()
        for first in range(0, calls, parallel):
            await asyncio.gather(*(one(n) for n in range(first, min(calls, first + parallel))))
        return time.perf_counter() - started

    results: dict[str, list[float]] = {"direct_seq": [], "endpoint_seq": [], "direct_conc": [], "endpoint_conc": []}
    await timed(direct, 1)  # warm-up
    await timed(through, 1)
    for _ in range(repetitions):
        results["direct_seq"].append(await timed(direct, 1))
        results["endpoint_seq"].append(await timed(through, 1))
        results["direct_conc"].append(await timed(direct, concurrency))
        results["endpoint_conc"].append(await timed(through, concurrency))
    tokens = [len(c.completion_ids) for c in session.calls]
    await client.close()
    await server.close()
    await engine.close()
    medians = {k: statistics.median(v) for k, v in results.items()}
    medians["mean_new_tokens"] = sum(tokens) / max(len(tokens), 1)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 calls x 3 repetitions (under a minute)")
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    calls, repetitions = (16, 3) if args.quick else (args.calls, 5)
    m = asyncio.run(measure(calls, args.concurrency, args.new_tokens, repetitions))
    overhead_ms = 1000 * (m["endpoint_seq"] - m["direct_seq"]) / calls
    print(f"processor: {processor_name()}; {calls} calls, {args.new_tokens} new tokens max "
          f"(endpoint calls averaged {m['mean_new_tokens']:.1f}), medians of {repetitions}")
    for key in ("direct_seq", "endpoint_seq", "direct_conc", "endpoint_conc"):
        print(f"  {key:14s} {m[key]:.3f} s  ({1000 * m[key] / calls:.1f} ms/call)")
    print(f"RESULT overhead_ms={overhead_ms:.2f} ratio_seq={m['endpoint_seq'] / m['direct_seq']:.3f} "
          f"ratio_conc={m['endpoint_conc'] / m['direct_conc']:.3f}")


if __name__ == "__main__":
    main()
