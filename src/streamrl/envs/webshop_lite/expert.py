"""Shoppers without privileges, a random policy, and an evaluation helper.

``Shopper`` reads only what a model sees (the instruction, the pages, the admissible actions):
it searches with the instruction's product phrase, clicks the best-matching affordable result,
rejects an item whose page lacks a goal option, checks the attributes in the title or the
features page, picks the goal options and buys; with few steps left it buys what it has.
``RandomShopper`` chooses uniformly among the admissible actions (searching with the instruction
when it picks ``search[...]``). ``evaluate`` plays a policy on a split and reports success and
mean score.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from streamrl.envs.webshop_lite.search import tokenize
from streamrl.envs.webshop_lite.text import SEARCH_PLACEHOLDER, SEP

_GOAL = re.compile(r"^(?P<body>.*?)(?: with (?P<options>.*?))?, and price lower than (?P<price>[\d.]+) dollars$")
_PRICE = re.compile(r"^\$([\d.]+)")


def parse_instruction(instruction: str) -> tuple[str, dict[str, str], float]:
    """(product phrase, {option: value}, price bound) from a WebShop-style instruction."""
    match = _GOAL.match(instruction.strip())
    if match is None:
        return instruction, {}, float("inf")
    options = {}
    for part in (match["options"] or "").split(", and "):
        name, _, value = part.partition(": ")
        if value:
            options[name.strip()] = value.strip()
    return match["body"], options, float(match["price"])


class Shopper:
    """The non-privileged shopper (see the module docstring). ``act`` takes the observation and info."""

    def __init__(self, max_steps: int = 15, pages: int = 2):
        self.max_steps = max_steps
        self.pages = pages
        self.reset("")

    def reset(self, instruction: str) -> None:
        self.instruction = instruction
        self.body, self.options, self.bound = parse_instruction(instruction) if instruction else ("", {}, 0.0)
        self.words = set(tokenize(self.body))
        self.attributes = [a.strip() for a in re.split(r",| and | that is ", self.body) if a.strip()]
        self.visited: set[str] = set()
        self.current: str | None = None
        self.checked = False
        self.best: str | None = None
        self.results_pages = 0

    def act(self, observation: str, info: dict[str, Any]) -> str:
        instruction = info.get("instruction") or ""
        if instruction and (instruction != self.instruction or info.get("step") == 0):
            self.reset(instruction)
        clickables = (info.get("available_actions") or {}).get("clickables") or []
        left = self.max_steps - int(info.get("step", 0))
        parts = observation.split(SEP)
        if clickables == ["search"]:
            return f"search[{self.body}]"
        if "buy now" in clickables:
            return self._item(parts, clickables, left)
        if "< prev" in clickables and "back to search" in clickables and not any(
            c.startswith("b0") for c in clickables
        ) and self.current is not None:  # a description / features / reviews page
            self.checked = all(a in observation.lower() for a in self._attribute_words())
            return "click[< prev]"
        return self._results(parts, clickables)

    def _attribute_words(self) -> list[str]:
        # the product phrase minus the type words: the attributes the goal asks for
        return [a for a in self.attributes if a]

    def _results(self, parts: list[str], clickables: list[str]) -> str:
        self.current, self.checked = None, False
        candidates = []
        for i, part in enumerate(parts):
            if part.lower() in clickables and part.lower().startswith("b0") and i + 2 < len(parts):
                title, price = parts[i + 1], _PRICE.match(parts[i + 2])
                cost = float(price.group(1)) if price else float("inf")
                overlap = len(self.words & set(tokenize(title)))
                candidates.append((cost <= self.bound, overlap, -i, part.lower()))
        fresh = [c for c in candidates if c[3] not in self.visited]
        if fresh:
            best = max(fresh)
            if best[0] or "next >" not in clickables or self.results_pages >= self.pages:
                self.current = best[3]
                self.visited.add(best[3])
                return f"click[{best[3]}]"
        if "next >" in clickables and self.results_pages < self.pages:
            self.results_pages += 1
            return "click[next >]"
        return "click[back to search]" if "back to search" in clickables else f"search[{self.body}]"

    def _item(self, parts: list[str], clickables: list[str], left: int) -> str:
        missing = [v for v in self.options.values() if v not in clickables]
        text = SEP.join(parts).lower()
        price = next((float(p[len("Price: $"):]) for p in parts if p.startswith("Price: $")), float("inf"))
        wanted = [v for v in self.options.values() if v in clickables]
        title_ok = all(a in text for a in self._attribute_words())
        acceptable = not missing and price <= self.bound
        if acceptable and not title_ok and not self.checked and left > len(wanted) + 3:
            self.checked = True  # look once
            return "click[features]"
        if acceptable and (title_ok or self.checked) or left <= len(wanted) + 1:
            chosen = getattr(self, "_chosen", {})
            for value in wanted:
                if chosen.get(self.current) is None or value not in chosen[self.current]:
                    chosen.setdefault(self.current, set()).add(value)
                    self._chosen = chosen
                    return f"click[{value}]"
            return "click[buy now]"
        return "click[< prev]"


class RandomShopper:
    """Uniform over the admissible actions; ``search[<your query>]`` searches with the instruction."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        action = self.rng.choice(info["admissible_actions"])
        return f"search[{info['instruction']}]" if action == SEARCH_PLACEHOLDER else action


def evaluate(env: Any, policy: Callable[[Any, str, dict[str, Any]], str], split: str = "test",
             limit: int | None = None) -> dict[str, float]:
    """Play ``policy(env, observation, info) -> action`` once on each task of ``split``."""
    won = score = 0.0
    task_ids = env.task_ids(split, limit=limit)
    for task_id in task_ids:
        observation, info = env.reset(task_id=task_id)
        while True:
            result = env.step(policy(env, observation, info))
            observation, info = result.observation, result.info
            if result.terminated or result.truncated:
                break
        won += info["won"]
        score += info["score"]
    return {"episodes": float(len(task_ids)), "success": won / len(task_ids), "score": score / len(task_ids)}
