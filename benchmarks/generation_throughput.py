"""Generation throughput of ``HFEngine`` against plain transformers ``generate``, in one run.

For each model there are two baselines, both transformers' ``generate`` (sampling, forced to the
full length): one chat prompt at batch size 1, and all N prompts of the highest concurrency as one
static left-padded batch (the simplest batched alternative to the engine). The engine then serves N
concurrent requests (each its own coroutine, like rollout episodes) with distinct prompts of about
the same length; throughput is generated tokens per second of wall time, prefill included. Ratios
are engine / baseline measured in the same process; each point is the best of ``--repeats`` runs,
which filters out some of the noise other processes cause on a shared machine (rerun when the
numbers matter). Every rate is also given per CPU-second of this process (``cpu_`` ratios): each
side computes in one thread while the others wait, so these ratios move much less with the load
other jobs put on a shared machine (they still share caches and memory bandwidth; on a quiet
machine they equal the wall-clock ratios). ``--threads`` applies to every side; each side runs in
its own thread (see ``in_thread``). ``--dtype auto`` (the default) picks by the processor and prints what and why.

Usage:
    python benchmarks/generation_throughput.py [--quick] [--model tiny|smollm2-135m|all]
        [--dtype auto|bfloat16|float32] [--threads N] [--tokens N] [--concurrency 1,4,16,64]

The last line is ``RESULT speedup=<smollm2 engine / batch-1 generate at the highest concurrency>
hf_batched_speedup=<smollm2 engine / static batched generate> cpu_speedup=... cpu_hf_batched_speedup=...
tiny_speedup=... ...`` (the headline falls back to the tiny figures when SmolLM2 is not run).
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
from streamrl.policy.dtype_choice import choose_dtype, processor_name  # noqa: E402
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


class Rate:
    """Best generated tokens per second of wall time and per CPU-second over timed runs."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self._start = (0.0, 0.0)

    def start(self) -> None:
        self._start = (time.perf_counter(), time.process_time())

    def stop(self, tokens: int) -> None:
        wall, cpu = time.perf_counter() - self._start[0], time.process_time() - self._start[1]
        self.wall, self.cpu = max(self.wall, tokens / wall), max(self.cpu, tokens / max(cpu, 1e-9))

    def __str__(self) -> str:
        return f"{self.wall:8.1f} tok/s ({self.cpu:8.1f} per CPU-s)"


def generate_tokens_per_s(policy, prompts: list[list[int]], tokens: int, repeats: int) -> Rate:
    """Plain ``generate`` over ``prompts`` as one static left-padded batch (batch size 1 for one
    prompt), sampling, forced to ``tokens`` new tokens."""
    model = policy.model.eval()
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), policy.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    kwargs = dict(do_sample=True, top_k=0, top_p=1.0, pad_token_id=policy.tokenizer.pad_token_id, attention_mask=mask)
    rate = Rate()
    with torch.no_grad():
        model.generate(ids[:1], max_new_tokens=2, **{**kwargs, "attention_mask": mask[:1]})  # warm-up
        for _ in range(repeats):
            rate.start()
            out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **kwargs)
            rate.stop((out.shape[1] - width) * len(prompts))
    return rate


async def engine_tokens_per_s(engine: HFEngine, prompts: list[list[int]], tokens: int, concurrency: int, rate: Rate) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    requests = [GenerationRequest(f"bench-{concurrency}-{i}", prompts[i], sampling) for i in range(concurrency)]
    rate.start()
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    rate.stop(sum(len(r.token_ids) for r in results))
    bad = [r for r in results if r.finish_reason != "length"]
    if bad:
        raise RuntimeError(f"engine returned {bad[0].finish_reason}: {bad[0].error}")


def bench_model(
    spec: str, dtype: str, tokens: int, concurrency: list[int], repeats: int, threads: int
) -> dict[str, float]:
    """Engine / baseline ratios at the highest concurrency for one model; prints a table."""
    start = time.perf_counter()
    policy = load_policy(spec, dtype=dtype)
    top = max(concurrency)
    # distinct prompts (the engine prefills identical ones once, which would flatter it)
    prompts = [policy.encode_chat([{"role": "user", "content": PROMPT.format(i=i)}]) for i in range(top)]
    print(
        f"\n== {spec} ({dtype}, {threads} threads, prompt {len(prompts[0])} tokens, "
        f"{tokens} new tokens; loaded in {time.perf_counter() - start:.1f} s)"
    )
    single = in_thread(threads, generate_tokens_per_s, policy, prompts[:1], tokens, repeats)
    print(f"{'generate bs1':>24}: {single}")
    batched = in_thread(threads, generate_tokens_per_s, policy, prompts, tokens, repeats)
    print(f"{f'generate static bs{top}':>24}: {batched}")
    engine = HFEngine.from_policy(policy, max_batch_size=top, threads=threads)

    async def run() -> dict[str, float]:
        await engine_tokens_per_s(engine, prompts, 4, 2, Rate())  # warm-up
        for n in concurrency:
            rate = Rate()
            for _ in range(repeats):
                await engine_tokens_per_s(engine, prompts, tokens, n, rate)
            print(f"{'engine, ' + str(n) + ' concurrent':>24}: {rate}  = {rate.wall / single.wall:5.2f}x bs1 "
                  f"({rate.cpu / single.cpu:5.2f}x per CPU-s)")
        await engine.close()
        print(f"{'':>24}  engine / static batched generate at {top}: {rate.wall / batched.wall:5.2f}x "
              f"({rate.cpu / batched.cpu:5.2f}x per CPU-s)")
        return {"speedup": rate.wall / single.wall, "hf_batched_speedup": rate.wall / batched.wall,
                "cpu_speedup": rate.cpu / single.cpu, "cpu_hf_batched_speedup": rate.cpu / batched.cpu}

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true",
        help="64 concurrent only, 24 new tokens, one run per point (under a minute on a quiet 2-core machine; "
        "the shared prefill weighs more, so ratios come out lower than in the full run)",
    )
    parser.add_argument("--model", default="all", choices=["tiny", "smollm2-135m", "all"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
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
    tokens = args.tokens or (24 if args.quick else 128)
    concurrency = [int(n) for n in (args.concurrency or ("64" if args.quick else "1,4,16,32,64")).split(",")]
    specs = ["tiny", "smollm2-135m"] if args.model == "all" else [args.model]
    repeats = args.repeats or (1 if args.quick else 2)

    dtype, reason = choose_dtype() if args.dtype == "auto" else (args.dtype, "asked for")
    print(f"processor: {processor_name()}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"dtype: {dtype} ({reason})")
    started = time.perf_counter()
    results: dict[str, dict[str, float]] = {}
    for spec in specs:
        try:
            results[spec] = bench_model(spec, dtype, tokens, concurrency, repeats, threads)
        except MissingDependencyError as exc:
            print(f"\n== {spec}: skipped ({exc})")
    headline = results.get("smollm2-135m", results.get("tiny", {}))
    keys = ("speedup", "hf_batched_speedup", "cpu_speedup", "cpu_hf_batched_speedup")
    fields = [f"{key}={headline.get(key, float('nan')):.2f}" for key in keys]
    fields += [f"concurrency={max(concurrency)}", f"tokens={tokens}", f"dtype={dtype}"]
    fields += [f"{spec.split('-')[0]}_{key}={value:.2f}" for spec, ratios in results.items() for key, value in ratios.items()]
    fields.append(f"wall_s={time.perf_counter() - started:.0f}")
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
