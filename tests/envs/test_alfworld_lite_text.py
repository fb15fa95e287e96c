"""alfworld_lite observation strings, admissible commands and grammars (environments.md section 6,
alfworld_lite items 1, 3, 4, 6, 7 and 8)."""

from __future__ import annotations

import copy
import random
import re

import pytest

from streamrl.envs import make
from streamrl.envs.alfworld_lite.catalog import OBJECTS, RECEPTACLES, TASK_TYPES
from streamrl.envs.alfworld_lite.rules import parse_command

INITIAL_OBS = re.compile(
    r"^-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room\. Looking quickly around you, "
    r"you see (a [a-z]+ \d+, )*and a [a-z]+ \d+\.\n\nYour task is to: .+\.$"
)
NOTHING = "Nothing happens."


def _env(**options):
    return make("alfworld_lite", expert_plan=False, **options)


def _until_taken(env, task_id: str) -> str:
    """Reset and follow the expert until it picks the target up; returns the held object."""
    env.reset(task_id=task_id)
    while env.world.held is None:
        result = env.step(env.expert_action())
        assert result.observation != NOTHING
    return env.world.held


def test_initial_observation_matches_alfworlds_format():
    env = _env()
    task_ids = env.task_ids("seen") + env.task_ids("unseen") + env.task_ids("train", limit=100)
    for task_id in task_ids:
        observation, _ = env.reset(task_id=task_id)
        assert INITIAL_OBS.match(observation), observation
    small = _env(max_receptacles=3)
    for seed in range(20):
        assert INITIAL_OBS.match(small.reset(seed=seed)[0])


def _states(env, task_id: str, rng: random.Random, steps: int = 15):
    """Yield the env at states along a trajectory mixing expert and random admissible actions."""
    _, info = env.reset(task_id=task_id)
    for _ in range(steps):
        yield env
        action = env.expert_action() if rng.random() < 0.5 else rng.choice(info["admissible_actions"])
        result = env.step(action)
        if result.terminated or result.truncated:
            return
        info = result.info


@pytest.mark.parametrize("grammar", ["v2", "legacy"])
def test_every_admissible_command_has_an_effect(grammar):
    rng = random.Random(0)
    env = _env(grammar=grammar)
    checked = 0
    for task_id in ["train/0", "train/3", "seen/7", "unseen/5"]:
        for state in _states(env, task_id, rng, steps=12):
            for command in state.admissible_actions():
                trial = copy.deepcopy(state)
                result = trial.step(command)
                assert result.observation != NOTHING, (task_id, command)
                assert result.info["action_effective"]
                checked += 1
    assert checked > 400


def _non_admissible(env, rng: random.Random) -> str:
    """A string that is not an admissible command now: junk, or a grammatical command that does
    not apply (wrong names, wrong place, wrong verb)."""
    world = env.world
    names = list(world.receptacles) + list(world.items) + ["apple 99", "fridge 7", "cabinet 0"]
    templates = [
        "go to {a}", "open {a}", "close {a}", "take {a} from {b}", "move {a} to {b}", "put {a} in/on {b}",
        "put {a} in {b}", "heat {a} with {b}", "cool {a} with {b}", "clean {a} with {b}", "use {a}",
        "examine {a}", "turn off {a}", "go {a}", "take {a}",
    ]
    admissible = set(env.admissible_actions())
    while True:
        if rng.random() < 0.3:
            length = rng.randint(0, 25)
            text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ./") for _ in range(length))
        else:
            text = rng.choice(templates).format(a=rng.choice(names), b=rng.choice(names))
        parsed = parse_command(text)
        if text not in admissible and (parsed is None or all(parse_command(a) != parsed for a in admissible)):
            return text


def test_non_admissible_strings_do_nothing_and_leave_the_state_unchanged():
    rng = random.Random(1)
    env = _env()
    tried = 0
    for task_id in ["train/4", "train/5", "seen/3", "unseen/9"]:
        for state in _states(env, task_id, rng, steps=10):
            for _ in range(25):
                before, step = state.state_hash(), state.steps
                trial = copy.deepcopy(state)
                text = _non_admissible(trial, rng)
                result = trial.step(text)
                assert result.observation == NOTHING, text
                assert trial.state_hash() == before and not result.info["action_effective"]
                assert result.info["step"] == step + 1 and result.reward == 0.0
                tried += 1
    assert tried >= 1000


def test_inadmissible_take_move_heat_and_open():
    env = _env(task_types=["pick_heat_then_place_in_recep"], max_steps=500)
    held = _until_taken(env, "train/0")
    world = env.world
    # take while holding something: never admissible, wherever the agent stands
    for receptacle in world.receptacles.values():
        env.step(f"go to {receptacle.name}")
        if receptacle.openable:
            env.step(f"open {receptacle.name}")
        assert not [a for a in env.admissible_actions() if a.startswith("take ")]
        for item in receptacle.contents:
            assert env.step(f"take {item} from {receptacle.name}").observation == NOTHING
        if receptacle.openable:
            env.step(f"close {receptacle.name}")
    # move into a closed fridge; heat away from the microwave
    assert env.step("go to fridge 1").observation == "You arrive at fridge 1. The fridge 1 is closed."
    assert f"move {held} to fridge 1" not in env.admissible_actions()
    assert env.step(f"move {held} to fridge 1").observation == NOTHING
    assert env.step(f"heat {held} with microwave 1").observation == NOTHING
    opened = env.step("open fridge 1").observation
    assert opened.startswith("You open the fridge 1. The fridge 1 is open. In it, you see")
    assert f"move {held} to fridge 1" in env.admissible_actions()
    # open on a countertop (not openable)
    env.step("go to countertop 1")
    assert "open countertop 1" not in env.admissible_actions()
    assert env.step("open countertop 1").observation == NOTHING


