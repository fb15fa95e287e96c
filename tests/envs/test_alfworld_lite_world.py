"""World-model invariants of alfworld_lite under random admissible play (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.envs import make
from streamrl.envs.alfworld_lite.catalog import OBJECTS, can_contain


def _check_world(env) -> None:
    world = env.world
    places: dict[str, str | None] = {}
    for receptacle in world.receptacles.values():
        for item in receptacle.contents:
            assert item not in places, f"{item} is in two receptacles"
            places[item] = receptacle.name
            assert can_contain(receptacle.kind, world.items[item].kind)
    if world.held is not None:
        assert world.held not in places and OBJECTS[world.items[world.held].kind].pickupable
        places[world.held] = None
    assert places.keys() == world.items.keys()
    assert all(world.items[item].location == where for item, where in places.items())
    assert all(not (item.hot and item.cool) for item in world.items.values())


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=10_000),
    grammar=st.sampled_from(["v2", "legacy"]),
    choices=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=60),
)
def test_random_admissible_play_keeps_the_world_consistent(seed, grammar, choices):
    env = make("alfworld_lite", grammar=grammar, expert_plan=False)
    _, info = env.reset(seed=seed)
    _check_world(env)
    for choice in choices:
        actions = info["admissible_actions"]
        assert actions == sorted(set(actions)) and actions == env.admissible_actions()
        result = env.step(actions[choice % len(actions)])
        info = result.info
        _check_world(env)
        assert info["won"] == env.task.satisfied(env.world) == result.terminated
        assert result.reward == float(info["won"])
        if result.terminated or result.truncated:
            break
