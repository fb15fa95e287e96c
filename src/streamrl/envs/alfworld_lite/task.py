"""A task: its type, target kinds, goal text, and the goal predicate checked after every step."""

from __future__ import annotations

from dataclasses import dataclass

from streamrl.envs.alfworld_lite.catalog import OBJECTS, RECEPTACLES, TaskType
from streamrl.envs.alfworld_lite.world import World

#: the Item flag each treatment sets
TREATMENT_FLAG = {"heat": "hot", "cool": "cool", "clean": "clean"}


@dataclass(frozen=True)
class Task:
    type: TaskType
    obj: str  # object kind, e.g. "apple"
    recep: str | None  # receptacle kind; None for look_at_obj_in_light
    toggle: str | None  # lamp kind for look_at_obj_in_light, else None
    template: int  # which of the type's two goal templates (0 or 1)

    @property
    def goal(self) -> str:
        """The goal sentence without its final period, e.g. ``put a hot apple in fridge``."""
        return self.type.templates[self.template].format(obj=self.obj, recep=self.recep, toggle=self.toggle)

    @property
    def target(self) -> str:
        """The kind the object must end up with: the receptacle, or the lamp for look tasks."""
        if self.recep is None:
            assert self.toggle is not None  # a task has a receptacle or a lamp
            return self.toggle
        return self.recep

    def gamefile_stem(self, scene: int) -> str:
        """ALFWorld's folder naming: ``pick_heat_then_place_in_recep-Apple-None-Fridge-12``."""
        if self.recep is None:
            assert self.toggle is not None  # a task has a receptacle or a lamp
            target = OBJECTS[self.toggle].class_name
        else:
            target = RECEPTACLES[self.recep].class_name
        return f"{self.type.name}-{OBJECTS[self.obj].class_name}-None-{target}-{scene}"

    def satisfied(self, world: World) -> bool:
        if self.recep is None:
            return self._lit(world)
        placed = [
            item
            for item in world.items_of(self.obj)
            if item.location is not None and world.receptacles[item.location].kind == self.recep
        ]
        treatment = self.type.treatment
        if treatment is not None:
            placed = [item for item in placed if getattr(item, TREATMENT_FLAG[treatment])]
        if self.type.name == "pick_two_obj_and_place":
            locations = [item.location for item in placed]
            return any(locations.count(location) >= 2 for location in locations)
        return bool(placed)

    def _lit(self, world: World) -> bool:
        """Holding the object while a lamp of the right kind is on at the agent's receptacle."""
        if world.held is None or world.items[world.held].kind != self.obj or world.location is None:
            return False
        assert self.toggle is not None  # a task without a receptacle has a lamp
        return any(lamp.on and lamp.location == world.location for lamp in world.items_of(self.toggle))
