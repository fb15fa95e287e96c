"""Issue 37's baseline-accuracy diagnostic on a synthetic bandit whose success probabilities are
known: the run-evidence estimate agrees with the truth, both memories are unbiased when arrival order
does not depend on the outcome, and what each does when failures arrive later (measured: the
event-time memory turns optimistic, the receipt-order one does not; see the last test)."""

from __future__ import annotations

import math
import random

import pytest

from streamrl.algos.baseline_accuracy import baseline_accuracy
from streamrl.algos.event_tracker import EventTimeTracker


def _bandit(memory: str, failures_late: bool, seed: int, tasks: int = 32, steps: int = 200, per_step: int = 16,
            slow: int = 6) -> tuple[dict, list[float]]:
    """A stationary bandit played through SPO++'s memory: ``per_step`` episodes dispatched per
    published snapshot, each arriving 1 or ``slow`` snapshots later (by outcome when
    ``failures_late``, at random otherwise). ``event_time`` freezes the baseline at dispatch and
    records the result at the dispatch coordinate; ``receipt`` reads it on arrival and records there."""
    rng = random.Random(seed)
    p = [rng.uniform(0.1, 0.9) for _ in range(tasks)]
    tracker = EventTimeTracker(retention=0.875)
    for k in range(tasks):
        tracker.init_offline(k, sum(rng.random() < p[k] for _ in range(8)), 8)
    pending: list[tuple[int, int, int, float, float, float, int]] = []
    episodes: dict[str, list] = {"tasks": [], "versions": [], "baselines": [], "outcomes": []}
    request = 0
    for step in range(steps):
        for _ in range(per_step):
            k = rng.randrange(tasks)
            outcome = float(rng.random() < p[k])
            delay = (1 if outcome else slow) if failures_late else rng.choice([1, slow])
            read = tracker.dispatch(k)
            pending.append((step + delay, k, step, read.z, read.baseline, outcome, request))
            request += 1
        arrived, pending = [e for e in pending if e[0] <= step], [e for e in pending if e[0] > step]
        for _, k, version, z, frozen, outcome, rid in arrived:
            baseline = frozen if memory == "event_time" else tracker.baseline(k)
            tracker.record(k, z if memory == "event_time" else tracker.z, outcome, rid)
            for key, value in zip(episodes, (k, version, baseline, outcome)):
                episodes[key].append(value)
        tracker.publish()
    return episodes, p


def _graded(memory: str, failures_late: bool, truth: bool) -> tuple[float, float]:
    """(mean bias, mean |error|) over three seeds."""
    results = []
    for seed in range(3):
        episodes, p = _bandit(memory, failures_late, seed)
        results.append(baseline_accuracy(**episodes, truth=(lambda k, v: p[k]) if truth else None))
    return sum(r.bias for r in results) / 3, sum(r.mean_abs for r in results) / 3


@pytest.mark.parametrize("memory", ["event_time", "receipt"])
def test_unbiased_when_arrival_order_does_not_follow_the_outcome_and_the_estimate_agrees(memory):
    true_bias, true_abs = _graded(memory, failures_late=False, truth=True)
    estimated_bias, estimated_abs = _graded(memory, failures_late=False, truth=False)
    assert abs(true_bias) < 0.02 and abs(estimated_bias - true_bias) < 0.02
    assert 0.05 < true_abs < 0.25 and abs(estimated_abs - true_abs) < 0.05  # the memory's own estimation noise


def test_when_failures_arrive_late_the_event_time_memory_turns_optimistic():
    """Measured, against the expectation the issue states: with failures arriving 6 snapshots after
    successes, event-time baselines are optimistic by about 0.1 while receipt-order ones stay within
    0.02 of the truth. Event time stores a late failure at its dispatch coordinate, already decayed,
    and reads at dispatch before the failures of recent snapshots exist; receipt order stores each
    result at full weight when it arrives, and in a steady state what arrives is an unbiased stream."""
    event_bias = _graded("event_time", failures_late=True, truth=True)[0]
    receipt_bias = _graded("receipt", failures_late=True, truth=True)[0]
    assert event_bias > 0.05 and abs(receipt_bias) < 0.03
    assert _graded("event_time", failures_late=True, truth=False)[0] == pytest.approx(event_bias, abs=0.03)


def test_windows_leave_one_out_and_episodes_without_evidence():
    graded = baseline_accuracy(tasks=["a", "a", "a", "b"], versions=[0, 1, 9, 0], baselines=[0.5, 0.5, 0.5, 0.5],
                               outcomes=[1.0, 0.0, 1.0, 1.0], window=2)
    # a@0 is graded by a@1 (0.0), a@1 by a@0 (1.0); a@9 and b@0 have no neighbour
    assert (graded.episodes, graded.ungraded) == (2, 2)
    assert graded.bias == pytest.approx(0.0) and graded.mean_abs == pytest.approx(0.5)
    assert math.isnan(baseline_accuracy(["a"], [0], [0.5], [1.0]).bias)
    with pytest.raises(ValueError, match="one entry per episode"):
        baseline_accuracy(["a"], [0, 1], [0.5], [1.0])
