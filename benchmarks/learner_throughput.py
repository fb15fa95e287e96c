"""Learner throughput: the actor update's forward + backward + AdamW step, against the machine's
float32 matmul peak measured in the same run.

Each model gets a batch of rows of random lengths whose second half is action tokens (what a
learner scores), cut into micro-batches of similar length the way ``train.batch.micro_batches``
does (sorted by length). One update = ``forward_for_loss`` (the learner's differentiable forward,
entropy included) and ``backward`` per micro-batch, then one optimiser step, as ``Learner`` does.
The timed update is the third: a training run repeats the same update, and the first two grow the
heap to its peak (the second still page-faults some of it in), so the third is the steady state.
Throughput is real (unpadded) tokens per second; achieved GFLOP/s counts the model's matrix
multiplies on those tokens (6 x the layers' weights per token, the LM head at scored tokens only,
causal attention scores), so the fraction of peak is what the update gets out of the processor.
The peak is the best of a few ``F.linear`` calls at the model's MLP shape and at 1024^3, in the
same process. On a shared machine a long update is slowed by other jobs far more than the short
peak probe, so the rate is also given per CPU-second of this process (``cpu_peak_fraction``, the
processor's efficiency on our work; with one thread it equals the wall figure on a quiet machine).
Like ``streamrl train``, the process keeps freed memory (``train.allocator.keep_freed_memory``);
without it, on a virtual machine, most of an update's time can go to page faults.

``--top-layers 30,15,6`` (with ``--lora R``: the RL config's adapters on q/k/v/o) times the same
update with only the top N blocks trained (``model.train_top_layers``), the way ``Learner`` limits
them (value rows frozen), and prints each setting's update time against the first one's (the
FLOP count assumes a full backward pass, so fractions of peak overstate a partly frozen model's).

Usage:
    python benchmarks/learner_throughput.py [--quick] [--model tiny|smollm2-135m|all] [--threads N]
        [--lora R] [--top-layers N,N,...] [--rows R --tokens MIN-MAX --micro M]

The last line is ``RESULT peak_fraction=<smollm2 (tiny when not run), wall clock>
cpu_peak_fraction=<the same per CPU-second> peak_gflops=... smollm2_tokens_per_s=... tiny_...``;
with ``--top-layers`` it also gives ``top<N>_ratio=<update s with N blocks / with the first N>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from streamrl.policy import load_policy  # noqa: E402
from streamrl.policy.dtype_choice import processor_name  # noqa: E402
from streamrl.policy.errors import MissingDependencyError  # noqa: E402
from streamrl.policy.scoring import forward_for_loss  # noqa: E402
from streamrl.training.allocator import keep_freed_memory  # noqa: E402
from streamrl.training.config import LoraConfig  # noqa: E402
from streamrl.training.optim import adamw  # noqa: E402


def matmul_gflops(m: int, k: int, n: int, repeats: int = 5) -> float:
    """Best float32 ``F.linear`` rate at ``[m, k] x [k, n]`` (GFLOP/s)."""
    x, w = torch.randn(m, k), torch.randn(n, k)
    F.linear(x, w)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        F.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def make_batch(vocab: int, rows: int, shortest: int, longest: int, seed: int = 0):
    """Right-padded ids, attention mask and action mask (each row's second half) ``[rows, longest]``."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (rows,), generator=generator)
    ids = torch.randint(16, vocab, (rows, longest), generator=generator)
    columns = torch.arange(longest)[None, :]
    attention = (columns < lengths[:, None]).long()
    action = (columns >= (lengths // 2)[:, None]) & attention.bool()
    return ids, attention, action


def update_flops(config, attention: torch.Tensor, action: torch.Tensor, layer_params: int) -> float:
    """Forward + backward (3x forward) matmul FLOPs of one update on the real tokens."""
    tokens = float(attention.sum())
    lengths = attention.sum(-1).double()
    hidden, layers = config.hidden_size, config.num_hidden_layers
    scores = float((lengths * (lengths + 1) / 2).sum()) * 2 * 2 * hidden * layers  # q.k and p.v, causal
    head = float(action.sum()) * 2 * hidden * config.vocab_size
    return 3 * (2 * layer_params * tokens + scores + head)


def bench_model(
    spec: str, rows: int, shortest: int, longest: int, micro: int, peak: float,
    lora_r: int | None = None, top_layers: int | None = None,
) -> dict[str, float]:
    # the config's adapter (its target modules, alpha = 2r as the RL config has it)
    lora = None if lora_r is None else LoraConfig(r=lora_r, alpha=2 * lora_r).model_dump()
    policy = load_policy(spec, dtype="float32", lora=lora)  # the peak is float32's; auto picks it here anyway
    if top_layers is not None:
        policy.limit_training(top_layers=top_layers, value_rows=False)  # as Learner does for all but SAPO
    model, config = policy.model, policy.model.config
    layer_params = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name and p.dim() == 2)
    ids, attention, action = make_batch(config.vocab_size, rows, shortest, longest)
    order = attention.sum(-1).argsort().tolist()  # similar lengths together, as micro_batches does
    micros = [order[i : i + micro] for i in range(0, rows, micro)]
    optimizer = adamw(policy.trainable_parameters(), lr=1e-6)  # the learner's
    model.train()

    def update(parts: list[list[int]]) -> None:
        for part in parts:
            width = int(attention[part].sum(-1).max())
            out = forward_for_loss(
                model, ids[part, :width], attention[part, :width], token_mask=action[part, :width],
                excluded_ids=tuple(policy.banned_token_ids), with_entropy=True,
            )
            mask = action[part, :width]
            loss = -(out.logprobs[mask].sum() + 0.01 * out.entropy[mask].sum()) / float(action.sum())
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # warm-up: first-call dispatch, and the heap growing to the update's peak (two full updates; the
    # timed one is then the steady state of a training run, which repeats the same update)
    update(micros)
    update(micros)
    start, cpu_start = time.perf_counter(), time.process_time()
    update(micros)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    model.eval()
    tokens = float(attention.sum())
    flops = update_flops(config, attention, action, layer_params)
    gflops, cpu_gflops = flops / elapsed / 1e9, flops / cpu / 1e9
    padded = sum(len(part) * int(attention[part].sum(-1).max()) for part in micros)
    trained = "full" if lora_r is None else f"LoRA r={lora_r}"
    trained += ", all blocks" if top_layers is None else f", top {top_layers} blocks"
    print(
        f"\n== {spec} ({trained}): {rows} rows of {shortest}-{longest} tokens ({tokens:.0f} real, padding "
        f"{1 - tokens / padded:.1%}), micro-batches of {micro}\n"
        f"   update {elapsed:.2f} s: {tokens / elapsed:8.1f} tok/s, {gflops:6.1f} GFLOP/s = {gflops / peak:.0%} of peak\n"
        f"   per CPU-second ({cpu:.2f} s): {cpu_gflops:6.1f} GFLOP/s = {cpu_gflops / peak:.0%} of peak"
    )
    return {"update_s": elapsed, "tokens_per_s": tokens / elapsed, "gflops": gflops, "peak_fraction": gflops / peak,
            "cpu_peak_fraction": cpu_gflops / peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller batches (under a minute on a 2-core machine)")
    parser.add_argument("--model", default="all", choices=["tiny", "smollm2-135m", "all"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the peak is measured with the same)")
    parser.add_argument("--lora", type=int, default=None, metavar="R", help="LoRA rank on q/k/v/o (default: train the whole model)")
    parser.add_argument("--top-layers", default=None, help="comma-separated block counts to train, e.g. 30,15,6")
    parser.add_argument("--rows", type=int, help="rows per update (overrides the preset shape)")
    parser.add_argument("--tokens", help="row lengths MIN-MAX (overrides the preset shape)")
    parser.add_argument("--micro", type=int, help="rows per micro-batch (overrides the preset shape)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kept = keep_freed_memory()  # as training does: freed tensors stay in the process
    started = time.perf_counter()
    # (rows, shortest, longest, micro-batch rows) per model
    shapes = {
        "tiny": (16, 64, 256, 8) if args.quick else (64, 128, 512, 8),
        "smollm2-135m": (4, 64, 192, 4) if args.quick else (32, 128, 512, 4),
    }
    for spec, (rows, shortest, longest, micro) in shapes.items():
        if args.tokens:
            shortest, longest = (int(part) for part in args.tokens.split("-"))
        shapes[spec] = (args.rows or rows, shortest, longest, args.micro or micro)
    specs = list(shapes) if args.model == "all" else [args.model]
    sweep = [None] if args.top_layers is None else [int(n) for n in args.top_layers.split(",")]
    peak = max(matmul_gflops(1024, 1024, 1024), matmul_gflops(1024, 576, 1536))
    print(f"processor: {processor_name()}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"float32 matmul peak ({args.threads} threads): {peak:.1f} GFLOP/s; freed memory kept: {kept}")
    results: dict[str, dict[str, float]] = {}
    ratios: dict[str, float] = {}
    for spec in specs:
        try:
            runs = [bench_model(spec, *shapes[spec], peak, args.lora, top) for top in sweep]
        except MissingDependencyError as exc:
            print(f"\n== {spec}: skipped ({exc})")
            continue
        results[spec] = runs[0]
        if args.top_layers is not None:
            print(f"\n{spec}: update time against the top {sweep[0]} blocks trained")
            for top, run in zip(sweep, runs):
                ratio = run["update_s"] / runs[0]["update_s"]
                ratios[f"{spec.split('-')[0]}_top{top}_ratio"] = ratio
                print(f"   top {top:3d}: {run['update_s']:7.2f} s  x{ratio:.2f}")
    headline = results.get("smollm2-135m", results.get("tiny", {}))
    fields = [f"{key}={headline.get(key, float('nan')):.2f}" for key in ("peak_fraction", "cpu_peak_fraction")]
    fields.append(f"peak_gflops={peak:.1f}")
    fields += [f"{spec.split('-')[0]}_{key}={value:.2f}" for spec, values in results.items() for key, value in values.items()]
    fields += [f"{key}={value:.2f}" for key, value in ratios.items()]
    fields.append(f"wall_s={time.perf_counter() - started:.0f}")
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
