"""The mutable state of one household: where the agent is, what it holds, which receptacles are
open and what they contain, and each object's hot / cool / clean / on flags."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


def name_key(name: str) -> tuple[str, int]:
    """Sort key for ``"cabinet 10"``-style names: kind, then number as an integer."""
    kind, _, number = name.rpartition(" ")
    return kind, int(number)


def kind_of(name: str) -> str:
    return name.rpartition(" ")[0]


@dataclass(slots=True)
class Receptacle:
    name: str  # "cabinet 3"
    kind: str  # "cabinet"
    openable: bool
    is_open: bool = False
    contents: list[str] = field(default_factory=list)  # item names
    loc: int = 0  # the legacy grammar's "loc N"

    def visible(self) -> bool:
        """Whether its contents can be seen (and taken)."""
        return self.is_open or not self.openable


@dataclass(slots=True)
class Item:
    name: str  # "apple 2"
    kind: str  # "apple"
    location: str | None  # receptacle name; None while held
    origin: str  # the receptacle it started in (ALFRED's wasInReceptacle)
    hot: bool = False
    cool: bool = False
    clean: bool = False
    on: bool = False  # lamps only; ``use`` sets it and nothing clears it


@dataclass(slots=True)
class World:
    receptacles: dict[str, Receptacle]
    items: dict[str, Item]
    location: str | None = None  # None = the middle of the room
    held: str | None = None

    def copy(self) -> World:
        return World(
            {
                name: Receptacle(r.name, r.kind, r.openable, r.is_open, list(r.contents), r.loc)
                for name, r in self.receptacles.items()
            },
            {
                name: Item(i.name, i.kind, i.location, i.origin, i.hot, i.cool, i.clean, i.on)
                for name, i in self.items.items()
            },
            self.location,
            self.held,
        )

    def items_of(self, kind: str) -> list[Item]:
        return [item for item in self.items.values() if item.kind == kind]

    def receptacles_of(self, kind: str) -> list[Receptacle]:
        return [r for r in self.receptacles.values() if r.kind == kind]

    def canonical(self) -> str:
        """Every state variable in a fixed order: equal strings <=> equal states."""
        parts = [f"at={self.location}", f"held={self.held}"]
        for r in sorted(self.receptacles.values(), key=lambda r: name_key(r.name)):
            contents = ",".join(sorted(r.contents, key=name_key))
            parts.append(f"{r.name}:{'o' if r.is_open else 'c'}:{contents}")
        for i in sorted(self.items.values(), key=lambda i: name_key(i.name)):
            flags = "".join(f for f, on in zip("hckl", (i.hot, i.cool, i.clean, i.on), strict=True) if on)
            if flags:
                parts.append(f"{i.name}:{flags}")
        return ";".join(parts)

    def digest(self) -> str:
        return hashlib.blake2b(self.canonical().encode(), digest_size=10).hexdigest()
