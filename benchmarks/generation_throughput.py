"""Generation throughput of ``HFEngine`` against plain batch-1 ``model.generate``, in one run.

For each model, the baseline is transformers' ``generate`` on one chat prompt at batch size 1
(sampling, forced to the full length). The engine then serves N concurrent requests (each its own
coroutine, like rollout episodes) with distinct prompts of about the same length; throughput is
generated tokens per second of wall time, prefill included. Ratios are engine / baseline measured
in the same process; each point is the best of ``--repeats`` runs, which filters out most of the
noise other processes cause on a shared machine (rerun when the numbers matter). ``--threads``
applies to both sides; each side runs in its own thread (see ``in_thread``).

Usage:
    python benchmarks/generation_throughput.py [--quick] [--model tiny|smollm2-135m|all]
        [--dtype bfloat16|float32] [--threads N] [--tokens N] [--concurrency 1,4,16,64]

The last line is ``RESULT speedup=<smollm2 at the highest concurrency> tiny_speedup=... ...``
(``speedup`` falls back to the tiny figure when SmolLM2 is not run).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams, load_policy  # noqa: E402
from streamrl.policy.errors import MissingDependencyError  # noqa: E402

PROMPT = "You are in kitchen {i}. Your task is to put a clean apple in the fridge. What do you do first?"


def in_thread(threads: int, work, *args):
    """Run ``work(*args)`` in a short-lived thread with ``threads`` torch threads; return its result.

    With GNU OpenMP every thread that runs parallel torch ops gets its own pool of helper threads,
    and once all pools together hold more threads than there are cores, libgomp stops spinning
    between parallel regions: a decode step then ran ~1.5x slower on the 2-core machine. So the
    main thread stays at one torch thread, and each side runs in a thread whose pool goes away with it.
    """
    box = {}

    def target():
        torch.set_num_threads(threads)
        box["result"] = work(*args)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return box["result"]


def baseline_tokens_per_s(policy, prompt_ids: list[int], tokens: int, repeats: int) -> float:
    """Plain ``generate`` at batch size 1, sampling, forced to ``tokens`` new tokens (best run)."""
    model = policy.model.eval()
    ids = torch.tensor([prompt_ids])
    kwargs = dict(
        do_sample=True,
        top_k=0,
        top_p=1.0,
        pad_token_id=policy.tokenizer.pad_token_id,
        attention_mask=torch.ones_like(ids),
    )
    best = 0.0
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, **kwargs)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **kwargs)
            best = max(best, (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start))
    return best


async def engine_tokens_per_s(engine: HFEngine, prompts: list[list[int]], tokens: int, concurrency: int) -> float:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    requests = [GenerationRequest(f"bench-{concurrency}-{i}", prompts[i], sampling) for i in range(concurrency)]
    start = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    elapsed = time.perf_counter() - start
    bad = [r for r in results if r.finish_reason != "length"]
    if bad:
        raise RuntimeError(f"engine returned {bad[0].finish_reason}: {bad[0].error}")
    return sum(len(r.token_ids) for r in results) / elapsed


def bench_model(
    spec: str, dtype: str, tokens: int, concurrency: list[int], repeats: int, threads: int
) -> dict[int, float]:
    """Ratios engine/baseline per concurrency for one model; prints a table."""
    start = time.perf_counter()
    policy = load_policy(spec, dtype=dtype)
    # distinct prompts (the engine prefills identical ones once, which would flatter it)
    prompts = [policy.encode_chat([{"role": "user", "content": PROMPT.format(i=i)}]) for i in range(max(concurrency))]
    prompt_ids = prompts[0]
    print(
        f"\n== {spec} ({dtype}, {threads} threads, prompt {len(prompt_ids)} tokens, "
        f"{tokens} new tokens; loaded in {time.perf_counter() - start:.1f} s)"
    )
    base = in_thread(threads, baseline_tokens_per_s, policy, prompt_ids, tokens, repeats)
    print(f"{'baseline generate bs1':>24}: {base:8.1f} tok/s")
    engine = HFEngine.from_policy(policy, max_batch_size=max(concurrency), threads=threads)

    async def run() -> dict[int, float]:
        await engine_tokens_per_s(engine, prompts, 4, 2)  # warm-up
        ratios = {}
        for n in concurrency:
            rate = max([await engine_tokens_per_s(engine, prompts, tokens, n) for _ in range(repeats)])
            ratios[n] = rate / base
            print(f"{'engine, ' + str(n) + ' concurrent':>24}: {rate:8.1f} tok/s  = {ratios[n]:5.2f}x baseline")
        await engine.close()
        return ratios

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer points and tokens (under a minute)")
    parser.add_argument("--model", default="all", choices=["tiny", "smollm2-135m", "all"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for both baseline and engine (default 1: on the shared 2-core machine a "
        "2-thread pool waits a scheduler tick per op whenever another process holds a core, which "
        "made batch-1 runs erratic: 0.5 to 23 tok/s for SmolLM2, 4 to 280 for tiny, same command)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per point; the best counts")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per request")
    parser.add_argument("--concurrency", default=None, help="comma-separated request counts")
    args = parser.parse_args()
    threads = args.threads or 1
    torch.set_num_threads(1)  # see in_thread
    # every request's prompt is prefilled too, so too few new tokens would measure mostly prefill
    tokens = args.tokens or (64 if args.quick else 128)
    concurrency = [int(n) for n in (args.concurrency or ("64" if args.quick else "1,4,16,32,64")).split(",")]
    specs = ["tiny", "smollm2-135m"] if args.model == "all" else [args.model]
    repeats = args.repeats or 2

    top = max(concurrency)
    results: dict[str, float] = {}
    for spec in specs:
        try:
            ratios = bench_model(spec, args.dtype, tokens, concurrency, repeats, threads)
        except MissingDependencyError as exc:
            print(f"\n== {spec}: skipped ({exc})")
            continue
        results[spec] = ratios[top]
    headline = results.get("smollm2-135m", results.get("tiny", float("nan")))
    fields = [f"speedup={headline:.2f}", f"concurrency={top}", f"tokens={tokens}", f"dtype={args.dtype}"]
    fields += [f"{spec.split('-')[0]}_speedup={ratio:.2f}" for spec, ratio in results.items()]
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
