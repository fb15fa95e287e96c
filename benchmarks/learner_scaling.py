"""The learner in 1 and 2 processes (``train.learner_processes``): memory per process and step time.

Each configuration runs in fresh processes, the way a run's learner processes do: the model's
transformer blocks sharded with FSDP2 over gloo (``training/data_parallel.py``), the micro-batches
shared round robin (``Ranks.share``), the gradient clipped over all ranks and AdamW stepped on each
rank's shards (``Ranks.clip_and_step``). The model is trained whole (no LoRA), as a model that
outgrows one device is: that is where the parameters, gradients and AdamW's moments dominate.
The cores are shared, not added: N processes get ``cores / N`` torch threads each.

Measured per process: the parameter-and-optimiser share (bytes of the local parameters, gradients
and AdamW moments, counted tensor by tensor at the update's peak) and the peak resident memory
(sampled every 5 ms); the rest of the peak (activations, the runtime, libraries) is reported apart.
The timed update is the third (the first two fault the heap in).

Usage:
    python benchmarks/learner_scaling.py [--quick] [--model smollm2-135m|tiny]

Ends with ``RESULT mem_ratio=<parameter-and-optimiser share, largest rank at N=2 / N=1>
step_ratio=<update time N=2 / N=1> peak_rss_ratio=... other_mb_n1=... other_mb_n2=...``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from learner_throughput import make_batch  # noqa: E402

from streamrl.policy import load_policy  # noqa: E402
from streamrl.policy.dtype_choice import processor_name  # noqa: E402
from streamrl.policy.modeling import decoder_and_head  # noqa: E402
from streamrl.policy.scoring import forward_for_loss  # noqa: E402
from streamrl.training.data_parallel import free_port, join_group, load_sharded_optimizer, shard_blocks  # noqa: E402
from streamrl.training.optim import adamw  # noqa: E402
from streamrl.training.ranks import Ranks  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE


class PeakSampler:
    """The largest resident size seen while it runs."""

    def __init__(self) -> None:
        self.peak, self.running = resident_bytes(), True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, resident_bytes())
            time.sleep(0.005)

    def stop(self) -> int:
        self.running = False
        self.thread.join()
        return self.peak


def local_bytes(tensor: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def run_rank(rank: int, world: int, port: int, spec: str, shape: tuple[int, int, int, int], threads: int, results) -> None:
    torch.set_num_threads(threads)
    sampler = PeakSampler()
    policy = load_policy(spec, dtype="float32")
    model = policy.model
    ranks = Ranks(rank, world)
    if world > 1:
        join_group(rank, world, port)
        shard_blocks(decoder_and_head(model)[0], world, "cpu")
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(parameters, lr=1e-6)
    if world > 1:
        load_sharded_optimizer(model, optimizer, None)
    rows, shortest, longest, micro = shape
    ids, attention, action = make_batch(model.config.vocab_size, rows, shortest, longest)
    order = attention.sum(-1).argsort().tolist()
    micros = [order[i : i + micro] for i in range(0, rows, micro)]
    total = float(action.sum())
    model.train()
    state_bytes = 0

    def update(step: int) -> None:
        nonlocal state_bytes
        for part, live in ranks.share(micros):
            width = int(attention[part].sum(-1).max())
            out = forward_for_loss(model, ids[part, :width], attention[part, :width], token_mask=action[part, :width],
                                   excluded_ids=tuple(policy.banned_token_ids), with_entropy=True)
            loss = -out.logprobs[action[part, :width]].sum() / total
            (loss * ranks.loss_weight(live)).backward()
        # the parameter-and-optimiser share at its peak: gradients present, moments allocated
        grads = sum(local_bytes(p.grad) for p in parameters if p.grad is not None)
        ranks.clip_and_step(parameters, optimizer, 1.0, step=step, model=model)
        moments = sum(local_bytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
        state_bytes = sum(local_bytes(p) for p in model.parameters()) + grads + moments

    update(1)
    update(2)
    start = time.perf_counter()
    update(3)
    elapsed = time.perf_counter() - start
    peak = sampler.stop()
    results[rank] = {"update_s": elapsed, "state_bytes": state_bytes, "peak_rss": peak}
    if world > 1:
        torch.distributed.destroy_process_group()


def measure(world: int, spec: str, shape: tuple[int, int, int, int], cores: int) -> list[dict[str, float]]:
    manager = mp.get_context("spawn").Manager()
    results = manager.dict()
    mp.start_processes(run_rank, args=(world, free_port(), spec, shape, max(1, cores // world), results),
                       nprocs=world, start_method="spawn")
    return [dict(results[rank]) for rank in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small batch (under a minute on a 2-core machine)")
    parser.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    args = parser.parse_args()
    started = time.perf_counter()
    cores = os.cpu_count() or 2
    # rows, shortest, longest, rows per micro-batch
    shape = (4, 64, 192, 1) if args.quick else (16, 128, 512, 2)
    print(f"processor: {processor_name()}; {cores} cores shared by the learner processes; model {args.model} "
          f"trained whole; {shape[0]} rows of {shape[1]}-{shape[2]} tokens, micro-batches of {shape[3]}")
    runs = {world: measure(world, args.model, shape, cores) for world in (1, 2)}
    mib = 1 << 20
    for world, ranks in runs.items():
        for rank, result in enumerate(ranks):
            other = result["peak_rss"] - result["state_bytes"]
            print(f"N={world} rank {rank}: update {result['update_s']:.2f} s, parameters+gradients+moments "
                  f"{result['state_bytes'] / mib:7.1f} MiB, peak resident {result['peak_rss'] / mib:7.1f} MiB "
                  f"(the rest {other / mib:7.1f} MiB)")
    one, two = runs[1][0], runs[2]
    largest = max(two, key=lambda r: r["state_bytes"])
    fields = {
        "mem_ratio": largest["state_bytes"] / one["state_bytes"],
        "step_ratio": max(r["update_s"] for r in two) / one["update_s"],
        "peak_rss_ratio": max(r["peak_rss"] for r in two) / one["peak_rss"],
        "other_mb_n1": (one["peak_rss"] - one["state_bytes"]) / mib,
        "other_mb_n2": max(r["peak_rss"] - r["state_bytes"] for r in two) / mib,
        "wall_s": time.perf_counter() - started,
    }
    print("RESULT " + " ".join(f"{key}={value:.2f}" for key, value in fields.items()))


if __name__ == "__main__":
    main()
