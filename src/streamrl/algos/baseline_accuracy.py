"""How far the baselines a run used were from the truth (issue 37's diagnostic).

For each trained episode ``i`` of task ``k`` served by snapshot ``v_i`` with baseline ``b_i`` (in
``[0, 1]`` success units), the truth is ``p_k(v_i)``, the task's success probability under that
snapshot. A run does not know it, so it is estimated from the run's own evidence: the mean outcome
of the *other* episodes of task ``k`` served by snapshots within ``window`` versions of ``v_i``
(leave-one-out, so an episode never grades its own baseline). Episodes with no such neighbour are
left out and counted. With known probabilities (a synthetic bandit) pass ``truth`` instead.

``bias`` (mean of ``b - p``) says whether baselines were optimistic or pessimistic, which is what
outcome-dependent arrival order does to a memory; ``mean_abs`` and ``rmse`` add the estimation noise.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple


class BaselineAccuracy(NamedTuple):
    episodes: int  # episodes graded
    bias: float  # mean (baseline - p)
    mean_abs: float  # mean |baseline - p|
    rmse: float
    ungraded: int  # episodes without evidence to grade them by


def baseline_accuracy(
    tasks: Sequence[Hashable],
    versions: Sequence[int],
    baselines: Sequence[float],
    outcomes: Sequence[float],
    *,
    window: int | None = None,
    truth: Callable[[Hashable, int], float] | None = None,
) -> BaselineAccuracy:
    """Grade ``baselines`` against the success probability of their task under their snapshot:
    ``truth(task, version)`` when given, else the leave-one-out mean outcome of the task's episodes
    served within ``window`` versions (None: any version). All sequences are per episode."""
    n = len(tasks)
    if not (len(versions) == len(baselines) == len(outcomes) == n):
        raise ValueError("baseline_accuracy: tasks, versions, baselines and outcomes must have one entry per episode")
    errors: list[float] = []
    if truth is not None:
        errors = [b - truth(k, v) for k, v, b in zip(tasks, versions, baselines)]
    else:
        by_task: dict[Hashable, list[tuple[int, float]]] = defaultdict(list)
        for k, v, r in zip(tasks, versions, outcomes):
            by_task[k].append((v, r))
        sums: dict[Hashable, tuple[list[int], list[float]]] = {}
        for k, pairs in by_task.items():
            pairs.sort()
            prefix = [0.0]
            for _, r in pairs:
                prefix.append(prefix[-1] + r)
            sums[k] = ([v for v, _ in pairs], prefix)
        for k, v, b, r in zip(tasks, versions, baselines, outcomes):
            served, prefix = sums[k]
            lo = 0 if window is None else bisect.bisect_left(served, v - window)
            hi = len(served) if window is None else bisect.bisect_right(served, v + window)
            others = hi - lo - 1  # the episode itself is always inside its own window
            if others > 0:
                errors.append(b - (prefix[hi] - prefix[lo] - r) / others)
    if not errors:
        return BaselineAccuracy(0, math.nan, math.nan, math.nan, n)
    count = len(errors)
    return BaselineAccuracy(
        episodes=count,
        bias=sum(errors) / count,
        mean_abs=sum(abs(e) for e in errors) / count,
        rmse=math.sqrt(sum(e * e for e in errors) / count),
        ungraded=n - count,
    )