def test_heat_then_cool_leaves_the_object_cold_and_examine_strings():
    env = _env(task_types=["pick_heat_then_place_in_recep"])
    seed = next(s for s in range(50) if OBJECTS[_task_obj(env, s)].cleanable)
    held = _until_taken(env, f"train/{seed}")
    assert env.step(f"examine {held}").observation == f"There's nothing special about {held}."
    assert env.step("inventory").observation == f"You are carrying: a {held}."
    env.step("go to microwave 1")
    assert env.step(f"heat {held} with microwave 1").observation == f"You heat the {held} using the microwave 1."
    assert env.step(f"examine {held}").observation == f"This is a hot {held}."
    env.step("go to fridge 1")
    assert env.step(f"cool {held} with fridge 1").observation == f"You cool the {held} using the fridge 1."
    item = env.world.items[held]
    assert item.cool and not item.hot
    assert env.step(f"examine {held}").observation == f"This is a cold {held}."
    env.step("go to sinkbasin 1")
    assert env.step(f"clean {held} with sinkbasin 1").observation == f"You clean the {held} using the sinkbasin 1."
    assert env.step(f"examine {held}").observation == f"This is a cold and clean {held}."
    env.step("go to microwave 1")
    env.step(f"heat {held} with microwave 1")
    assert env.step(f"examine {held}").observation == f"This is a hot and clean {held}."
    assert env.step("look").observation == "You are facing the microwave 1. Next to it, you see nothing."


def _task_obj(env, seed: int) -> str:
    env.reset(seed=seed)
    return env.task.obj


def test_lamp_examine_look_and_inventory_strings():
    env = _env(task_types=["look_at_obj_in_light"])
    observation, _ = env.reset(seed=0)
    middle = observation.split("\n\n")[1]
    assert env.step("look").observation == middle
    assert env.step("inventory").observation == "You are not carrying anything."
    lamp = next(item for item in env.world.items_of(env.task.toggle))
    arrival = env.step(f"go to {lamp.location}").observation
    assert arrival.startswith(f"You arrive at {lamp.location}. On the {lamp.location}, you see ")
    assert f"a {lamp.name}" in arrival
    assert env.step(f"examine {lamp.name}").observation == f"There's nothing special about {lamp.name}."
    assert env.step(f"use {lamp.name}").observation == f"You turn on the {lamp.name}."
    assert env.step(f"examine {lamp.name}").observation == f"This {lamp.name} is on."
    assert env.step(f"examine {lamp.location}").observation.startswith(f"On the {lamp.location}, you see ")


def test_goal_text_is_one_of_its_types_two_templates_with_kind_names():
    env = _env()
    for task_id in env.task_ids("seen") + env.task_ids("unseen") + env.task_ids("train", limit=200):
        observation, info = env.reset(task_id=task_id)
        goal = observation.rsplit("Your task is to: ", 1)[1].removesuffix(".")
        task_type = TASK_TYPES[info["task_type"]]
        task = env.task
        assert goal in [t.format(obj=task.obj, recep=task.recep, toggle=task.toggle) for t in task_type.templates]
        assert not re.search(r"\d", goal)
        assert task.obj in OBJECTS and (task.recep in RECEPTACLES or task.toggle in ("desklamp", "floorlamp"))


def test_legacy_grammar_lists_and_prints_put_in_on():
    simple = ["pick_and_place_simple"]
    legacy, v2 = _env(grammar="legacy", task_types=simple), _env(grammar="v2", task_types=simple)
    held = _until_taken(legacy, "train/2")
    assert _until_taken(v2, "train/2") == held
    destination = legacy.world.receptacles_of(legacy.task.recep)[0].name
    for env in (legacy, v2):
        arrival = env.step(f"go to {destination}").observation
        if env.world.receptacles[destination].openable:
            env.step(f"open {destination}")
        if env is legacy:
            assert re.match(r"You arrive at loc \d+\. ", arrival)
        else:
            assert arrival.startswith(f"You arrive at {destination}. ")
    legacy_actions, v2_actions = legacy.admissible_actions(), v2.admissible_actions()
    assert f"put {held} in/on {destination}" in legacy_actions and "help" not in legacy_actions
    assert not [a for a in legacy_actions if a.startswith("move ")]
    assert f"move {held} to {destination}" in v2_actions and "help" in v2_actions
    assert not [a for a in v2_actions if a.startswith("put ")]
    assert legacy.step("help").observation == NOTHING
    for form in (f"put {held} in/on {destination}", f"put {held} in {destination}",
                 f"put {held} on {destination}", f"move {held} to {destination}"):
        for env, expected in ((legacy, f"You put the {held} in/on the {destination}."),
                              (v2, f"You move the {held} to the {destination}.")):
            trial = copy.deepcopy(env)
            assert trial.step(form).observation == expected
