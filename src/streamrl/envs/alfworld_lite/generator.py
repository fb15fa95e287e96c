"""Task generation: task id -> (task type -> scene layout -> targets -> placements) -> a solvable
episode.

Everything random comes from ``random.Random`` seeded with a SHA-256 of a string (the task id,
the scene number), so a task id means the same household on every run and platform.

Splits (mirroring ALFWorld's train / valid_seen / valid_unseen):

* ``unseen`` (134 tasks) uses only the held-out scenes ``UNSEEN_SCENES``, which no other split
  uses, and may use the held-out (object, target) kind pairs (``is_held_out_pair``);
* ``seen`` (140 tasks) and ``train`` (unbounded) use the other scenes and never a held-out pair;
* a train task never repeats a seen task's (scene, task type, object kind, target kind) key.

Difficulty knobs (``GeneratorConfig``) apply to the train split only by default; the eval splits
use the defaults, so their content (and ``EVAL_FINGERPRINTS``) never depends on a training setup.
``generate(..., eval_config=True)`` builds the eval splits under the given knobs instead (the same
held-out scenes and pairs, at that difficulty): a different, equally fixed set, for small models.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from functools import cache

from streamrl.envs.alfworld_lite.catalog import (
    APPLIANCES,
    LAMPS,
    OBJECTS,
    RECEPTACLES,
    ROOMS,
    TASK_TYPES,
    RoomKind,
    TaskType,
    can_contain,
    room_of_scene,
)
from streamrl.envs.alfworld_lite.expert import expert_commands
from streamrl.envs.alfworld_lite.task import Task
from streamrl.envs.alfworld_lite.world import Item, Receptacle, World

SPLITS: dict[str, int | None] = {"train": None, "seen": 140, "unseen": 134}
#: two floor plans per room kind; ALFWorld's valid_unseen used 10, 219, 308 and 424
UNSEEN_SCENES = frozenset({10, 26, 219, 227, 308, 321, 413, 424})
#: SHA-256 over each eval split's tasks (see ``fingerprint``); a change means the sets changed
EVAL_FINGERPRINTS = {
    "seen": "1ba7ad0453e51d4c1df6636c070c35575232bdf7295ff428494858eede31fdd0",
    "unseen": "47acb2eb3371a41429b865ce44ff16cd7ec7126f6627f76c17daa2c7377741b8",
}
_MAX_ATTEMPTS = 200
_MAX_EXPERT_STEPS = 30  # well under the 50-step cap, so the expert always has slack


@dataclass(frozen=True)
class GeneratorConfig:
    """Difficulty knobs for train tasks.

    ``hidden_prob``: chance each target object starts inside a closed receptacle (when the room
    has one that can hold it). ``distractors``: (min, max) number of other objects. ``max_receptacles``:
    cap on receptacles per room (best effort: receptacles the task needs are kept). ``task_types``:
    the task type names to draw from.
    """

    hidden_prob: float = 0.5
    distractors: tuple[int, int] = (5, 12)
    max_receptacles: int | None = None
    task_types: tuple[str, ...] = field(default_factory=lambda: tuple(TASK_TYPES))

    def __post_init__(self) -> None:
        if not 0.0 <= self.hidden_prob <= 1.0:
            raise ValueError(f"alfworld_lite: hidden_prob must be in [0, 1], got {self.hidden_prob}")
        low, high = self.distractors
        if not 0 <= low <= high:
            raise ValueError(
                f"alfworld_lite: distractors must be (min, max) with 0 <= min <= max, got {self.distractors}"
            )
        if self.max_receptacles is not None and self.max_receptacles < 3:
            raise ValueError(f"alfworld_lite: max_receptacles must be >= 3 or None, got {self.max_receptacles}")
        if not self.task_types:
            raise ValueError("alfworld_lite: task_types must name at least one task type")
        unknown = [t for t in self.task_types if t not in TASK_TYPES]
        if unknown:
            raise ValueError(f"alfworld_lite: unknown task types {unknown} (known: {', '.join(TASK_TYPES)})")


DEFAULT_CONFIG = GeneratorConfig()


@dataclass
class Episode:
    """A generated task and its initial world (``world`` is shared: copy it before mutating)."""

    task_id: str
    scene: int
    task: Task
    world: World

    @property
    def gamefile(self) -> str:
        """A synthetic ALFWorld-style game path, so per-type success can be counted by substring."""
        return f"lite/{self.task.gamefile_stem(self.scene)}/{self.task_id.replace('/', '_')}"

    @property
    def key(self) -> tuple[int, str, str, str]:
        """(scene, task type, object kind, target kind): what must not repeat across splits."""
        return self.scene, self.task.type.name, self.task.obj, self.task.target


def parse_task_id(task_id: str) -> tuple[str, int]:
    """``"unseen/3"`` -> ``("unseen", 3)``; raises ValueError naming the problem."""
    split, _, index = task_id.partition("/")
    if split not in SPLITS or not index.isdigit():
        raise ValueError(
            f"alfworld_lite: bad task_id {task_id!r} (expected '<split>/<n>' with split in {', '.join(SPLITS)})"
        )
    size = SPLITS[split]
    if size is not None and int(index) >= size:
        raise ValueError(f"alfworld_lite: task_id {task_id!r} out of range (split {split!r} has {size} tasks)")
    return split, int(index)


def _rng(text: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big"))


def is_held_out_pair(obj: str, target: str) -> bool:
    """About one (object kind, target kind) pair in ten is reserved for the unseen split."""
    return hashlib.sha256(f"alfworld_lite/pair/{obj}/{target}".encode()).digest()[0] < 26


@cache
def scene_layout(scene: int) -> tuple[tuple[str, int], ...]:
    """The receptacle slots (kind, index from 0) of a floor plan; fixed per scene."""
    room = room_of_scene(scene)
    rng = _rng(f"alfworld_lite/layout/{scene}")
    slots = []
    for kind, (low, high, presence) in room.receptacles.items():
        if rng.random() < presence:
            slots += [(kind, i) for i in range(rng.randint(low, high))]
    return tuple(slots)


def generate(task_id: str, config: GeneratorConfig = DEFAULT_CONFIG, eval_config: bool = False) -> Episode:
    """The episode of ``task_id``; eval ids ignore ``config`` unless ``eval_config`` (module docstring)."""
    split, index = parse_task_id(task_id)
    if split != "train":
        return _eval_split(split, config if eval_config else DEFAULT_CONFIG)[index]
    seen = _seen_keys()
    for attempt in range(_MAX_ATTEMPTS):
        episode = _attempt(task_id, f"{task_id}#{attempt}", split, config)
        if episode is not None and episode.key not in seen:
            return episode
    raise RuntimeError(f"alfworld_lite: no solvable task for {task_id!r} in {_MAX_ATTEMPTS} attempts (config {config})")


@cache
def _eval_split(split: str, config: GeneratorConfig = DEFAULT_CONFIG) -> tuple[Episode, ...]:
    """All tasks of an eval split, generated in order with distinct keys."""
    episodes: list[Episode] = []
    keys: set[tuple[int, str, str, str]] = set()
    size = SPLITS[split]
    assert size is not None, f"{split!r} is not an eval split"
    for index in range(size):
        task_id = f"{split}/{index}"
        for attempt in range(_MAX_ATTEMPTS):
            episode = _attempt(task_id, f"{task_id}#{attempt}", split, config)
            if episode is not None and episode.key not in keys:
                keys.add(episode.key)
                episodes.append(episode)
                break
        else:
            raise RuntimeError(f"alfworld_lite: could not generate {task_id!r}")
    return tuple(episodes)


@cache
def _seen_keys() -> frozenset[tuple[int, str, str, str]]:
    return frozenset(episode.key for episode in _eval_split("seen"))


def fingerprint(split: str) -> str:
    """SHA-256 over an eval split's task ids, gamefiles, goals and initial world states."""
    digest = hashlib.sha256()
    for episode in _eval_split(split):
        line = f"{episode.task_id}\t{episode.gamefile}\t{episode.task.goal}\t{episode.world.canonical()}\n"
        digest.update(line.encode())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------


