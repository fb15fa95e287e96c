"""The learner in N processes (``train.learner_processes``): data-parallel over micro-batches, the
policy's transformer blocks (and PPO's critic's) sharded with FSDP2 (``fully_shard``), gloo on CPU,
NCCL on GPUs.

Why streamrl starts the processes itself (not ``torchrun``): a run has one controller (rollout,
engine, event log, checkpoints) and ``torchrun`` would start N of them. The training process is
rank 0; it spawns ranks 1..N-1, which only learn. Each step rank 0 sends them the batch's
trajectories and every rank runs the same ``Learner.step`` on them: the algorithm's state
(trackers, the prior) is a function of the batches, so it stays identical on every rank without
being sent, and each rank forwards and backpropagates only its share of the
micro-batches (``Ranks.share``). The loss normalisation is the single-process one: every rank
holds the whole batch, so the global token and row counts are computed before the batch is split.

Rank 0 keeps its own unsharded policy, which the engines, evaluations and checkpoints read; after
each step the trained parameters are gathered into it one at a time (LoRA: only the adapters),
so no rank holds a second full copy. The critic has no whole copy anywhere. Checkpoints are
gathered (the optimiser states by parameter name), so ``--resume`` works with any number of learner processes.

Parameters outside the transformer blocks (embeddings, final norm, an untied head) stay
replicated: a tied embedding is called apart from the decoder by the scorer, which one FSDP unit
cannot span. Their gradients are averaged by an all-reduce.
"""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from streamrl.training.errors import TrainingError
from streamrl.training.optim import adamw
from streamrl.training.ranks import Ranks

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy
    from streamrl.training.config import Config
    from streamrl.training.critic import CriticUpdater
    from streamrl.training.learner import Learner

T = TypeVar("T")

#: how long a collective waits for a peer that neither answers nor dies
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


# -- sharding -------------------------------------------------------------------------------------


def shard_blocks(decoder: Any, world: int, device: str) -> None:
    """``fully_shard`` every transformer block of ``decoder`` over ``world`` ranks (in place)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (world,))
    for block in decoder.layers:  # each block is its own FSDP root: keep it sharded after no-grad passes too
        fully_shard(block, mesh=mesh, reshard_after_forward=True)


def sharded_learner(config: Config, canonical: Policy, algorithm: Any, ranks: Ranks, reference: Any = None) -> Learner:
    """A ``Learner`` over a sharded copy of ``canonical``'s model, sharing ``algorithm`` (and
    ``reference``, a frozen model every rank holds whole); PPO's critic is sharded in place."""
    from streamrl.policy.modeling import decoder_and_head
    from streamrl.training.assemble import update_config
    from streamrl.training.learner import Learner

    policy = copy.copy(canonical)  # the same tokenizer, ids and trained-parameter names
    policy.model = copy.deepcopy(canonical.model) if ranks.rank == 0 else canonical.model
    shard_blocks(decoder_and_head(policy.model)[0], ranks.world, config.model.device)
    if algorithm.critic is not None:
        shard_critic(algorithm.critic, ranks, config.model.device)
    return Learner(algorithm, update_config(config), policy, reference, ranks=ranks)


def shard_critic(critic: CriticUpdater, ranks: Ranks, device: str) -> None:
    """Shard PPO's critic like the policy (a collective): its blocks, then a fresh optimiser over
    the sharded parameters that takes over the moments by name. Nothing of it stays whole: no
    engine reads the critic, and checkpoints gather it (``CriticUpdater.state_dict``)."""
    old = critic.optimizer
    state = {}
    if old.state and ranks.rank == 0:
        state = get_optimizer_state_dict(critic.model, old, options=StateDictOptions(full_state_dict=True))
    shard_blocks(critic.model.decoder, ranks.world, device)
    group = old.param_groups[0]
    critic.optimizer = adamw(critic.model.parameters(), lr=group["lr"], betas=group["betas"],
                             weight_decay=group["weight_decay"], eps=group["eps"])
    load_sharded_optimizer(critic.model, critic.optimizer, state if old.state else None)
    critic.ranks = ranks


def gather_trained(sharded: Any, canonical: Any | None) -> None:
    """Copy the trained parameters of the sharded model into ``canonical`` (rank 0; None on the
    other ranks, which take part in each gather), one parameter at a time."""
    from torch.distributed.tensor import DTensor

    target = dict(canonical.named_parameters()) if canonical is not None else {}
    with torch.no_grad():
        for name, parameter in sharded.named_parameters():
            if not parameter.requires_grad:
                continue
            full = parameter.full_tensor() if isinstance(parameter, DTensor) else parameter
            if canonical is not None:
                target[name].copy_(full)


