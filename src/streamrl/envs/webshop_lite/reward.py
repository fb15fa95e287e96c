"""WebShop's purchase reward (``web_agent_site/engine/goal.py``), without spaCy or thefuzz.

    r = r_type * (n_att_match + n_opt_match + 1[price <= price_upper]) / (|U_att| + |U_opt| + 1)

* attributes: a goal attribute matches when ``token_set_ratio > 85`` against one of the product's
  attributes, or when it is a substring of the title, bullet points or description;
* options: each *purchased* option matches by exact value for ``size`` and by
  ``token_set_ratio > 85`` otherwise (after colour normalisation), or by substring of the text;
* ``r_type`` from the query match, the breadcrumb overlap (>= 2 levels) and the noun overlap of
  the titles, with WebShop's thresholds (1, 0.5, 0.1, 0). Nouns come from a word filter instead of
  spaCy's tagger: the title's words minus function words and the modifiers the catalogue uses.

``token_set_ratio`` is rapidfuzz's when that package is installed, else an exact pure-Python
equivalent (indel similarity on sorted token sets, rounded like thefuzz).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from streamrl.envs.webshop_lite.catalog import product_text

EXACT_MATCH_OPTS = ("size",)
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
FUZZ_THRESHOLD = 85

_NON_ALNUM = re.compile(r"[^0-9a-z]+")
_FUNCTION_WORDS = {
    "a", "an", "and", "or", "the", "with", "for", "of", "in", "on", "to", "by", "from", "men", "women", "kids",
}
# modifiers: adjectives and participles the catalogue writes into titles (spaCy would not tag them NOUN)
_MODIFIERS = {
    "free", "long", "short", "slim", "relaxed", "quick", "drying", "wicking", "high", "low", "non", "soft",
    "loose", "wide", "easy", "natural", "fast", "compact", "heavy", "solid", "mid", "super", "resistant",
    "lightweight", "adjustable", "waterproof", "long", "lasting", "cruelty", "highly", "pigmented", "vegan",
    "sensitive", "oil", "anti", "aging", "tested", "dry", "damaged", "safe", "built", "foldable", "ergonomic",
    "wireless", "mechanical", "gaming", "sports", "ear", "over", "plug", "play", "elastic", "hand", "tummy",
    "friendly", "individually", "wrapped", "organic", "usda", "fair", "zero", "plant", "based", "certified",
    "added", "no", "soft", "close", "lockable", "fade", "upholstered", "foaming", "mineral", "liquid",
    "sparkling", "hot", "green", "herbal", "ground", "flip", "penny", "canvas", "stud", "charm", "stacking",
    "pendant", "bone", "detangling", "universal", "gold", "plated", "tempered", "scratch", "bubble", "noise",
    "cancelling", "sweat", "moisture", "breathable", "slip", "lace", "up", "arch", "memory", "rubber",
    "stainless", "tarnish", "nickel", "hypoallergenic", "rgb", "backlit", "aluminum", "alloy", "shockproof",
}


def _process(text: str) -> str:
    return _NON_ALNUM.sub(" ", text.lower()).strip()


def _lcs(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for ca in a:
        current = [0]
        for j, cb in enumerate(b, 1):
            current.append(previous[j - 1] + 1 if ca == cb else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def _ratio(a: str, b: str) -> float:
    total = len(a) + len(b)
    return 100.0 * 2 * _lcs(a, b) / total if total else 100.0


@lru_cache(maxsize=65536)
def _token_set_ratio_py(s1: str, s2: str) -> int:
    tokens_a, tokens_b = set(_process(s1).split()), set(_process(s2).split())
    if not tokens_a or not tokens_b:
        return 0
    inter = tokens_a & tokens_b
    diff_ab, diff_ba = tokens_a - tokens_b, tokens_b - tokens_a
    if inter and (not diff_ab or not diff_ba):
        return 100
    sect = " ".join(sorted(inter))
    ab = " ".join(sorted(diff_ab))
    ba = " ".join(sorted(diff_ba))
    combined_ab = f"{sect} {ab}".strip()
    combined_ba = f"{sect} {ba}".strip()
    scores = [_ratio(combined_ab, combined_ba)]
    if sect:
        scores += [_ratio(sect, combined_ab), _ratio(sect, combined_ba)]
    return int(round(max(scores)))


try:  # the same scorer, faster
    from rapidfuzz import fuzz as _rapidfuzz  # type: ignore[import-not-found]
    from rapidfuzz.utils import default_process as _default_process  # type: ignore[import-not-found]

    def token_set_ratio(s1: str, s2: str) -> int:
        return int(round(_rapidfuzz.token_set_ratio(s1, s2, processor=_default_process)))
except ImportError:  # pragma: no cover - depends on the environment
    token_set_ratio = _token_set_ratio_py


def normalize_color(value: str) -> str:
    """WebShop maps colour names onto base colours; the catalogue's colours are already base names."""
    return value.strip().lower()


