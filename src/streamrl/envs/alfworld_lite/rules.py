"""The command grammar: parsing, which commands are admissible in a state, and their effects.

A command is a tuple ``(verb, *names)``: ``("goto", r)``, ``("open", r)``, ``("close", r)``,
``("take", o, r)``, ``("move", o, r)``, ``("heat" | "cool" | "clean", o, r)``, ``("use", o)``,
``("examine", x)``, ``("inventory",)``, ``("look",)``, ``("help",)``.

Admissibility is the single source of truth: ``step`` executes a command only if it is in
``admissible_commands``; everything else is ``Nothing happens.`` with the state unchanged.
Both put forms parse in either grammar (``move o to r`` and ``put o in/on r``, also ``put o in r``
/ ``put o on r``); the admissible list prints only the active grammar's form, and ``help`` exists
only in ``v2``.
"""

from __future__ import annotations

import re

from streamrl.envs.alfworld_lite import text
from streamrl.envs.alfworld_lite.catalog import APPLIANCES, OBJECTS, can_contain
from streamrl.envs.alfworld_lite.world import World

Command = tuple[str, ...]
GRAMMARS = ("v2", "legacy")

_NAME = r"([a-z]+ \d+)"
_PATTERNS: dict[str, list[tuple[re.Pattern[str], str]]] = {
    "go": [(re.compile(rf"go to {_NAME}"), "goto")],
    "open": [(re.compile(rf"open {_NAME}"), "open")],
    "close": [(re.compile(rf"close {_NAME}"), "close")],
    "take": [(re.compile(rf"take {_NAME} from {_NAME}"), "take")],
    "move": [(re.compile(rf"move {_NAME} to {_NAME}"), "move")],
    "put": [(re.compile(rf"put {_NAME} (?:in/on|in|on) {_NAME}"), "move")],
    "heat": [(re.compile(rf"heat {_NAME} with {_NAME}"), "heat")],
    "cool": [(re.compile(rf"cool {_NAME} with {_NAME}"), "cool")],
    "clean": [(re.compile(rf"clean {_NAME} with {_NAME}"), "clean")],
    "use": [(re.compile(rf"use {_NAME}"), "use")],
    "examine": [(re.compile(rf"examine {_NAME}"), "examine")],
}
_BARE = {"inventory", "look", "help"}


def normalize(command: str) -> str:
    return " ".join(command.lower().split())


def parse_command(command: str) -> Command | None:
    """Text -> command tuple, or None when it matches no template (either grammar)."""
    normalized = normalize(command)
    if normalized in _BARE:
        return (normalized,)
    for pattern, verb in _PATTERNS.get(normalized.partition(" ")[0], ()):
        match = pattern.fullmatch(normalized)
        if match:
            return (verb, *match.groups())
    return None


def render_command(command: Command, grammar: str) -> str:
    verb, *names = command
    if verb == "goto":
        return f"go to {names[0]}"
    if verb == "take":
        return f"take {names[0]} from {names[1]}"
    if verb == "move":
        if grammar == "legacy":
            return f"put {names[0]} in/on {names[1]}"
        return f"move {names[0]} to {names[1]}"
    if verb in APPLIANCES:
        return f"{verb} {names[0]} with {names[1]}"
    return " ".join(command)


def admissible_commands(world: World, grammar: str) -> list[Command]:
    """Every command whose precondition holds now (unordered)."""
    commands: list[Command] = [("goto", name) for name in world.receptacles]
    commands += [("inventory",), ("look",)]
    if grammar == "v2":
        commands.append(("help",))
    held = world.items[world.held] if world.held is not None else None
    if held is not None:
        commands.append(("examine", held.name))
    here = world.receptacles.get(world.location) if world.location is not None else None
    if here is None:
        return commands
    commands.append(("examine", here.name))
    if here.openable:
        commands.append(("close" if here.is_open else "open", here.name))
    if here.visible():
        for name in here.contents:
            kind = OBJECTS[world.items[name].kind]
            commands.append(("examine", name))
            if kind.toggleable:
                commands.append(("use", name))
            elif held is None:
                commands.append(("take", name, here.name))
    if held is not None:
        if here.visible() and can_contain(here.kind, held.kind):
            commands.append(("move", held.name, here.name))
        for treatment, appliance in APPLIANCES.items():
            if here.kind == appliance and OBJECTS[held.kind].can(treatment):
                commands.append((treatment, held.name, here.name))
    return commands


def apply_command(world: World, command: Command, grammar: str) -> str:
    """Execute an admissible command in place and return its feedback text."""
    verb, *names = command
    legacy = grammar == "legacy"
    if verb == "goto":
        world.location = names[0]
        return text.arrive(world.receptacles[names[0]], legacy)
    if verb == "open":
        opened = world.receptacles[names[0]]
        opened.is_open = True
        return f"You open the {opened.name}. {text.receptacle_view(opened)}"
    if verb == "close":
        world.receptacles[names[0]].is_open = False
        return f"You close the {names[0]}."
    if verb == "take":
        item, receptacle = names
        world.receptacles[receptacle].contents.remove(item)
        world.items[item].location = None
        world.held = item
        return f"You pick up the {item} from the {receptacle}."
    if verb == "move":
        item, receptacle = names
        world.receptacles[receptacle].contents.append(item)
        world.items[item].location = receptacle
        world.held = None
        return text.placed(item, receptacle, legacy)
    if verb in APPLIANCES:
        treated = world.items[names[0]]
        if verb == "heat":
            treated.hot, treated.cool = True, False
        elif verb == "cool":
            treated.hot, treated.cool = False, True
        else:
            treated.clean = True
        return f"You {verb} the {treated.name} using the {names[1]}."
    if verb == "use":
        world.items[names[0]].on = True
        return f"You turn on the {names[0]}."
    if verb == "examine":
        if names[0] in world.receptacles:
            return text.receptacle_view(world.receptacles[names[0]])
        return text.examine_item(world.items[names[0]])
    if verb == "inventory":
        return text.inventory(world)
    if verb == "look":
        return text.look(world)
    if verb == "help":
        return text.HELP
    raise ValueError(f"alfworld_lite: unknown command verb {verb!r}")