def broadcast_weights(model: Any) -> None:
    """Rank 0's parameters and buffers to every rank (same architecture everywhere)."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            torch.distributed.broadcast(tensor, src=0)


def checkpoint_tensors(learner: Learner) -> dict[str, Any]:
    """What a checkpoint saves beside the policy's weights, gathered from the shards: the optimiser's
    state keyed by parameter name, PPO's critic (a collective; rank 0's copy is complete)."""
    optimizer = get_optimizer_state_dict(learner.model, learner.optimizer,
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"optimizer": optimizer, **(learner.critic.state_dict() if learner.critic else {})}


def load_sharded_optimizer(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any] | None) -> None:
    """Rank 0's full optimiser state (by name; ``{}`` on the other ranks; None: there is none yet)
    into every rank's shards (a collective). The step becomes AdamW's single-tensor one: the fused
    kernel cannot mix sharded and replicated parameters (loading a state runs a step too)."""
    def single_tensor() -> None:
        for group in optimizer.param_groups:
            group.update(fused=False, foreach=False)

    single_tensor()
    if state is not None:
        set_optimizer_state_dict(model, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        single_tensor()  # the loaded groups bring the saved implementation back


# -- processes -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def join_group(rank: int, world: int, port: int, device: str = "cpu") -> None:
    """Join the learner processes' group (``port`` on this machine): gloo, or NCCL for CUDA."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    torch.distributed.init_process_group(backend, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                                         timeout=COLLECTIVE_TIMEOUT)


class LearnerProcessDied(TrainingError):
    """A learner process other than the training process died; its shard is gone."""


class DataParallelLearner:
    """Rank 0's learner: ``step``, ``state_dict`` and ``tensor_state`` like ``Learner``'s, with the
    work spread over ``processes`` processes. ``close()`` stops the others."""

    _closed = False

    def __init__(self, learner: Learner, config: Config, state: Any, reward_range: tuple[float, float],
                 processes: int, threads: int, out_dir: str):
        import torch.multiprocessing as mp

        self.out_dir = out_dir
        device = config.model.device
        port = free_port()
        context = mp.get_context("spawn")
        self.commands = [context.Queue() for _ in range(1, processes)]
        self.heartbeats = [context.Value("d", time.time(), lock=False) for _ in range(1, processes)]
        self.helpers = [
            context.Process(target=_helper_main, name=f"streamrl-learner-{rank}", daemon=True,
                            args=(rank, processes, port, config, state, reward_range, threads, self.commands[rank - 1], out_dir,
                                  self.heartbeats[rank - 1]))
            for rank in range(1, processes)
        ]
        for helper in self.helpers:
            helper.start()
        #: why a helper was killed by the watchdog (it was alive but silent), by rank
        self.silenced: dict[int, str] = {}
        self._watchdog = threading.Thread(target=self._watch_heartbeats, args=(config.train.learner_heartbeat_s,),
                                          name="streamrl-learner-watchdog", daemon=True)
        self._watchdog.start()
        join_group(0, processes, port, device)
        self.canonical = learner.policy
        optimizer = _named_optimizer_state(learner)
        self._send(("start", {"learner": learner.state_dict(), "optimizer": bool(optimizer),
                              "critic": learner.critic.state_dict() if learner.critic else None}))
        with self._watch("start"):
            broadcast_weights(self.canonical.model)
            self.local = sharded_learner(config, self.canonical, learner.algorithm, Ranks(0, processes), learner.reference)
            self.local.steps_done = learner.steps_done
            load_sharded_optimizer(self.local.model, self.local.optimizer, optimizer or None)
        learner.optimizer.state.clear()  # the shards hold it now
        self.algorithm = learner.algorithm

    @property
    def steps_done(self) -> int:
        return self.local.steps_done

    @property
    def last_advantages(self) -> dict[str, list[float]]:
        return self.local.last_advantages

    def step(self, trajectories: list[Any]) -> dict[str, float]:
        self._send(("step", trajectories))
        with self._watch(f"step {self.steps_done + 1}"):
            metrics = self.local.step(trajectories)
            gather_trained(self.local.model, self.canonical.model)
        return {**metrics, "learner_processes": float(len(self.helpers) + 1)}

    def state_dict(self) -> dict[str, Any]:
        return self.local.state_dict()

    def tensor_state(self) -> dict[str, Any]:
        self._send(("checkpoint", None))
        with self._watch("checkpoint"):
            return checkpoint_tensors(self.local)

    def close(self) -> None:
        self._closed = True
        for commands, helper in zip(self.commands, self.helpers):
            if helper.is_alive():
                commands.put(("stop", None))
        for helper in self.helpers:
            helper.join(timeout=30)
            if helper.is_alive():
                helper.kill()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def _send(self, command: tuple[str, Any]) -> None:
        self._raise_if_dead("")
        for commands in self.commands:
            commands.put(command)

    def _watch_heartbeats(self, bound_s: float) -> None:
        """Kill a helper that is alive but silent past ``bound_s`` (SIGSTOP, a hang): its peers'
        collective then fails at once, and the run stops in one line instead of waiting on it."""
        while not self._closed:
            for rank, (helper, beat) in enumerate(zip(self.helpers, self.heartbeats), start=1):
                silent = time.time() - beat.value
                if helper.exitcode is None and silent > bound_s and rank not in self.silenced:
                    self.silenced[rank] = f"silent for {silent:.0f} s, past train.learner_heartbeat_s={bound_s:g}; killed"
                    helper.kill()
            time.sleep(min(1.0, bound_s / 4))

    def _raise_if_dead(self, during: str) -> None:
        for rank, helper in enumerate(self.helpers, start=1):
            if helper.exitcode is not None:
                code = helper.exitcode
                how = self.silenced.get(rank) or (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}")
                raise LearnerProcessDied(
                    f"learner process rank {rank} (pid {helper.pid}) died ({how}){' during ' + during if during else ''}; "
                    f"the run stopped; continue with: streamrl train --out {self.out_dir} --resume"
                )

    @contextlib.contextmanager
    def _watch(self, during: str) -> Iterator[None]:
        """Turn a collective's failure into one line naming the learner process that died."""
        try:
            yield
        except TrainingError:
            raise
        except Exception:
            for helper in self.helpers:
                helper.join(timeout=5)  # a peer's death reaches the collective before its exit status
                if helper.exitcode is not None:
                    break
            self._raise_if_dead(during)
            raise