def title_nouns(title: str) -> list[str]:
    """The nouns of a title, by word filter (spaCy's tagger in WebShop)."""
    words = [w.removesuffix("s") if w.endswith("'s") else w for w in title.lower().replace("'s", "").split()]
    tokens = [t for w in words for t in _process(w).split()]
    return [t for t in tokens if t.isalpha() and len(t) > 1 and t not in _FUNCTION_WORDS and t not in _MODIFIERS]


def type_reward(product: dict[str, Any], goal: dict[str, Any]) -> dict[str, Any]:
    """WebShop's ``get_type_reward``: r_type in {1, 0.5, 0.1, 0} and its inputs."""
    query_match = product["query"] == goal["query"]
    bought = {x.strip() for x in product["product_category"].split("›")}
    wanted = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(bought & wanted) >= 2
    bought_nouns, wanted_nouns = set(title_nouns(product["name"])), title_nouns(goal["name"])
    title_score = 0.2 if not wanted_nouns else len(bought_nouns & set(wanted_nouns)) / len(wanted_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def attribute_matches(product: dict[str, Any], goal_attributes: list[str]) -> int:
    text = product_text(product)
    matches = 0
    for wanted in goal_attributes:
        if any(token_set_ratio(have, wanted) > FUZZ_THRESHOLD for have in product["Attributes"]) or wanted in text:
            matches += 1
    return matches


def option_matches(product: dict[str, Any], goal_options: list[str], purchased: dict[str, str]) -> int:
    goal_values = [normalize_color(v) for v in goal_options]
    text = product_text(product)
    matches = 0
    for name, value in purchased.items():
        value = normalize_color(value)
        if name.lower() in EXACT_MATCH_OPTS:
            matched = value in goal_values
        else:
            matched = any(token_set_ratio(g, value) > FUZZ_THRESHOLD for g in goal_values)
        if matched or value in text:
            matches += 1
    return matches


def purchase_reward(
    product: dict[str, Any], goal: dict[str, Any], price: float, options: dict[str, str]
) -> tuple[float, dict[str, Any]]:
    """WebShop's ``get_reward(..., verbose=True)``: the score in [0, 1] and its components."""
    kind = type_reward(product, goal)
    goal_options = list(goal["goal_options"].values())
    n_att = attribute_matches(product, goal["attributes"])
    n_opt = option_matches(product, goal_options, options)
    r_price = price <= goal["price_upper"]
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    reward = kind["r_type"] * (n_att + n_opt + int(r_price)) / denominator
    info = {
        "r_type": kind["r_type"],
        "r_att": n_att / len(goal["attributes"]) if goal["attributes"] else 0.0,
        "r_option": n_opt / len(goal_options) if goal_options else None,
        "r_price": bool(r_price),
        "w_att": len(goal["attributes"]) / denominator,
        "w_option": len(goal_options) / denominator,
        "w_price": 1 / denominator,
        "query_match": kind["query_match"],
        "category_match": kind["category_match"],
        "title_score": kind["title_score"],
    }
    return reward, info
