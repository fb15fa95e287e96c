"""Two scripted players, as demonstration sources and solvability checks.

* ``expert_plan`` is privileged: it reads the true world state (where every object is, even
  behind closed doors) and returns the shortest plan among its candidate routes. It re-plans from
  any state, so it also recovers after an agent's detours (ALFWorld's ``expert_plan`` likewise
  gives the next action from the current state).
* ``SearchingExpert`` is not: it sees only observations and the admissible list, and searches the
  receptacles one by one (those that can hold the target first), opening closed ones, until it
  finds what it needs. Its demonstrations look like what a real agent has to do.
"""

from __future__ import annotations

import re
from itertools import permutations

from streamrl.envs.alfworld_lite.catalog import APPLIANCES, OBJECTS, TASK_TYPES, can_contain
from streamrl.envs.alfworld_lite.rules import Command, parse_command, render_command
from streamrl.envs.alfworld_lite.task import TREATMENT_FLAG, Task
from streamrl.envs.alfworld_lite.world import World, kind_of, name_key


class _Sketch:
    """A cheap overlay on a ``World`` that tracks what a plan changes while it is written."""

    def __init__(self, world: World):
        self.world = world
        self.location = world.location
        self.held = world.held
        self.opened: set[str] = set()
        self.moved: dict[str, str | None] = {}
        self.commands: list[Command] = []

    def where(self, item: str) -> str | None:
        return self.moved[item] if item in self.moved else self.world.items[item].location

    def goto(self, receptacle: str) -> None:
        if self.location != receptacle:
            self.commands.append(("goto", receptacle))
            self.location = receptacle

    def reveal(self, receptacle: str) -> None:
        """Go to a receptacle and open it if it is closed."""
        self.goto(receptacle)
        r = self.world.receptacles[receptacle]
        if r.openable and not r.is_open and receptacle not in self.opened:
            self.commands.append(("open", receptacle))
            self.opened.add(receptacle)

    def take(self, item: str) -> None:
        if self.held == item:
            return
        if self.held is not None:
            self.stash()
        source = self.where(item)
        assert source is not None
        self.reveal(source)
        self.commands.append(("take", item, source))
        self.held, self.moved[item] = item, None

    def put(self, receptacle: str) -> None:
        assert self.held is not None
        self.reveal(receptacle)
        self.commands.append(("move", self.held, receptacle))
        self.moved[self.held], self.held = receptacle, None

    def treat(self, treatment: str) -> None:
        appliances = sorted(
            (r.name for r in self.world.receptacles_of(APPLIANCES[treatment])),
            key=lambda name: (name != self.location, name_key(name)),
        )
        assert self.held is not None
        self.goto(appliances[0])
        self.commands.append((treatment, self.held, appliances[0]))

    def stash(self) -> None:
        """Put the held (unneeded) object down where it fits, here if possible."""
        assert self.held is not None
        kind = self.world.items[self.held].kind
        fits = [r for r in self.world.receptacles.values() if can_contain(r.kind, kind)]
        # cost: moving there (unless here) plus opening it (if closed)
        best = min(
            fits,
            key=lambda r: (
                (r.name != self.location) + (r.openable and not r.is_open and r.name not in self.opened),
                name_key(r.name),
            ),
        )
        self.put(best.name)


def expert_commands(world: World, task: Task) -> list[Command]:
    """The shortest of the planner's candidate plans from ``world``; [] when the goal holds."""
    if task.satisfied(world):
        return []
    plans: list[list[Command]] = []
    objects = [item.name for item in world.items_of(task.obj)]
    if task.recep is None:
        assert task.toggle is not None  # a task has a receptacle or a lamp
        for obj in objects:
            for lamp in world.items_of(task.toggle):
                assert lamp.location is not None  # lamps are not pickupable
                sketch = _Sketch(world)
                sketch.take(obj)
                sketch.goto(lamp.location)
                if not lamp.on:
                    sketch.commands.append(("use", lamp.name))
                plans.append(sketch.commands)
    elif task.type.name == "pick_two_obj_and_place":
        for target in world.receptacles_of(task.recep):
            others = [obj for obj in objects if world.items[obj].location != target.name]
            need = 2 - (len(objects) - len(others))
            for chosen in permutations(others, need):
                sketch = _Sketch(world)
                for obj in chosen:
                    sketch.take(obj)
                    sketch.put(target.name)
                plans.append(sketch.commands)
    else:
        treatment = task.type.treatment
        for obj in objects:
            for target in world.receptacles_of(task.recep):
                sketch = _Sketch(world)
                sketch.take(obj)
                if treatment is not None and not getattr(world.items[obj], TREATMENT_FLAG[treatment]):
                    sketch.treat(treatment)
                sketch.put(target.name)
                plans.append(sketch.commands)
    if not plans:
        raise ValueError(f"alfworld_lite: no plan for task {task.goal!r} (missing objects or receptacles)")
    return min(plans, key=len)


def expert_plan(world: World, task: Task, grammar: str) -> list[str]:
    """``expert_commands`` rendered in ``grammar``."""
    return [render_command(command, grammar) for command in expert_commands(world, task)]


# ---------------------------------------------------------------------------------------------
# The searching (non-privileged) expert

_NAME = r"[a-z]+ \d+"
_SEEN = re.compile(rf"(?:On the ({_NAME}), you see|The ({_NAME}) is open\. In it, you see) (.+?)\.(?:$|\s)")
_CLOSED = re.compile(rf"The ({_NAME}) is closed\.")
_LISTED = re.compile(rf"a ({_NAME})")
_ROOM = re.compile(r"Looking quickly around you, you see (.+?)\.(?:\n|$)")
_TASK = re.compile(r"Your task is to: (.+)\.\s*$")


