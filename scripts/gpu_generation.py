"""vLLM against HF engine generation on a GPU: SmolLM2-135M-Instruct, N concurrent requests.

Each engine serves N concurrent requests (one coroutine each, as rollout episodes are) with
distinct chat prompts, sampling ``--tokens`` new tokens each (no stop id: full length); the figure
is generated tokens per second of wall time, prefill included, best of two runs after a warm-up.
Used by ``scripts/gpu_check.sh``; needs CUDA and the ``vllm`` extra.

    python scripts/gpu_generation.py [--model smollm2-135m] [--concurrency 64,256] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from streamrl.policy import GenerationRequest, SamplingParams, load_policy
from streamrl.policy.engines import make_engine

PROMPT = "You are in kitchen {i}. Your task is to put a clean apple in the fridge. What do you do first?"


async def tokens_per_s(engine, prompts: list[list[int]], tokens: int) -> float:
    sampling = SamplingParams(max_new_tokens=tokens)
    best = 0.0
    for attempt in range(3):  # the first is a warm-up (CUDA graphs, kernels)
        started = time.monotonic()
        results = await asyncio.gather(*(engine.generate(GenerationRequest(f"{attempt}-{i}", p, sampling))
                                         for i, p in enumerate(prompts)))
        elapsed = time.monotonic() - started
        bad = [r.error for r in results if r.finish_reason not in ("stop", "length")]
        if bad:
            raise RuntimeError(f"{len(bad)} requests failed: {bad[0]}")
        if attempt:
            best = max(best, sum(len(r.token_ids) for r in results) / elapsed)
    return best


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--concurrency", default="64,256")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    levels = [int(n) for n in args.concurrency.split(",")]
    policy = load_policy(args.model, dtype="bfloat16", device="cuda")
    prompts = [policy.encode_chat([{"role": "user", "content": PROMPT.format(i=i)}]) for i in range(max(levels))]
    figures: dict[str, float] = {}
    for kind in ("hf", "vllm"):
        engine = make_engine(kind, policy)
        try:
            for n in levels:
                figures[f"{kind}_{n}"] = await tokens_per_s(engine, prompts[:n], args.tokens)
                print(f"{kind:5s} {n:4d} concurrent: {figures[f'{kind}_{n}']:9.0f} tokens/s", flush=True)
        finally:
            await engine.close()
    ratios = " ".join(f"vllm_vs_hf_{n}={figures[f'vllm_{n}'] / figures[f'hf_{n}']:.2f}" for n in levels)
    values = " ".join(f"{key}_tok_s={value:.0f}" for key, value in figures.items())
    print(f"RESULT {ratios} {values}")


if __name__ == "__main__":
    asyncio.run(main())
