"""Goals written like WebShop's synthetic ones, and the fixed splits.

One goal per product: 1-3 of its attributes, a full option assignment (one value per option
group) and ``price_upper`` by WebShop's rule (the larger of two draws from the next four
multiples of 10 above the price). After a seeded shuffle the first 500 goals are ``test`` (the
size of WebShop's test set), the next 1,000 ``eval`` and the rest ``train``: the three splits
share no goal and no target product.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from streamrl.envs.webshop_lite.catalog import DEFAULT_SEED, build_catalog
from streamrl.envs.webshop_lite.reward import PRICE_RANGE

TEST_SIZE = 500
EVAL_SIZE = 1000
_LEADS = ("i need", "i'm looking for", "i want", "find me", "i would like", "i am looking for")


def _attribute_text(attributes: list[str]) -> str:
    if len(attributes) == 1:
        return attributes[0]
    return ", ".join(attributes[:-1]) + " and " + attributes[-1]


def _instruction(rng: random.Random, product: dict[str, Any], attributes: list[str], options: dict[str, str],
                 price_upper: float) -> str:
    lead = rng.choice(_LEADS)
    kind = product["query"]
    attrs = _attribute_text(attributes)
    template = rng.randrange(3)
    if template == 0:
        body = f"{lead} a {attrs} {kind}"
    elif template == 1:
        body = f"{lead} a {kind} that is {attrs}"
    else:
        body = f"{lead} {attrs} {kind}"
    option_text = ", and ".join(f"{k}: {v}" for k, v in options.items())
    option_text = f" with {option_text}" if option_text else ""
    return f"{body}{option_text}, and price lower than {price_upper:.2f} dollars"


def _price_upper(rng: random.Random, price: float) -> float:
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return 1000000.0
    return sorted(rng.sample(candidates, 2))[1]


def _goal(product: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    attributes = sorted(rng.sample(product["Attributes"], rng.randint(1, min(3, len(product["Attributes"])))))
    options = {name: rng.choice(values) for name, values in sorted(product["options"].items())}
    price_upper = _price_upper(rng, product["price"])
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["Title"],
        "product_category": product["product_category"],
        "instruction_text": _instruction(rng, product, attributes, options, price_upper),
        "attributes": attributes,
        "goal_options": options,
        "price_upper": price_upper,
    }


@dataclass(frozen=True)
class Goals:
    splits: dict[str, tuple[dict[str, Any], ...]]

    def digest(self) -> str:
        h = hashlib.sha256()
        for split in sorted(self.splits):
            for goal in self.splits[split]:
                h.update(repr((split, sorted(goal.items()))).encode())
        return h.hexdigest()

    def sizes(self) -> dict[str, int | None]:
        return {split: len(goals) for split, goals in self.splits.items()}


@lru_cache(maxsize=4)
def build_goals(seed: int = DEFAULT_SEED) -> Goals:
    catalog = build_catalog(seed)
    rng = random.Random(f"webshop_lite/goals/{seed}")
    goals = [_goal(product, rng) for product in catalog.products]
    random.Random(233 + seed).shuffle(goals)  # WebShop shuffles its goals with random.seed(233)
    return Goals({
        "train": tuple(goals[TEST_SIZE + EVAL_SIZE :]),
        "eval": tuple(goals[TEST_SIZE : TEST_SIZE + EVAL_SIZE]),
        "test": tuple(goals[:TEST_SIZE]),
    })
