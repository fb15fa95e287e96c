"""Multi-turn generation with a growing full-history transcript: KV reuse across turns against
re-prefilling the whole transcript every turn, in one run.

N episodes run concurrently (each its own coroutine, like rollout episodes) for 12 turns. Each
turn generates a fixed number of tokens (no stop tokens, so both sides do the same work), then
appends the engine's own ids, the chat bridge and an observation to the transcript (token-in/
token-out, as ``rollout.episode`` does in the full-history layout). The baseline is the same
engine with its prefix store off (``prefix_cache_tokens=0``): every turn prefills the whole
transcript. Both sides run with one torch thread; the ratio is baseline time / reuse time.

    python benchmarks/multiturn_generation.py [--quick] [--model tiny|smollm2-135m|all]
        [--dtype auto|bfloat16|float32] [--episodes N] [--turns 12] [--tokens N]

Ends with ``RESULT kv_reuse_speedup=<smollm2, else tiny> tiny_kv_reuse_speedup=... ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams, load_policy  # noqa: E402
from streamrl.policy.dtype_choice import choose_dtype, processor_name  # noqa: E402
from streamrl.policy.errors import MissingDependencyError  # noqa: E402

TASK = "You are in room {i}. Your task is to put a clean apple in the fridge."
OBSERVATION = "You arrive at countertop {t}. On it you see an apple {t} and a knife {i}."


async def episodes(engine: HFEngine, policy, count: int, turns: int, tokens: int) -> tuple[float, int]:
    """Seconds for ``count`` concurrent episodes of ``turns`` turns; final transcript length."""

    async def episode(i: int) -> int:
        transcript = policy.encode_chat([{"role": "user", "content": TASK.format(i=i)}])
        for t in range(turns):
            sampling = SamplingParams(max_new_tokens=tokens, seed=1000 * i + t)
            result = await engine.generate(GenerationRequest(f"e{i}t{t}", transcript, sampling))
            if result.finish_reason != "length":
                raise RuntimeError(f"engine returned {result.finish_reason}: {result.error}")
            observation = {"role": "user", "content": OBSERVATION.format(t=t, i=i)}
            transcript = transcript + result.token_ids + policy.encode_bridge([observation])
        return len(transcript)

    start = time.perf_counter()
    lengths = await asyncio.gather(*(episode(i) for i in range(count)))
    return time.perf_counter() - start, max(lengths)


def bench_model(spec: str, dtype: str, count: int, turns: int, tokens: int) -> float:
    policy = load_policy(spec, dtype=dtype)
    print(f"\n== {spec} ({dtype}, 1 thread, {count} episodes x {turns} turns x {tokens} new tokens)")
    seconds = {}
    for name, budget in (("re-prefill", 0), ("kv reuse", 1 << 20)):
        engine = HFEngine.from_policy(policy, max_batch_size=count, prefix_cache_tokens=budget, threads=1)

        async def run(engine=engine):
            await episodes(engine, policy, 2, 2, 2)  # warm-up
            out = await episodes(engine, policy, count, turns, tokens)
            await engine.close()
            return out

        seconds[name], length = asyncio.run(run())
        stats = engine.stats
        print(
            f"{name:>12}: {seconds[name]:6.1f} s, {count * turns * tokens / seconds[name]:7.1f} tok/s; prefilled "
            f"{stats['prefill_tokens']} tokens, reused {stats['reused_tokens']} (transcripts end at {length} tokens)"
        )
    ratio = seconds["re-prefill"] / seconds["kv reuse"]
    print(f"{'':>12}  kv reuse / re-prefill: {ratio:5.2f}x")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer episodes and tokens (under a minute)")
    parser.add_argument("--model", default="all", choices=["tiny", "smollm2-135m", "all"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--episodes", type=int, default=None, help="concurrent episodes (default: tiny 16, smollm2 8; quick 8, 1)")
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per turn (default 16, quick 8)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the engine's worker has its own single thread
    tokens = args.tokens or (8 if args.quick else 16)
    specs = ["tiny", "smollm2-135m"] if args.model == "all" else [args.model]
    dtype, reason = choose_dtype() if args.dtype == "auto" else (args.dtype, "asked for")
    print(f"processor: {processor_name()}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"dtype: {dtype} ({reason})")
    started = time.perf_counter()
    results = {}
    for spec in specs:
        count = args.episodes or {"tiny": 8 if args.quick else 16, "smollm2-135m": 1 if args.quick else 8}[spec]
        try:
            results[spec] = bench_model(spec, dtype, count, args.turns, tokens)
        except MissingDependencyError as exc:
            print(f"\n== {spec}: skipped ({exc})")
    headline = results.get("smollm2-135m", results.get("tiny", float("nan")))
    fields = [f"kv_reuse_speedup={headline:.2f}", f"turns={args.turns}", f"tokens={tokens}", f"dtype={dtype}"]
    fields += [f"{spec.split('-')[0]}_kv_reuse_speedup={ratio:.2f}" for spec, ratio in results.items()]
    fields.append(f"wall_s={time.perf_counter() - started:.0f}")
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
