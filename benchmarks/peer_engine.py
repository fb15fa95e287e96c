"""streamrl's engine against CTranslate2, a CPU inference engine, on the same work in one run.

SmolLM2-135M-Instruct, the same prompt ids (distinct chat prompts), sampling at T=1 over the whole
vocabulary, every request forced to the same number of new tokens, ``--threads`` threads for every
engine. Four engines, alternating within each repetition so that load from other processes falls on
all of them: streamrl's ``HFEngine`` in float32 and with int8 rollouts (``model.rollout_dtype:
int8``), and CTranslate2 over the same weights converted once (cached under
``~/.cache/streamrl/ct2``) in float32 and int8. Throughput is generated tokens per second of wall
time, prefill included; every repetition is printed and the best counts.

CTranslate2 is the ``bench`` extra (``make bench`` installs it; ``make test`` does not need it). It
returns each token's log-prob too but cannot take new weights without a reconversion, so it is a
yardstick for the engine here, not a replacement.

Usage: python benchmarks/peer_engine.py [--quick | --smoke] [--threads N] [--repeats N]

``--quick``: the 64 x 128 workload only, one repetition (about 2 minutes on a quiet 2-core machine, 4 on shared cores:
8,192 tokens per engine at 40-180 tok/s; a smaller workload would not be the one the ratios are
defined on). The full run adds 64 x 24 and batch 1 x 128. Ends with ``RESULT vs_ct2_fp32=<streamrl
float32 / CTranslate2 float32> vs_ct2_int8=<streamrl int8 / CTranslate2 int8> ...`` on 64 x 128.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from generation_throughput import PROMPT, Rate, engine_tokens_per_s, in_thread  # noqa: E402

from streamrl.policy import HFEngine, load_policy  # noqa: E402
from streamrl.policy.dtype_choice import processor_name  # noqa: E402
from streamrl.policy.export import export_policy  # noqa: E402

CACHE = Path.home() / ".cache" / "streamrl" / "ct2"
CT2_TYPES = {"ct2_fp32": "float32", "ct2_int8": "int8"}


def ct2_generators(policy, threads: int, name: str = "smollm2") -> dict:
    """CTranslate2 generators over ``policy``'s weights, converted once per weights and type."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes()[:4096] for t in policy.model.state_dict().values())).hexdigest()[:12]
    generators = {}
    for name, compute in CT2_TYPES.items():
        folder = CACHE / f"{name}-{digest}-{compute}"
        if not (folder / "model.bin").is_file():
            exported = CACHE / f"hf-{digest}"
            if not (exported / "config.json").is_file():
                export_policy(policy, exported)
            TransformersConverter(str(exported)).convert(str(folder), quantization=compute, force=True)
        generators[name] = ctranslate2.Generator(str(folder), device="cpu", compute_type=compute,
                                                 intra_threads=threads, inter_threads=1)
    return generators


def ct2_tokens_per_s(generator, tokens_in: list[list[str]], new_tokens: int) -> float:
    started = time.perf_counter()
    results = generator.generate_batch(tokens_in, max_length=new_tokens, min_length=new_tokens, sampling_topk=0,
                                       sampling_temperature=1.0, include_prompt_in_result=False,
                                       max_batch_size=len(tokens_in))
    produced = sum(len(r.sequences_ids[0]) for r in results)
    if produced != new_tokens * len(tokens_in):
        raise RuntimeError(f"CTranslate2 generated {produced} tokens, not {new_tokens} x {len(tokens_in)}")
    return produced / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 x 128 only, one repetition (see above)")
    parser.add_argument("--smoke", action="store_true", help="a small tiny model, 4 x 8 (the test suite's run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise SystemExit("benchmarks/peer_engine.py needs CTranslate2: pip install -e '.[bench]' (make bench does)")
    torch.set_num_threads(1)  # each engine runs in a thread of its own (generation_throughput.in_thread)
    started = time.perf_counter()
    spec = "tiny:hidden=64,layers=2,heads=4,kv_heads=2,intermediate=128" if args.smoke else "smollm2-135m"
    policy = load_policy(spec, dtype="float32")
    prompts = [policy.encode_chat([{"role": "user", "content": PROMPT.format(i=i)}]) for i in range(64)]
    as_tokens = [policy.tokenizer.convert_ids_to_tokens(p) for p in prompts]
    ours = {"streamrl_fp32": HFEngine.from_policy(policy, max_batch_size=64, threads=args.threads),
            "streamrl_int8": HFEngine.from_policy(policy, max_batch_size=64, threads=args.threads, int8=True)}
    theirs = ct2_generators(policy, args.threads, "tiny" if args.smoke else "smollm2")
    workloads = [(4, 8)] if args.smoke else [(64, 128)] if args.quick else [(64, 128), (64, 24), (1, 128)]
    repeats = args.repeats or (1 if args.quick or args.smoke else 3)
    print(f"processor: {processor_name()}; {spec}, {args.threads} threads per engine; "
          f"prompts of {len(prompts[0])}-{max(map(len, prompts))} tokens")
    best: dict[str, dict[str, float]] = {}

    async def warm_up() -> None:
        for engine in ours.values():
            await engine_tokens_per_s(engine, prompts, 4, 2, Rate())

    asyncio.run(warm_up())
    for n, new_tokens in workloads:
        key = f"{n}x{new_tokens}"
        best[key] = {}
        for repeat in range(repeats):
            for name in (*ours, *theirs):
                if name in ours:
                    rate = Rate()
                    asyncio.run(engine_tokens_per_s(ours[name], prompts, new_tokens, n, rate))
                    value = rate.wall
                else:
                    value = in_thread(1, ct2_tokens_per_s, theirs[name], as_tokens[:n], new_tokens)
                best[key][name] = max(best[key].get(name, 0.0), value)
                print(f"  {key:>6} repetition {repeat + 1} {name:>13}: {value:7.1f} tok/s")
    for engine in ours.values():
        engine.close_sync()
    for key, rates in best.items():
        print(f"{key:>6}: " + ", ".join(f"{name} {value:.1f}" for name, value in rates.items()) + f" (best of {repeats})")
    head = best["4x8" if args.smoke else "64x128"]
    fields = [f"vs_ct2_fp32={head['streamrl_fp32'] / head['ct2_fp32']:.2f}",
              f"vs_ct2_int8={head['streamrl_int8'] / head['ct2_int8']:.2f}",
              f"int8_speedup={head['streamrl_int8'] / head['streamrl_fp32']:.2f}",
              *(f"{name}_{key}={value:.1f}" for key, rates in best.items() for name, value in rates.items()),
              f"threads={args.threads}", f"wall_s={time.perf_counter() - started:.0f}"]
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