def _goal_patterns() -> list[tuple[re.Pattern[str], Task]]:
    """One regex per goal template; the Task carries the type and template with blank kinds."""
    patterns = []
    for task_type in TASK_TYPES.values():
        for index, template in enumerate(task_type.templates):
            regex = re.escape(template)
            for slot in ("obj", "recep", "toggle"):
                regex = regex.replace(re.escape("{" + slot + "}"), f"(?P<{slot}>[a-z]+)")
            blank = Task(task_type, "", None, None, index)
            patterns.append((re.compile(regex), blank))
    return patterns


_GOALS = _goal_patterns()


def parse_goal(goal: str) -> Task:
    """Goal sentence (no final period) -> Task; raises ValueError if it matches no template."""
    for pattern, blank in _GOALS:
        match = pattern.fullmatch(goal)
        if match:
            slots = match.groupdict()
            return Task(blank.type, slots["obj"], slots.get("recep"), slots.get("toggle"), blank.template)
    raise ValueError(f"alfworld_lite: goal {goal!r} matches no task template")


class SearchingExpert:
    """Plays from observations and admissible commands only (see the module docstring).

    Use: ``expert.reset(initial_observation)``, then ``action = expert.act(observation, admissible)``
    with each new observation (the first call gets the initial observation again).
    """

    def reset(self, initial_observation: str) -> None:
        room = _ROOM.search(initial_observation)
        task = _TASK.search(initial_observation)
        if room is None or task is None:
            raise ValueError("SearchingExpert.reset needs an alfworld_lite initial observation")
        self.task = parse_goal(task.group(1))
        self.receptacles: list[str] = _LISTED.findall(room.group(1))
        self.contents: dict[str, list[str]] = {}  # receptacle -> items seen there
        self.closed: set[str] = set()
        self.location: str | None = None
        self.held: str | None = None
        self.treated = False
        self.placed: dict[str, str] = {}  # item -> receptacle we put it in
        self._last: str | None = None

    # -- memory ---------------------------------------------------------------------------------

    def _observe(self, observation: str) -> None:
        last, self._last = self._last, None
        if last is not None and observation != "Nothing happens.":
            verb, _, rest = last.partition(" ")
            if verb == "go":
                self.location = rest.removeprefix("to ")
            elif verb == "take":
                item, _, source = rest.partition(" from ")
                self.held = item
                seen_there = self.contents.get(source, [])
                if item in seen_there:
                    seen_there.remove(item)
            elif verb in ("move", "put") and self.held is not None:
                assert self.location is not None  # a put succeeds only at a receptacle
                self.placed[self.held] = self.location
                self.contents.setdefault(self.location, []).append(self.held)
                self.held = None
            elif verb in APPLIANCES:
                self.treated = True
        for on_name, in_name, listed in _SEEN.findall(observation):
            receptacle = on_name or in_name
            self.contents[receptacle] = [] if listed == "nothing" else _LISTED.findall(listed)
            self.closed.discard(receptacle)
        for receptacle in _CLOSED.findall(observation):
            self.closed.add(receptacle)

    # -- decisions ------------------------------------------------------------------------------

    def act(self, observation: str, admissible: list[str]) -> str:
        self._observe(observation)
        action = self._decide(set(admissible))
        self._last = action
        return action

    def _decide(self, admissible: set[str]) -> str:
        task = self.task
        holding_target = self.held is not None and kind_of(self.held) == task.obj
        if task.recep is None:
            assert task.toggle is not None  # a task has a receptacle or a lamp
            if not holding_target:
                return self._acquire()
            lamp = self._find(task.toggle)
            if lamp is None:
                return self._explore(task.toggle)
            if self.location != lamp[1]:
                return f"go to {lamp[1]}"
            return f"use {lamp[0]}"
        if not holding_target:
            return self._acquire()
        if task.type.treatment is not None and not self.treated:
            appliance_kind = APPLIANCES[task.type.treatment]
            if self.location is None or kind_of(self.location) != appliance_kind:
                return f"go to {next(r for r in self.receptacles if kind_of(r) == appliance_kind)}"
            return f"{task.type.treatment} {self.held} with {self.location}"
        destination = next(iter(self.placed.values()), None) or next(
            r for r in self.receptacles if kind_of(r) == task.recep
        )
        if self.location != destination:
            return f"go to {destination}"
        if destination in self.closed:
            return f"open {destination}"
        # the put command in whichever grammar the environment lists
        put = ("move", self.held, destination)
        return next((a for a in admissible if parse_command(a) == put), "look")

    def _find(self, kind: str) -> tuple[str, str] | None:
        """A known (item, receptacle) of ``kind`` not already placed by us."""
        for receptacle in self.receptacles:
            for item in self.contents.get(receptacle, []):
                if kind_of(item) == kind and item not in self.placed:
                    return item, receptacle
        return None

    def _acquire(self) -> str:
        found = self._find(self.task.obj)
        if found is None:
            return self._explore(self.task.obj)
        item, receptacle = found
        if self.location != receptacle:
            return f"go to {receptacle}"
        if receptacle in self.closed:
            return f"open {receptacle}"
        return f"take {item} from {receptacle}"

    def _explore(self, kind: str) -> str:
        """Open the closed receptacle here, or go to the next unsearched one (likely homes first)."""
        if self.location in self.closed and self.location not in self.contents:
            return f"open {self.location}"
        homes = OBJECTS[kind].homes
        unsearched = [r for r in self.receptacles if r not in self.contents]
        unsearched.sort(key=lambda r: kind_of(r) not in homes)
        for receptacle in unsearched:
            if receptacle != self.location:
                return f"go to {receptacle}"
        return "look"
