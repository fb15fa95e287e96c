"""The staleness rules as pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.rollout import admission_capacity, is_stale, sample_lag


@settings(max_examples=200, deadline=None)
@given(free=st.integers(0, 64), eta=st.integers(0, 6), steps=st.integers(0, 50), batch=st.integers(1, 32),
       admitted=st.integers(0, 3000))
def test_capacity_is_the_bound_clamped_to_free_slots(free, eta, steps, batch, admitted):
    capacity = admission_capacity(free_slots=free, max_staleness=eta, learner_steps=steps, batch_size=batch,
                                  admitted=admitted)
    assert 0 <= capacity <= free
    assert admitted + capacity <= max(admitted, (eta + steps + 1) * batch)
    if capacity < free:  # clamped by the bound, which is then met exactly (or already exceeded)
        assert admitted + capacity >= (eta + steps + 1) * batch
    more = admission_capacity(free_slots=free, max_staleness=eta, learner_steps=steps + 1, batch_size=batch,
                              admitted=admitted)
    assert more >= capacity  # a learner step never reduces what may be dispatched


def test_no_bound_means_only_slots_limit():
    assert admission_capacity(free_slots=5, max_staleness=None, learner_steps=0, batch_size=1, admitted=10**6) == 5


def test_synchronous_bound_admits_exactly_one_batch_per_version():
    capacity = admission_capacity(free_slots=100, max_staleness=0, learner_steps=0, batch_size=8, admitted=0)
    assert capacity == 8
    assert admission_capacity(free_slots=100, max_staleness=0, learner_steps=0, batch_size=8, admitted=8) == 0
    assert admission_capacity(free_slots=100, max_staleness=0, learner_steps=1, batch_size=8, admitted=8) == 8


@settings(max_examples=60, deadline=None)
@given(eta=st.integers(0, 4), batch=st.integers(1, 8), slots=st.integers(1, 24), steps=st.integers(1, 12))
def test_fifo_consumption_never_lags_more_than_the_bound(eta, batch, slots, steps):
    """Simulation: episodes finish in dispatch order; the learner trains on B at a time."""
    buffer: list[int] = []  # finished, unconsumed: the learner version at each one's dispatch
    admitted = version = 0
    while version < steps:
        admit = admission_capacity(free_slots=slots, max_staleness=eta, learner_steps=version, batch_size=batch,
                                   admitted=admitted)
        admitted += admit
        buffer += [version] * admit  # every in-flight episode finishes, in order
        if len(buffer) < batch:
            assert admit > 0, "admission stalled before a batch could fill"
            continue
        for dispatch_version in buffer[:batch]:
            assert not is_stale(sample_lag(version, dispatch_version), eta)
        del buffer[:batch]
        version += 1


def test_lag_and_staleness():
    assert sample_lag(10, 7) == 3
    assert not is_stale(4, 4) and is_stale(5, 4) and not is_stale(100, None)


@pytest.mark.parametrize("kwargs", [dict(free_slots=-1), dict(batch_size=0), dict(max_staleness=-1)])
def test_bad_inputs_are_refused(kwargs):
    base = dict(free_slots=1, max_staleness=1, learner_steps=0, batch_size=1, admitted=0)
    with pytest.raises(ValueError):
        admission_capacity(**{**base, **kwargs})
