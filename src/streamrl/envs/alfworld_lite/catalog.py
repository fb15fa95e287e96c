"""What the simulated household contains: receptacle and object kinds, affordances, the
``canContain`` table, the four room kinds and the six task types.

Names are ALFRED class names lowercased and run together (``sinkbasin``, ``desklamp``); the class
names themselves appear in ``gamefile`` ids, as in ALFWorld's folder names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# ---------------------------------------------------------------------------------------------
# Receptacles


@dataclass(frozen=True)
class ReceptacleKind:
    name: str
    class_name: str
    openable: bool


_RECEPTACLES = [
    ("armchair", "ArmChair", False),
    ("bathtubbasin", "BathtubBasin", False),
    ("bed", "Bed", False),
    ("cabinet", "Cabinet", True),
    ("coffeemachine", "CoffeeMachine", False),
    ("coffeetable", "CoffeeTable", False),
    ("countertop", "CounterTop", False),
    ("desk", "Desk", False),
    ("diningtable", "DiningTable", False),
    ("drawer", "Drawer", True),
    ("dresser", "Dresser", False),
    ("fridge", "Fridge", True),
    ("garbagecan", "GarbageCan", False),
    ("handtowelholder", "HandTowelHolder", False),
    ("laundryhamper", "LaundryHamper", False),
    ("microwave", "Microwave", True),
    ("ottoman", "Ottoman", False),
    ("safe", "Safe", True),
    ("shelf", "Shelf", False),
    ("sidetable", "SideTable", False),
    ("sinkbasin", "SinkBasin", False),
    ("sofa", "Sofa", False),
    ("stoveburner", "StoveBurner", False),
    ("toaster", "Toaster", False),
    ("toilet", "Toilet", False),
    ("toiletpaperhanger", "ToiletPaperHanger", False),
    ("towelholder", "TowelHolder", False),
    ("tvstand", "TVStand", False),
]
RECEPTACLES: dict[str, ReceptacleKind] = {name: ReceptacleKind(name, cls, op) for name, cls, op in _RECEPTACLES}

#: the appliance each treatment uses (heat/cool/clean do not need it open)
APPLIANCES = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}

# ---------------------------------------------------------------------------------------------
# Objects


@dataclass(frozen=True)
class ObjectKind:
    name: str
    class_name: str
    #: receptacle kinds that can contain it: canContain(recep, obj) <=> recep in homes
    homes: frozenset[str]
    pickupable: bool = True
    heatable: bool = False
    coolable: bool = False
    cleanable: bool = False
    toggleable: bool = False

    def can(self, treatment: str) -> bool:
        return {"heat": self.heatable, "cool": self.coolable, "clean": self.cleanable}[treatment]


_FOOD = "countertop diningtable fridge sinkbasin garbagecan microwave"
_DISHES = "countertop diningtable cabinet sinkbasin fridge microwave shelf"
_UTENSIL = "countertop diningtable drawer sinkbasin"
_SMALL = "desk dresser sidetable shelf drawer coffeetable diningtable"
_BATH = "countertop cabinet toilet bathtubbasin sinkbasin shelf drawer"


def _kind(name: str, cls: str, homes: str, flags: str = "") -> ObjectKind:
    unknown = set(homes.split()) - RECEPTACLES.keys()
    if unknown:
        raise ValueError(f"alfworld_lite catalog: {name} names unknown receptacle kinds {sorted(unknown)}")
    return ObjectKind(
        name,
        cls,
        frozenset(homes.split()),
        pickupable="t" not in flags,
        heatable="h" in flags,
        coolable="c" in flags,
        cleanable="k" in flags,
        toggleable="t" in flags,
    )


# flags: h heatable, c coolable, k cleanable, t toggleable lamp (not pickupable)
_OBJECTS = [
    _kind("apple", "Apple", _FOOD, "hck"),
    _kind("bread", "Bread", "countertop diningtable fridge cabinet microwave garbagecan", "hc"),
    _kind("egg", "Egg", _FOOD, "hck"),
    _kind("lettuce", "Lettuce", "countertop diningtable fridge sinkbasin garbagecan", "ck"),
    _kind("potato", "Potato", _FOOD, "hck"),
    _kind("tomato", "Tomato", _FOOD, "hck"),
    _kind("mug", "Mug", _DISHES + " coffeemachine desk sidetable", "hck"),
    _kind("cup", "Cup", _DISHES, "hck"),
    _kind("bowl", "Bowl", _DISHES + " coffeetable desk sidetable dresser", "ck"),
    _kind("plate", "Plate", _DISHES + " coffeetable sidetable dresser", "hck"),
    _kind("pan", "Pan", "countertop diningtable cabinet stoveburner fridge sinkbasin", "ck"),
    _kind("pot", "Pot", "countertop diningtable cabinet stoveburner fridge sinkbasin", "ck"),
    _kind("kettle", "Kettle", "countertop diningtable cabinet stoveburner sinkbasin", "k"),
    _kind("butterknife", "ButterKnife", _UTENSIL, "k"),
    _kind("knife", "Knife", _UTENSIL, "k"),
    _kind("fork", "Fork", _UTENSIL, "k"),
    _kind("spoon", "Spoon", _UTENSIL, "k"),
    _kind("ladle", "Ladle", _UTENSIL, "k"),
    _kind("spatula", "Spatula", _UTENSIL, "k"),
    _kind("dishsponge", "DishSponge", _BATH + " diningtable garbagecan", "k"),
    _kind("winebottle", "WineBottle", "countertop diningtable fridge cabinet shelf garbagecan", "c"),
    _kind("saltshaker", "SaltShaker", "countertop diningtable cabinet drawer shelf"),
    _kind("peppershaker", "PepperShaker", "countertop diningtable cabinet drawer shelf"),
    _kind("soapbottle", "SoapBottle", "countertop diningtable cabinet shelf toilet garbagecan bathtubbasin"),
    _kind("spraybottle", "SprayBottle", "countertop cabinet toilet shelf garbagecan dresser drawer"),
    _kind("alarmclock", "AlarmClock", "desk dresser sidetable shelf drawer"),
    _kind("book", "Book", _SMALL + " bed sofa armchair"),
    _kind("cd", "CD", _SMALL + " safe garbagecan"),
    _kind("cellphone", "CellPhone", _SMALL + " bed sofa armchair safe countertop"),
    _kind("creditcard", "CreditCard", _SMALL + " sofa armchair safe countertop"),
    _kind("keychain", "KeyChain", _SMALL + " sofa armchair safe"),
    _kind("laptop", "Laptop", "bed desk sofa armchair coffeetable diningtable dresser sidetable"),
    _kind("pen", "Pen", _SMALL + " garbagecan"),
    _kind("pencil", "Pencil", _SMALL + " garbagecan"),
    _kind("pillow", "Pillow", "bed sofa armchair ottoman"),
    _kind("remotecontrol", "RemoteControl", "sofa armchair coffeetable sidetable tvstand dresser drawer ottoman"),
    _kind("newspaper", "Newspaper", "sofa armchair coffeetable sidetable diningtable ottoman garbagecan dresser"),
    _kind("statue", "Statue", "coffeetable sidetable shelf dresser diningtable tvstand desk"),
    _kind("vase", "Vase", "coffeetable sidetable shelf dresser diningtable tvstand safe"),
    _kind("watch", "Watch", "coffeetable sidetable shelf dresser desk drawer safe tvstand"),
    _kind("tissuebox", "TissueBox", "coffeetable sidetable shelf dresser toilet countertop diningtable tvstand"),
    _kind("soapbar", "SoapBar", _BATH + " garbagecan", "k"),
    _kind("cloth", "Cloth", _BATH + " garbagecan laundryhamper dresser", "k"),
    _kind("toiletpaper", "ToiletPaper", "toiletpaperhanger toilet countertop cabinet shelf drawer garbagecan"),
    _kind("candle", "Candle", "countertop cabinet toilet shelf drawer bathtubbasin"),
    _kind("handtowel", "HandTowel", "handtowelholder countertop cabinet shelf"),
    _kind("towel", "Towel", "towelholder countertop bathtubbasin shelf"),
    _kind("desklamp", "DeskLamp", "desk sidetable dresser shelf", "t"),
    _kind("floorlamp", "FloorLamp", "sidetable dresser desk coffeetable", "t"),
]
OBJECTS: dict[str, ObjectKind] = {kind.name: kind for kind in _OBJECTS}
LAMPS = ("desklamp", "floorlamp")


def can_contain(receptacle_kind: str, object_kind: str) -> bool:
    return receptacle_kind in OBJECTS[object_kind].homes


# ---------------------------------------------------------------------------------------------
# Rooms


@dataclass(frozen=True)
class RoomKind:
    name: str
    #: ALFRED floor-plan numbers of this kind (kitchens 1-30, living rooms 201-230, ...)
    scenes: range
    #: receptacle kind -> (min count, max count, probability of being present at all)
    receptacles: dict[str, tuple[int, int, float]]
    #: pickupable object kinds found in this room
    objects: Sequence[str]
    task_types: tuple[str, ...]
    lamps: bool = False


ROOMS: dict[str, RoomKind] = {
    room.name: room
    for room in [
        RoomKind(
            "kitchen",
            range(1, 31),
            {
                "cabinet": (3, 12, 1.0),
                "countertop": (1, 3, 1.0),
                "drawer": (1, 6, 1.0),
                "fridge": (1, 1, 1.0),
                "garbagecan": (1, 1, 1.0),
                "microwave": (1, 1, 1.0),
                "sinkbasin": (1, 1, 1.0),
                "stoveburner": (2, 4, 1.0),
                "coffeemachine": (1, 1, 0.9),
                "toaster": (1, 1, 0.8),
                "diningtable": (1, 1, 0.6),
                "shelf": (1, 3, 0.4),
            },
            (
                "apple bread egg lettuce potato tomato mug cup bowl plate pan pot kettle butterknife knife "
                "fork spoon ladle spatula dishsponge winebottle saltshaker peppershaker soapbottle "
                "spraybottle creditcard cellphone"
            ).split(),
            (
                "pick_and_place_simple",
                "pick_clean_then_place_in_recep",
                "pick_heat_then_place_in_recep",
                "pick_cool_then_place_in_recep",
                "pick_two_obj_and_place",
            ),
        ),
        RoomKind(
            "livingroom",
            range(201, 231),
            {
                "garbagecan": (1, 1, 1.0),
                "sidetable": (1, 2, 1.0),
                "sofa": (1, 1, 1.0),
                "armchair": (1, 2, 0.6),
                "cabinet": (1, 4, 0.4),
                "coffeetable": (1, 1, 0.7),
                "diningtable": (1, 1, 0.4),
                "drawer": (1, 5, 0.5),
                "dresser": (1, 1, 0.4),
                "ottoman": (1, 1, 0.3),
                "safe": (1, 1, 0.3),
                "shelf": (1, 6, 0.6),
                "tvstand": (1, 1, 0.6),
            },
            (
                "book cellphone creditcard keychain laptop newspaper pillow remotecontrol statue vase watch "
                "tissuebox bowl plate pen pencil cd"
            ).split(),
            ("pick_and_place_simple", "look_at_obj_in_light", "pick_two_obj_and_place"),
            lamps=True,
        ),
        RoomKind(
            "bedroom",
            range(301, 331),
            {
                "bed": (1, 1, 1.0),
                "drawer": (2, 8, 1.0),
                "garbagecan": (1, 1, 1.0),
                "sidetable": (1, 2, 1.0),
                "armchair": (1, 1, 0.4),
                "desk": (1, 1, 0.7),
                "dresser": (1, 1, 0.7),
                "laundryhamper": (1, 1, 0.5),
                "safe": (1, 1, 0.3),
                "shelf": (1, 6, 0.6),
            },
            (
                "alarmclock book cd cellphone creditcard keychain laptop pen pencil pillow mug bowl cloth "
                "watch tissuebox vase statue"
            ).split(),
            ("pick_and_place_simple", "look_at_obj_in_light", "pick_two_obj_and_place"),
            lamps=True,
        ),
        RoomKind(
            "bathroom",
            range(401, 431),
            {
                "cabinet": (1, 4, 1.0),
                "countertop": (1, 1, 1.0),
                "garbagecan": (1, 1, 1.0),
                "sinkbasin": (1, 2, 1.0),
                "toilet": (1, 1, 1.0),
                "toiletpaperhanger": (1, 1, 1.0),
                "bathtubbasin": (1, 1, 0.6),
                "drawer": (1, 4, 0.5),
                "handtowelholder": (1, 2, 0.7),
                "shelf": (1, 3, 0.5),
                "towelholder": (1, 1, 0.7),
            },
            (
                "soapbar soapbottle spraybottle toiletpaper candle handtowel towel cloth dishsponge tissuebox"
            ).split(),
            ("pick_and_place_simple", "pick_clean_then_place_in_recep", "pick_two_obj_and_place"),
        ),
    ]
}


def room_of_scene(scene: int) -> RoomKind:
    for room in ROOMS.values():
        if scene in room.scenes:
            return room
    raise ValueError(f"alfworld_lite: no room kind has scene {scene}")


# ---------------------------------------------------------------------------------------------
# Task types (ids as ALFWorld's ``env.task_types``) and their goal templates


@dataclass(frozen=True)
class TaskType:
    id: int
    name: str
    #: two goal templates; {obj} and {recep} (or {toggle}) are lowercased kind names
    templates: tuple[str, str]
    #: the treatment the object needs before it is placed, if any
    treatment: str | None = None


TASK_TYPES: dict[str, TaskType] = {
    t.name: t
    for t in [
        TaskType(1, "pick_and_place_simple", ("put a {obj} in {recep}", "put some {obj} on {recep}")),
        TaskType(
            2,
            "look_at_obj_in_light",
            ("look at {obj} under the {toggle}", "examine the {obj} with the {toggle}"),
        ),
        TaskType(
            3,
            "pick_clean_then_place_in_recep",
            ("put a clean {obj} in {recep}", "clean some {obj} and put it in {recep}"),
            "clean",
        ),
        TaskType(
            4,
            "pick_heat_then_place_in_recep",
            ("put a hot {obj} in {recep}", "heat some {obj} and put it in {recep}"),
            "heat",
        ),
        TaskType(
            5,
            "pick_cool_then_place_in_recep",
            ("put a cool {obj} in {recep}", "cool some {obj} and put it in {recep}"),
            "cool",
        ),
        TaskType(6, "pick_two_obj_and_place", ("put two {obj} in {recep}", "find two {obj} and put them in {recep}")),
    ]
}
TASK_TYPE_BY_ID: dict[int, TaskType] = {t.id: t for t in TASK_TYPES.values()}


def resolve_task_type(value: str | int) -> TaskType:
    """A task type by name or ALFWorld id (1-6); raises ValueError naming the bad value."""
    if isinstance(value, int) and value in TASK_TYPE_BY_ID:
        return TASK_TYPE_BY_ID[value]
    if isinstance(value, str) and value in TASK_TYPES:
        return TASK_TYPES[value]
    raise ValueError(
        f"alfworld_lite: unknown task type {value!r} "
        f"(use an id 1-6 or one of: {', '.join(TASK_TYPES)})"
    )
