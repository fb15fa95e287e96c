"""SPO++'s event-time memory: spec §5.2 and the §5.7 property tests 4-6."""

import json
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.algos import EventTimeTracker, SPOTracker, spopp_advantages

DZ = -math.log(0.875)
OFFLINE = {"p0": (2, 8), "p1": (7, 8)}  # successes, n0; p2 and p3 start unseen


def _schedule(seed: int, n_dispatch: int):
    """Dispatches (snapshot index, prompt, request id, reward) and each result's commit slot: the
    result of dispatch i becomes visible just before dispatch commit[i] (n_dispatch = after all)."""
    rng = random.Random(seed)
    snapshot, dispatches = 0, []
    for q in range(n_dispatch):
        if q and rng.random() < 0.4:
            snapshot += rng.randint(1, 3)
        reward = rng.choice([0.0, 1.0, rng.random()])  # binary and soft outcomes
        dispatches.append((snapshot, rng.choice(["p0", "p1", "p2", "p3"]), f"req-{q}", reward))
    commits = [rng.randint(q + 1, n_dispatch) for q in range(n_dispatch)]
    return dispatches, commits


def _new_tracker() -> EventTimeTracker:
    tracker = EventTimeTracker()
    for pid, (s, n0) in OFFLINE.items():
        tracker.init_offline(pid, s, n0)
    return tracker


def _run(dispatches, commits, order_seed):
    """Play the schedule; within each commit slot the arrival order is shuffled by ``order_seed``."""
    rng = random.Random(order_seed)
    tracker, snapshot = _new_tracker(), 0
    reads, later_reads, zs = [], [], []
    n = len(dispatches)

    def deliver(slot):
        arriving = [i for i in range(n) if commits[i] == slot]
        rng.shuffle(arriving)
        for i in arriving:
            _, pid, rid, reward = dispatches[i]
            assert tracker.record(pid, zs[i], reward, rid)

    for q, (k, pid, _, _) in enumerate(dispatches):
        while snapshot < k:
            tracker.publish()
            snapshot += 1
        deliver(q)
        read = tracker.dispatch(pid)
        reads.append(read)
        later_reads.append(tracker.read_full(pid, read.z + 10.0))  # same visible set, 10 units later
        zs.append(read.z)
    deliver(n)
    return tracker, reads, later_reads, zs


def _list_form(dispatches, commits, zs, q, z_read=None):
    """The §5.2 sums over the visible history H_q, evaluated directly (the oracle)."""
    pid = dispatches[q][1]
    zq = zs[q] if z_read is None else z_read
    first = min(i for i, d in enumerate(dispatches) if d[1] == pid)
    if pid in OFFLINE:
        s, n0 = OFFLINE[pid]
        v0 = (s + 0.5) / (n0 + 1)
        alpha0, beta0, z0 = 8 * v0, 8 * (1 - v0), 0.0
    else:
        alpha0, beta0, z0 = 0.5, 0.5, zs[first]
    alpha = math.exp(-(zq - z0)) * alpha0
    beta = math.exp(-(zq - z0)) * beta0
    for i, (_, other, _, reward) in enumerate(dispatches):
        if other == pid and commits[i] <= q:
            alpha += math.exp(-(zq - zs[i])) * reward
            beta += math.exp(-(zq - zs[i])) * (1 - reward)
    return alpha / (alpha + beta), alpha + beta


def _rows(tracker):
    return {row[0]: row[1:] for row in tracker.state_dict()["prompts"]}


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_dispatch=st.integers(1, 40),
    order_seeds=st.lists(st.integers(0, 10**6), min_size=2, max_size=4),
)
def test_spo_pp_5_7_4_arrival_order_invariance(seed, n_dispatch, order_seeds):
    dispatches, commits = _schedule(seed, n_dispatch)
    runs = [_run(dispatches, commits, s) for s in order_seeds]
    tracker0, reads0, later0, zs = runs[0]
    for q, read in enumerate(reads0):
        v_list, n_list = _list_form(dispatches, commits, zs, q)
        assert read.v_hat == pytest.approx(v_list, rel=1e-12)  # compact form == list form
        assert read.n_eff == pytest.approx(n_list, rel=1e-12)
        # the same visible set read 10 units later: same v_hat, N scaled by e^-10
        later = later0[q]
        assert later.v_hat == pytest.approx(read.v_hat, rel=1e-12)
        assert later.n_eff == pytest.approx(read.n_eff * math.exp(-10.0), rel=1e-12)
        assert _list_form(dispatches, commits, zs, q, zs[q] + 10.0)[0] == pytest.approx(v_list, rel=1e-12)
    final0 = _rows(tracker0)
    for tracker, reads, _, _ in runs[1:]:
        for a, b in zip(reads0, reads):
            assert b.v_hat == pytest.approx(a.v_hat, rel=1e-12) and b.n_eff == pytest.approx(a.n_eff, rel=1e-12)
        final = _rows(tracker)
        assert final.keys() == final0.keys()
        for pid, row in final.items():
            assert row == pytest.approx(final0[pid], rel=1e-12)
    # any permutation of all arrivals, every result delivered after the last dispatch
    everything_late = [n_dispatch] * n_dispatch
    late_tracker, _, _, _ = _run(dispatches, everything_late, order_seeds[0])
    for pid, row in _rows(late_tracker).items():
        assert row == pytest.approx(final0[pid], rel=1e-12)


