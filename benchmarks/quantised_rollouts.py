"""Quantised rollouts (``model.rollout_dtype: int8``) against the float32 engine, in one run.

The same engine (``HFEngine``) serves the same requests (distinct chat prompts, sampling at T=1,
forced to ``--tokens`` new tokens) over SmolLM2-135M-Instruct's float32 weights and over int8 copies
of them, alternating, ``--repeats`` times; throughput is generated tokens per second of wall time,
prefill included, every repetition printed. Then the mismatch the learner's importance weights
correct: the int8 engine's sampled tokens are scored by the float32 model, and per token
``w = p_float / p_int8`` gives the behaviour KL (mean ``log p_int8 - log p_float``), the mean and
largest weight and the share of tokens truncated at 2 (SPO++'s TIS cap). Last, the cost of one
quantisation of a new version (what ``update_weights`` adds), against nothing: a learner step of
SmolLM2 takes minutes on this machine (docs/results/smollm2.md).

Usage: python benchmarks/quantised_rollouts.py [--quick] [--model smollm2-135m|tiny] [--threads N]

``--quick``: 64 requests x 24 tokens, one repetition each (about a minute on a quiet 2-core machine);
the full run adds 64 x 128 and batch 1. Ends with ``RESULT int8_speedup=<int8 / float32 tok/s on
the largest workload> behaviour_kl=... tis_mean=... tis_max=... truncated=... quantise_s=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from generation_throughput import PROMPT, Rate, engine_tokens_per_s, in_thread  # noqa: E402

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams, load_policy  # noqa: E402
from streamrl.policy.dtype_choice import processor_name  # noqa: E402
from streamrl.policy.scoring import score  # noqa: E402

TIS_CAP = 2.0


def throughput(policy, prompts, workloads, repeats: int, threads: int) -> dict[str, dict[str, Rate]]:
    """tok/s of the float32 and the int8 engine on each (requests, tokens) workload, alternating."""
    engines = {"float32": HFEngine.from_policy(policy, max_batch_size=64, threads=threads),
               "int8": HFEngine.from_policy(policy, max_batch_size=64, threads=threads, int8=True)}
    rates = {f"{n}x{t}": {name: Rate() for name in engines} for n, t in workloads}

    async def run() -> None:
        for engine in engines.values():
            await engine_tokens_per_s(engine, prompts, 4, 2, Rate())  # warm-up
        for n, tokens in workloads:
            key = f"{n}x{tokens}"
            for repeat in range(repeats):
                for name, engine in engines.items():
                    once = Rate()
                    await engine_tokens_per_s(engine, prompts, tokens, n, once)
                    rates[key][name].wall = max(rates[key][name].wall, once.wall)
                    print(f"  {key:>7} repetition {repeat + 1} {name:>7}: {once.wall:8.1f} tok/s")
        for engine in engines.values():
            await engine.close()

    asyncio.run(run())
    return rates


def mismatch(policy, prompts, tokens: int, threads: int) -> dict[str, float]:
    """Behaviour KL and TIS weights of the int8 engine's samples under the float32 policy."""
    engine = HFEngine.from_policy(policy, max_batch_size=64, threads=threads, int8=True)
    requests = [GenerationRequest(f"m{i}", p, SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=i))
                for i, p in enumerate(prompts)]

    async def generate():
        results = await asyncio.gather(*(engine.generate(r) for r in requests))
        await engine.close()
        return results

    results = asyncio.run(generate())
    gaps = []
    for request, result in zip(requests, results):
        ids = torch.tensor([request.prompt_ids + result.token_ids])
        with torch.no_grad():
            out = score(policy.model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                        excluded_ids=tuple(policy.banned_token_ids), with_entropy=False)
        exact = out.logprobs[0, len(request.prompt_ids):].double()
        gaps.append(torch.tensor(result.logprobs, dtype=torch.float64) - exact)  # log p_int8 - log p_float
    gap = torch.cat(gaps)
    weights = torch.exp(-gap)
    return {"behaviour_kl": float(gap.mean()), "tis_mean": float(weights.mean()), "tis_max": float(weights.max()),
            "truncated": float((weights > TIS_CAP).double().mean()), "tokens": float(gap.numel())}


def quantise_seconds(policy, threads: int) -> float:
    """One ``update_weights`` of the int8 engine minus one of the float32 engine (the quantisation)."""
    state = policy.state_dict_for_engine()
    costs = {}
    for int8 in (False, True):
        engine = HFEngine.from_policy(policy, max_batch_size=4, threads=threads, int8=int8)
        started = time.perf_counter()
        engine.update_weights(state, version=1)
        asyncio.run(engine.generate(GenerationRequest("w", [1, 2, 3], SamplingParams(max_new_tokens=1))))  # applied
        costs[int8] = time.perf_counter() - started
        engine.close_sync()
    return max(0.0, costs[True] - costs[False])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 x 24 only, one repetition")
    parser.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each engine (1: see generation_throughput)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    policy = load_policy(args.model, dtype="float32")
    prompts = [policy.encode_chat([{"role": "user", "content": PROMPT.format(i=i)}]) for i in range(64)]
    workloads = [(64, 24)] if args.quick else [(64, 24), (64, 128), (1, 128)]
    repeats = args.repeats or (1 if args.quick else 3)
    print(f"processor: {processor_name()}; {args.model}, float32 weights; {args.threads} thread(s) per engine")
    rates = in_thread(args.threads, throughput, policy, prompts, workloads, repeats, args.threads)
    for key, pair in rates.items():
        print(f"{key:>7}: float32 {pair['float32'].wall:8.1f} tok/s, int8 {pair['int8'].wall:8.1f} tok/s "
              f"= {pair['int8'].wall / pair['float32'].wall:4.2f}x (best of {repeats})")
    drift = in_thread(args.threads, mismatch, policy, prompts[:16], 32, args.threads)
    print(f"mismatch over {drift['tokens']:.0f} sampled tokens: behaviour KL {drift['behaviour_kl']:.4f}, "
          f"TIS weight mean {drift['tis_mean']:.3f}, max {drift['tis_max']:.2f}, {100 * drift['truncated']:.2f}% above {TIS_CAP:g}")
    quantise = in_thread(args.threads, quantise_seconds, policy, args.threads)
    print(f"quantising a new version: {quantise:.2f} s")
    largest = list(rates)[1] if len(rates) > 1 else list(rates)[0]
    speedup = rates[largest]["int8"].wall / rates[largest]["float32"].wall
    fields = [f"int8_speedup={speedup:.2f}", f"workload={largest}",
              *(f"{k}={v:.4f}" for k, v in drift.items() if k != "tokens"), f"quantise_s={quantise:.2f}",
              f"wall_s={time.perf_counter() - started:.0f}"]
    if not math.isfinite(speedup):
        raise SystemExit("no throughput measured")
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
