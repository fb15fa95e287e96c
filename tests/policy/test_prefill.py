"""Prefill planning: length groups and common prefixes of prompts admitted together."""

from __future__ import annotations

from streamrl.policy.prefill import prefill_groups, shared_prefixes


def test_groups_bound_padding_and_budget():
    groups = prefill_groups([10, 3, 11, 12, 4, 40], lambda n: n, budget=36)
    assert groups == [[3, 4], [10, 11, 12], [40]]


def test_shared_prefixes_pick_the_runs_that_save_most_and_leave_a_token():
    system = list(range(100, 120))
    prompts = [system + [1, 2], system + [1, 3], [7] * 30, system + [5], system + [1, 2], system[:10] + [9]]
    # the short-sharing prompt is left out: with it, the run would share 10 tokens instead of 20
    assert shared_prefixes(prompts) == [(20, [0, 4, 1, 3])]
    assert shared_prefixes([system[:10] + [i] for i in range(5)]) == [(10, [0, 1, 2, 3, 4])]
    assert shared_prefixes([system, system + [1], system + [2]]) == [(19, [0, 1, 2])]  # one is a prefix of others
    assert shared_prefixes([system + [1], system + [2]]) == []  # saves 20 tokens: not worth a forward
    assert shared_prefixes([system + [1], system + [1]]) == []  # identical prompts: one prefill anyway
