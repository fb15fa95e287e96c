"""WebShop's pages in its text mode: the visible strings joined by ``" [SEP] "``.

Clickables are lowercased button texts and ASINs, plus option values, as
``WebAgentTextEnv.get_available_actions`` returns them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

SEP = " [SEP] "
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
THANK_YOU = "Thank you for shopping with us!"
SEARCH_PLACEHOLDER = "search[<your query>]"


def price_text(pricing: list[float]) -> str:
    if len(pricing) == 1:
        return f"${pricing[0]:.2f}"
    return f"${pricing[0]:.2f} to ${pricing[1]:.2f}"


def search_page(instruction: str) -> tuple[str, list[str]]:
    return SEP.join(["WebShop", "Instruction:", instruction, "Search"]), ["search"]


def results_page(instruction: str, products: list[dict[str, Any]], page: int, total: int, per_page: int) -> tuple[str, list[str]]:
    parts = ["Instruction:", instruction, BACK_TO_SEARCH, f"Page {page} (Total results: {total})"]
    clickables = [BACK_TO_SEARCH.lower()]
    if page > 1:
        parts.append(PREV_PAGE)
        clickables.append(PREV_PAGE.lower())
    if page * per_page < total:
        parts.append(NEXT_PAGE)
        clickables.append(NEXT_PAGE.lower())
    for product in products:
        parts += [product["asin"], product["Title"], price_text(product["pricing"])]
        clickables.append(product["asin"].lower())
    return SEP.join(parts), clickables


def item_page(instruction: str, product: dict[str, Any]) -> tuple[str, list[str]]:
    parts = ["Instruction:", instruction, BACK_TO_SEARCH, PREV_PAGE]
    clickables = [BACK_TO_SEARCH.lower(), PREV_PAGE.lower()]
    for name, values in product["options"].items():
        parts += [name, *values]
        clickables += values
    parts += [product["Title"], f"Price: ${product['price']:.2f}", f"Rating: {product['Rating']}", *SUB_PAGES, BUY_NOW]
    clickables += [s.lower() for s in SUB_PAGES] + [BUY_NOW.lower()]
    return SEP.join(parts), clickables


def sub_page(instruction: str, product: dict[str, Any], which: str) -> tuple[str, list[str]]:
    if which == "description":
        content = [product["Description"]]
    elif which == "features":
        content = list(product["BulletPoints"])
    else:
        content = [f"{r['title']}{SEP}{r['score']}{SEP}{r['body']}" for r in product["Reviews"]]
    parts = ["Instruction:", instruction, BACK_TO_SEARCH, PREV_PAGE, *content]
    return SEP.join(parts), [BACK_TO_SEARCH.lower(), PREV_PAGE.lower()]


def done_page(instruction: str, asin: str, options: dict[str, str], reward: float) -> str:
    chosen = ", ".join(f"{k}: {v}" for k, v in options.items()) or "none"
    return SEP.join([THANK_YOU, "Purchased", asin, "Options", chosen, "Instruction:", instruction,
                     "Your score (min 0.0, max 1.0)", f"{reward:.4g}"])


def admissible(has_search_bar: bool, clickables: list[str]) -> list[str]:
    """verl-agent's list: ``search[<your query>]`` when there is a search bar, then ``click[...]``
    for each clickable (``click[search]`` is a no-op in WebShop, so it is left out)."""
    actions = [SEARCH_PLACEHOLDER] if has_search_bar else []
    return actions + [f"click[{c}]" for c in clickables if c != "search"]


#: clickables of a results page that are not results
_RESULTS_PAGE_BUTTONS = frozenset({"click[back to search]", "click[next >]", "click[< prev]"})
_NUMBERED_CLICK = re.compile(r"^\s*click\s*\[\s*([1-9][0-9]?)\s*\]\s*$", re.IGNORECASE)


def shown_results(admissible_actions: list[str]) -> list[str]:
    """The result clicks (``click[<asin>]``) of a results page in the order shown; ``[]`` on any
    other page (an item page has ``click[buy now]``, the search page ``search[...]``)."""
    if (
        "click[back to search]" not in admissible_actions
        or "click[buy now]" in admissible_actions
        or SEARCH_PLACEHOLDER in admissible_actions
    ):
        return []
    return [a for a in admissible_actions if a.startswith("click[") and a not in _RESULTS_PAGE_BUTTONS]


def resolve_result_number(action: str, admissible_actions: Callable[[], list[str] | None]) -> str:
    """``click[k]`` on a results page -> the k-th result's ``click[<asin>]`` (k from 1); any other
    action unchanged. The one extension to WebShop's grammar: it lets a prompt refer to results
    by position (``WebshopPromptBuilder(number_results=True)``) instead of by a 10-character ASIN.
    ``admissible_actions`` is asked only for a numbered click (the real WebShop computes it)."""
    match = _NUMBERED_CLICK.match(action)
    if match is None:
        return action
    actions = admissible_actions() or []
    if action.strip().lower() in actions:
        return action
    results = shown_results(actions)
    k = int(match.group(1))
    return results[k - 1] if k <= len(results) else action
