"""Where a learner process stands among the others (``Ranks``): its share of the micro-batches and
every collective the learner needs. One process (the default) makes each of them the identity, so
the learner and the critic use it without knowing whether they run alone (training/data_parallel.py
starts the others)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from streamrl.training.optim import check_finite_parameters, check_finite_value, clip_and_step

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place among the learner processes; every collective the learner needs.
    The default (one process) makes each of them the identity."""

    rank: int = 0
    world: int = 1

    def share(self, items: list[T]) -> list[tuple[T, bool]]:
        """This rank's items, round robin, each with ``live``. Every rank gets the same number
        (FSDP's collectives pair the ranks' passes one to one): a rank short of items repeats the
        first with ``live=False``, a pass whose loss counts 0."""
        if self.world == 1:
            return [(item, True) for item in items]
        passes = -(-len(items) // self.world)
        picks = (self.rank + k * self.world for k in range(passes))
        return [(items[i], True) if i < len(items) else (items[0], False) for i in picks]

    def loss_weight(self, live: bool) -> float:
        """What a pass's loss is multiplied by before ``backward``: FSDP averages the ranks'
        gradients, and the losses are shares of one global sum."""
        return float(self.world) if live else 0.0

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Key-wise sums over the ranks (a key may be missing on a rank with no live pass)."""
        if self.world == 1:
            return values
        gathered: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(gathered, values)
        total: dict[str, float] = {}
        for part in gathered:
            for key, value in part.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def max(self, value: float) -> float:
        if self.world == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return float(tensor)

    def all_finite(self, share: dict[str, float]) -> list[str]:
        """The names of the non-finite loss terms of this pass, or ``["on another learner
        process"]`` when only another rank's are (every rank then stops at the same pass)."""
        bad = [f"{key}={value}" for key, value in share.items() if not math.isfinite(value)]
        if self.world == 1:
            return bad
        flag = torch.tensor([1.0 if bad else 0.0])
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bad or (["on another learner process"] if float(flag) else [])

    def clip_and_step(self, parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, grad_clip: float,
                      *, step: int, model: Any, what: str = "") -> float:
        """``optim.clip_and_step`` over sharded and replicated parameters: the replicated ones'
        gradients averaged over the ranks first, the norm taken over the whole gradient."""
        from torch.distributed.tensor import DTensor

        if not any(isinstance(p, DTensor) for p in parameters):  # nothing sharded (one plain process)
            return clip_and_step(parameters, optimizer, grad_clip, step=step, model=model, what=what)

        grads = [p.grad for p in parameters if p.grad is not None]
        sharded = torch.zeros((), dtype=torch.float64)
        replicated = torch.zeros((), dtype=torch.float64)
        for grad in grads:
            if isinstance(grad, DTensor):
                sharded += grad.to_local().double().pow(2).sum()
            else:
                torch.distributed.all_reduce(grad)
                grad.div_(self.world)
                replicated += grad.double().pow(2).sum()
        torch.distributed.all_reduce(sharded)
        norm = float((sharded + replicated).sqrt())
        check_finite_value(step, f"{what}gradient norm", norm)
        coefficient = grad_clip / (norm + 1e-6)  # torch's clip_grad_norm_ rule
        if coefficient < 1.0:
            for grad in grads:
                grad.mul_(coefficient)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        check_finite_parameters(step, model, f"{what}parameter")
        return norm