def test_spo_pp_5_2_evidence_newer_than_the_reader_is_read_at_its_own_event():
    tracker = EventTimeTracker()
    for _ in range(5):
        tracker.publish()
    tracker.record("x", tracker.z, 1.0, "r1")
    early = tracker.read_full("x", z=2 * DZ)
    now = tracker.read_full("x")
    assert early.v_hat == now.v_hat
    assert early.n_eff == pytest.approx(now.n_eff) and early.n_eff <= 2.0  # no weight above 1


@settings(max_examples=30, deadline=None)
@given(
    history=st.lists(st.tuples(st.sampled_from("ab"), st.floats(0, 1)), max_size=10),
    batch=st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 1), st.integers(0, 300)), min_size=2, max_size=6),
)
def test_spo_pp_5_7_5_frozen_baseline(history, batch):
    def prepared():
        tracker = EventTimeTracker()
        for i, (pid, r) in enumerate(history):
            tracker.record(pid, tracker.z, r, f"h{i}")
            tracker.publish()
        reads = [tracker.dispatch(pid) for pid, _, _ in batch]
        return tracker, reads

    rewards = torch.tensor([r for _, r, _ in batch], dtype=torch.float64)
    lengths = torch.tensor([n for _, _, n in batch], dtype=torch.float64)

    def advantages(reads):
        return spopp_advantages(rewards, torch.tensor([r.baseline for r in reads], dtype=torch.float64), lengths)

    tracker, reads = prepared()
    before = advantages(reads)  # advantage first, evidence after
    live_before = [tracker.read_full(pid) for pid, _, _ in batch]
    for i, ((pid, r, _), read) in enumerate(zip(batch, reads)):
        tracker.record(pid, read.z, r, f"b{i}")
    tracker2, reads2 = prepared()
    for i, ((pid, r, _), read) in enumerate(zip(batch, reads2)):
        tracker2.record(pid, read.z, r, f"b{i}")  # evidence first, advantage after
    after = advantages(reads2)
    assert torch.equal(before, after)
    # the memory itself did move (its evidence count at least), yet the advantages did not
    live_after = [tracker2.read_full(pid) for pid, _, _ in batch]
    assert all(a.n_eff > b.n_eff for a, b in zip(live_after, live_before))


@settings(max_examples=40, deadline=None)
@given(rewards=st.lists(st.floats(0, 1), min_size=1, max_size=60), successes=st.integers(0, 8))
def test_spo_pp_5_7_6_reduces_to_spo_with_constant_rho(rewards, successes):
    spo = SPOTracker(rho_min=0.875, rho_max=0.875)
    event = EventTimeTracker(retention=0.875)
    spo.init_offline("x", successes, 8)
    event.init_offline("x", successes, 8)
    for k, reward in enumerate(rewards):
        event.publish()  # snapshot k + 1 generates result k + 1
        event.record("x", event.z, reward, f"r{k}")
        spo.update("x", reward, drift=0.3)
        assert event.read("x") == pytest.approx(spo.value("x"), rel=1e-12)
        assert event.n_eff("x") == pytest.approx(spo.n_eff("x"), rel=1e-12)


def test_spo_pp_duplicate_request_ids_are_ignored():
    tracker = EventTimeTracker()
    assert tracker.record("x", 0.0, 1.0, "r1")
    state = tracker.read_full("x")
    assert not tracker.record("x", 0.0, 1.0, "r1")
    assert not tracker.record("y", 0.0, 0.0, "r1")
    assert tracker.read_full("x") == state and not tracker.is_registered("y")


def test_spo_pp_priors_are_anchored_where_specified():
    tracker = EventTimeTracker()
    tracker.init_offline("offline", 4, 8)
    for _ in range(50):
        tracker.publish()
    # the offline prior sits at z = 0 and fades with every snapshot, visited or not
    assert tracker.n_eff("offline") == pytest.approx(8 * 0.875**50, rel=1e-9)
    assert tracker.z == pytest.approx(50 * DZ)
    # an unseen prompt is anchored when first dispatched, not at z = 0
    read = tracker.dispatch("late")
    assert (read.v_hat, read.n_eff) == (0.5, pytest.approx(1.0))
    tracker.publish()
    assert tracker.n_eff("late") == pytest.approx(0.875)
    # reads and sampling weights never register a prompt
    assert tracker.read("never") == 0.5 and tracker.sampling_weights(["never"]) == [pytest.approx(0.55)]
    assert not tracker.is_registered("never")