def _attempt(task_id: str, seed_text: str, split: str, config: GeneratorConfig) -> Episode | None:
    """One try at building a task; None when the draw does not work out (the caller retries)."""
    rng = _rng(f"alfworld_lite/{seed_text}")
    task_type = TASK_TYPES[rng.choice(config.task_types)]
    scenes = [
        scene
        for room in ROOMS.values()
        if task_type.name in room.task_types
        for scene in room.scenes
        if (scene in UNSEEN_SCENES) == (split == "unseen")
    ]
    scene = rng.choice(scenes)
    room = room_of_scene(scene)
    slots = list(scene_layout(scene))
    task = _choose_task(rng, task_type, room, {kind for kind, _ in slots}, allow_held_out=split == "unseen")
    if task is None:
        return None

    contents: dict[tuple[str, int], list[str]] = {slot: [] for slot in slots}
    if not _place_targets(rng, task, slots, contents, config.hidden_prob):
        return None
    if config.max_receptacles is not None:
        slots = _trim(slots, contents, task, config.max_receptacles)
    _place_distractors(rng, task, room, slots, contents, config.distractors)

    world = _build_world(rng, slots, contents)
    if task.satisfied(world) or len(expert_commands(world, task)) > _MAX_EXPERT_STEPS:
        return None
    return Episode(task_id, scene, task, world)