def _named_optimizer_state(learner: Learner) -> dict[str, Any]:
    """Rank 0's (unsharded) optimiser state keyed by parameter name; empty on the other ranks."""
    if not learner.optimizer.state:
        return {}
    return get_optimizer_state_dict(learner.model, learner.optimizer, options=StateDictOptions(full_state_dict=True))


def _helper_main(rank: int, world: int, port: int, config: Config, state: Any, reward_range: tuple[float, float],
                 threads: int, commands: Any, out_dir: str, heartbeat: Any) -> None:
    """A learner process other than rank 0: build the same learner, then follow rank 0's commands
    until ``stop`` (or until rank 0 is gone), beating ``heartbeat`` every second all along."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 stops us

    def beat() -> None:  # a thread: a long step beats on, a stopped process does not
        while True:
            heartbeat.value = time.time()
            time.sleep(1.0)

    threading.Thread(target=beat, name="streamrl-heartbeat", daemon=True).start()
    torch.set_num_threads(threads)
    from streamrl.training.allocator import keep_freed_memory

    keep_freed_memory()  # as in the training process: each update reuses the last one's memory
    from streamrl.training.algorithms import make_algorithm
    from streamrl.training.assemble import algorithm_setup
    from streamrl.training.run import load_reference, load_run_policy

    parent = os.getppid()
    policy = load_run_policy(config, state)
    reference = load_reference(Path(out_dir), config) if config.algo.kl_coef > 0 or config.train.reference_model else None
    policy.limit_training(top_layers=config.model.train_top_layers)
    join_group(rank, world, port, config.model.device)
    kind, start = _next(commands, parent)
    assert kind == "start", kind
    broadcast_weights(policy.model)
    algorithm = make_algorithm(config.algo, algorithm_setup(config, policy, reward_range))
    algorithm.load_state_dict(start["learner"])
    if algorithm.critic is not None and start["critic"] is not None:
        algorithm.critic.load_state_dict(start["critic"])
    learner = sharded_learner(config, policy, algorithm, Ranks(rank, world), reference)
    learner.steps_done = int(start["learner"].get("steps_done", 0))
    load_sharded_optimizer(learner.model, learner.optimizer, {} if start["optimizer"] else None)
    try:
        while True:
            kind, payload = _next(commands, parent)
            if kind == "stop":
                break
            if kind == "step":
                learner.step(payload)
                gather_trained(learner.model, None)
            elif kind == "checkpoint":
                checkpoint_tensors(learner)
    except TrainingError:  # rank 0 met the same one (a collective told it) and reports it
        pass
    torch.distributed.destroy_process_group()


def _next(commands: Any, parent: int) -> tuple[str, Any]:
    """The next command from rank 0; exits this process when rank 0 is gone."""
    while True:
        try:
            return commands.get(timeout=5)
        except queue.Empty:
            if os.getppid() != parent:
                os._exit(0)