def test_spo_pp_drift_adaptive_clock():
    tracker = EventTimeTracker()
    assert tracker.publish(drift=0.0) == pytest.approx(-math.log(0.96))
    assert tracker.publish(drift=0.06) == pytest.approx(-math.log(0.96) - math.log(0.875))
    assert tracker.publish() == pytest.approx(-math.log(0.96) - 2 * math.log(0.875))


def test_spo_pp_state_dict_round_trips_through_json():
    tracker = _new_tracker()
    tracker.dispatch("p2")
    tracker.record("p2", 0.0, 1.0, "r1")
    tracker.publish()
    tracker.record("p0", tracker.z, 0.25, 17)
    restored = EventTimeTracker()
    restored.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
    assert restored.z == tracker.z
    for pid in ("p0", "p1", "p2", "unseen"):
        assert restored.read_full(pid) == tracker.read_full(pid)
    assert not restored.record("p2", 0.0, 1.0, "r1") and not restored.record("p0", 0.0, 1.0, 17)
    with pytest.raises(ValueError, match="seen_request_ids"):
        restored.load_state_dict({"z": 0.0, "prompts": []})
    with pytest.raises(ValueError, match="invalid"):
        restored.load_state_dict({"z": 0.0, "prompts": [["x", -1.0, 1.0, 0.0]], "seen_request_ids": []})


def test_spo_pp_bad_input_names_the_problem():
    tracker = EventTimeTracker(reward_range=(0.0, 1.0))
    with pytest.raises(ValueError, match="outside reward_range"):
        tracker.record("x", 0.0, 2.0, "r")
    with pytest.raises(ValueError, match="z must be finite"):
        tracker.record("x", math.inf, 1.0, "r")
    with pytest.raises(TypeError, match="request ids"):
        tracker.record("x", 0.0, 1.0, ("a", 1))
    with pytest.raises(ValueError, match="retention"):
        EventTimeTracker(retention=1.0)


@pytest.mark.parametrize("registered_first", [False, True])
def test_spo_pp_5_7_4_unregistered_prompt_is_order_invariant(registered_first):
    """A prompt only ever met through ``record`` (never dispatched by this tracker, e.g. restored
    in-flight requests): its unseen prior is anchored at its first registration, the earliest
    event among its results, whatever order they arrive in (§5.5, §5.7.4)."""
    import itertools

    results = [(0.0, 1.0, "a"), (2 * DZ, 0.0, "b"), (5 * DZ, 1.0, "c"), (5 * DZ, 0.25, "d")]

    def final(order):
        tracker = EventTimeTracker()
        for _ in range(6):
            tracker.publish()
        for other_z, reward, rid in order:
            tracker.record("fresh", other_z, reward, rid)
            tracker.record("known", other_z, reward, "k" + rid)  # anchored by its own dispatch
        if registered_first:
            tracker.dispatch("fresh")  # freezes the anchor: later records no longer move it
            tracker.record("fresh", 0.0, 0.5, "late")
        return tracker

    first = final(results)
    expected = _expected_unseen(results + ([(0.0, 0.5, "late")] if registered_first else []), anchor=0.0, z=first.z)
    for order in itertools.permutations(results):
        tracker = final(list(order))
        read = tracker.read_full("fresh")
        assert read.v_hat == pytest.approx(first.read("fresh"), rel=1e-12, abs=0)
        assert read.n_eff == pytest.approx(first.n_eff("fresh"), rel=1e-12)
        assert (read.v_hat, read.n_eff) == (pytest.approx(expected[0], rel=1e-12), pytest.approx(expected[1], rel=1e-12))
    # the state (with its floating anchor) survives a checkpoint round trip
    restored = EventTimeTracker()
    restored.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for tracker in (first, restored):
        tracker.record("fresh", -1.0, 1.0, "older")
    assert restored.read_full("fresh") == first.read_full("fresh")


def _expected_unseen(results, anchor, z):
    """The §5.2 list form for a 0.5/0.5 prior anchored at ``anchor``, read at ``z``."""
    alpha = 0.5 * math.exp(-(z - anchor)) + sum(math.exp(-(z - zi)) * r for zi, r, _ in results)
    beta = 0.5 * math.exp(-(z - anchor)) + sum(math.exp(-(z - zi)) * (1 - r) for zi, r, _ in results)
    return alpha / (alpha + beta), alpha + beta