def _choose_task(
    rng: random.Random, task_type: TaskType, room: RoomKind, kinds: set[str], allow_held_out: bool
) -> Task | None:
    treatment = task_type.treatment
    pairs = []
    for obj in room.objects:
        kind = OBJECTS[obj]
        if treatment is not None and not kind.can(treatment):
            continue
        if task_type.name == "look_at_obj_in_light":
            targets = [lamp for lamp in LAMPS if OBJECTS[lamp].homes & kinds]
        else:
            targets = sorted(kind.homes & kinds - {APPLIANCES.get(treatment or "")})
        for target in targets:
            # the object must be able to start somewhere other than its destination
            if not (kind.homes & kinds) - {target}:
                continue
            if allow_held_out or not is_held_out_pair(obj, target):
                pairs.append((obj, target))
    if not pairs:
        return None
    obj, target = rng.choice(pairs)
    template = rng.randrange(2)
    if task_type.name == "look_at_obj_in_light":
        return Task(task_type, obj, None, target, template)
    return Task(task_type, obj, target, None, template)


def _place_targets(
    rng: random.Random,
    task: Task,
    slots: list[tuple[str, int]],
    contents: dict[tuple[str, int], list[str]],
    hidden_prob: float,
) -> bool:
    """Place the target object(s), and for look tasks the lamp; False if impossible."""
    if task.toggle is not None:
        lamp_slots = [slot for slot in slots if can_contain(slot[0], task.toggle)]
        contents[rng.choice(lamp_slots)].append(task.toggle)
    count = rng.choice((2, 2, 3)) if task.type.name == "pick_two_obj_and_place" else rng.choice((1, 1, 2))
    homes = [slot for slot in slots if can_contain(slot[0], task.obj) and slot[0] != task.recep]
    if not homes:
        return False
    closed = [slot for slot in homes if RECEPTACLES[slot[0]].openable]
    open_ = [slot for slot in homes if not RECEPTACLES[slot[0]].openable]
    for _ in range(count):
        hide = bool(closed) and (rng.random() < hidden_prob or not open_)
        contents[rng.choice(closed if hide else open_)].append(task.obj)
    return True


def _trim(
    slots: list[tuple[str, int]],
    contents: dict[tuple[str, int], list[str]],
    task: Task,
    limit: int,
) -> list[tuple[str, int]]:
    """Drop receptacles (highest-numbered of the most numerous kind first) down to ``limit``,
    keeping every one that holds a target and one of each kind the task needs."""
    needed = {task.recep, APPLIANCES.get(task.type.treatment or "")} - {None}
    slots = list(slots)
    while len(slots) > limit:
        counts: dict[str, int] = {}
        for kind, _ in slots:
            counts[kind] = counts.get(kind, 0) + 1
        droppable = [
            slot
            for slot in slots
            if not contents[slot] and not (slot[0] in needed and counts[slot[0]] == 1)
        ]
        if not droppable:
            break
        slots.remove(max(droppable, key=lambda slot: (counts[slot[0]], slot[1], slot[0])))
    return slots


def _place_distractors(
    rng: random.Random,
    task: Task,
    room: RoomKind,
    slots: list[tuple[str, int]],
    contents: dict[tuple[str, int], list[str]],
    distractors: tuple[int, int],
) -> None:
    kinds = {kind for kind, _ in slots}
    if room.lamps:
        for lamp in LAMPS:
            if lamp != task.toggle and rng.random() < 0.4:
                homes = [slot for slot in slots if can_contain(slot[0], lamp)]
                if homes:
                    contents[rng.choice(homes)].append(lamp)
    candidates = [obj for obj in room.objects if obj != task.obj and OBJECTS[obj].homes & kinds]
    for _ in range(rng.randint(*distractors)):
        # never the target's kind, so no distractor can make the goal hold at the start
        obj = rng.choice(candidates)
        contents[rng.choice([slot for slot in slots if can_contain(slot[0], obj)])].append(obj)


def _build_world(
    rng: random.Random,
    slots: list[tuple[str, int]],
    contents: dict[tuple[str, int], list[str]],
) -> World:
    """Name everything (kinds numbered from 1) and assemble the world; all openables closed."""
    slot_names: dict[tuple[str, int], str] = {}
    numbering: dict[str, int] = {}
    for slot in sorted(slots):
        numbering[slot[0]] = numbering.get(slot[0], 0) + 1
        slot_names[slot] = f"{slot[0]} {numbering[slot[0]]}"
    locs = list(range(1, len(slots) + 1))
    rng.shuffle(locs)
    receptacles: dict[str, Receptacle] = {}
    items: dict[str, Item] = {}
    item_numbers: dict[str, int] = {}
    for slot, loc in zip(sorted(slots), locs, strict=True):
        name = slot_names[slot]
        receptacle = Receptacle(name, slot[0], RECEPTACLES[slot[0]].openable, loc=loc)
        for kind in contents[slot]:
            item_numbers[kind] = item_numbers.get(kind, 0) + 1
            item_name = f"{kind} {item_numbers[kind]}"
            items[item_name] = Item(item_name, kind, name, name)
            receptacle.contents.append(item_name)
        receptacles[name] = receptacle
    return World(receptacles, items)
