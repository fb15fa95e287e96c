"""The exact observation strings of ALFWorld's TextWorld side (data >= 2.1.2, alfworld >= 0.4),
plus the legacy (data 2.1.1, alfworld <= 0.3) variants that differ."""

from __future__ import annotations

from streamrl.envs.alfworld_lite.world import Item, Receptacle, World, name_key

WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
TASK_PREFIX = "Your task is to: "
NOTHING_HAPPENS = "Nothing happens."

HELP = "\n".join(
    [
        "Available commands:",
        "  look:                             look around you",
        "  inventory:                        check what you are carrying",
        "  go to (receptacle):               move to a receptacle",
        "  open (receptacle):                open a receptacle",
        "  close (receptacle):               close a receptacle",
        "  take (object) from (receptacle):  pick up an object from a receptacle",
        "  move (object) to (receptacle):    place the object you carry in or on a receptacle",
        "  examine (something):              look closely at an object or a receptacle",
        "  use (object):                     turn on a lamp",
        "  heat (object) with (receptacle):  heat an object with a microwave",
        "  clean (object) with (receptacle): clean an object with a sink basin",
        "  cool (object) with (receptacle):  cool an object with a fridge",
    ]
)


def render_list(names: list[str]) -> str:
    """``a apple 1, a bread 2, and a cup 1``; ``nothing`` when empty (the article is always "a")."""
    phrases = [f"a {name}" for name in names]
    if not phrases:
        return "nothing"
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + ", and " + phrases[-1]


def room_listing_order(world: World) -> list[str]:
    """Receptacles as ALFWorld lists them: kinds alphabetically, numbers descending."""
    return sorted(world.receptacles, key=lambda name: (name_key(name)[0], -name_key(name)[1]))


def middle_of_room(world: World) -> str:
    listing = render_list(room_listing_order(world))
    return f"You are in the middle of a room. Looking quickly around you, you see {listing}."


def initial_observation(world: World, goal: str) -> str:
    return f"{WELCOME}\n\n{middle_of_room(world)}\n\n{TASK_PREFIX}{goal}."


def receptacle_view(receptacle: Receptacle) -> str:
    name = receptacle.name
    contents = render_list(sorted(receptacle.contents, key=name_key))
    if not receptacle.openable:
        return f"On the {name}, you see {contents}."
    if not receptacle.is_open:
        return f"The {name} is closed."
    return f"The {name} is open. In it, you see {contents}."


def arrive(receptacle: Receptacle, legacy: bool) -> str:
    where = f"loc {receptacle.loc}" if legacy else receptacle.name
    return f"You arrive at {where}. {receptacle_view(receptacle)}"


def look(world: World) -> str:
    if world.location is None:
        return middle_of_room(world)
    return f"You are facing the {world.location}. Next to it, you see nothing."


def inventory(world: World) -> str:
    if world.held is None:
        return "You are not carrying anything."
    return f"You are carrying: a {world.held}."


def examine_item(item: Item) -> str:
    name = item.name
    temperature = "hot" if item.hot else "cold" if item.cool else None
    if temperature and item.clean:
        return f"This is a {temperature} and clean {name}."
    if temperature:
        return f"This is a {temperature} {name}."
    if item.clean:
        return f"This is a clean {name}."
    if item.on:
        return f"This {name} is on."
    return f"There's nothing special about {name}."


def placed(item: str, receptacle: str, legacy: bool) -> str:
    if legacy:
        return f"You put the {item} in/on the {receptacle}."
    return f"You move the {item} to the {receptacle}."
