"""``WebshopLiteEnv``: the embedded WebShop behind the ``Env`` contract."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from streamrl.envs.base import Env, EnvSpec, Step
from streamrl.envs.tools import tool
from streamrl.envs.webshop_lite import text
from streamrl.envs.webshop_lite.catalog import DEFAULT_SEED, Catalog, build_catalog
from streamrl.envs.webshop_lite.expert import Shopper
from streamrl.envs.webshop_lite.goals import build_goals
from streamrl.envs.webshop_lite.reward import purchase_reward
from streamrl.envs.webshop_lite.search import PER_PAGE, search_engine

MAX_STEPS = 15  # SAPO's and verl-agent's cap
#: WebShop's ``parse_action`` pattern
ACTION = re.compile(r"(.+)\[(.+)\]")


def parse_action(action: str) -> tuple[str, str | None]:
    """WebShop's ``parse_action``: ``name[arg]`` -> (name, lowercased arg); else (action, None)."""
    match = ACTION.match(action.strip())
    if match is None:
        return action.strip(), None
    name, arg = match.groups()
    return name.strip().lower(), arg.strip().lower()


class WebshopLiteEnv(Env):
    """A WebShop-compatible shop over a generated catalogue (see ``streamrl.envs.webshop_lite``).

    Task ids: ``test/<n>`` (n < 500), ``eval/<n>`` (n < 1000), ``train/<n>`` (n < 2400).
    Options: ``max_steps`` (15), ``catalog_seed`` (0: the catalogue and the goal splits), ``seed``
    (for a ``reset()`` without a seed or task id). On a results page ``click[k]`` also clicks the
    k-th result shown (``text.resolve_result_number``), for prompts that number the results.

    Tool form: ``search(query)`` and ``click(target)``, WebShop's own two actions.
    """

    _clickables: list[str]

    def __init__(self, max_steps: int = MAX_STEPS, catalog_seed: int = DEFAULT_SEED, seed: int | None = None):
        if max_steps < 1:
            raise ValueError(f"webshop_lite: max_steps must be >= 1, got {max_steps}")
        super().__init__(seed=seed)
        self.catalog: Catalog = build_catalog(catalog_seed)
        self.goals = build_goals(catalog_seed)
        self.engine = search_engine(catalog_seed)
        self.spec = EnvSpec(
            name="webshop_lite",
            max_steps=max_steps,
            action_format="command",
            reward_range=(0.0, 1.0),
            splits=self.goals.sizes(),
            eval_split="test",
            # WebShop lowercases an action's argument: click[b0gs9l4nts] buys B0GS9L4NTS
            entity_tokens=tuple(sorted(asin.lower() for asin in self.catalog.by_asin)),
        )
        self._goal: dict[str, Any] | None = None

    # -- the Env hooks ---------------------------------------------------------------------------

    def start(self, task_id: str) -> str:
        self._goal = self.goal_of(task_id)
        self._page = "search"
        self._keywords = ""
        self._results: list[str] = []
        self._page_no = 1
        self._asin: str | None = None
        self._sub: str | None = None
        self._options: dict[str, str] = {}
        self._render()
        return self._observation

    def act(self, action: str) -> Step:
        name, parsed = parse_action(text.resolve_result_number(action, self.admissible_actions))
        arg = parsed or ""
        valid = name in ("search", "click") and arg != ""
        if valid and name == "search":
            self._search(arg)
        elif valid and arg in self._clickables and arg != "search":
            if arg == "buy now":
                reward, bought = self._buy()
                won = reward == 1.0
                return Step(self._observation, reward=reward, done=True, won=won, score=100.0 * reward,
                            reason="won" if won else "purchased", info=bought)
            self._click(arg)
        else:
            return Step(self._observation, effective=False, valid=valid, info={"invalid_action": True})
        self._render()
        return Step(self._observation)

    @tool
    def search(self, query: str) -> Step:
        """Search the shop (only on a page with a search bar).

        Args:
            query: the words to search for
        """
        return self.act(f"search[{query}]")

    @tool
    def click(self, target: str) -> Step:
        """Click a button or link of the page: a result (its number or code), an option, "buy now", "< prev", ...

        Args:
            target: the text of what to click, as the page shows it
        """
        return self.act(f"click[{target}]")

    def tool_call_for(self, action: str) -> tuple[str, dict[str, Any]] | None:
        name, arg = parse_action(action)
        return (name, {"query": arg}) if name == "search" else ("click", {"target": arg})

    def admissible_actions(self) -> list[str] | None:
        if self._goal is None:
            return None
        return text.admissible(self._has_search_bar, self._clickables) if self._page != "done" else []

    def describe(self) -> dict[str, Any]:
        goal = self.goal
        anchor_options = ",".join(f"{k}={v}" for k, v in sorted(self._options.items()))
        return {
            "task_type": goal["category"],
            "anchor": f"{self.task_id}|{self._page}|{self._keywords}|{self._page_no}|{self._asin}|{self._sub}|{anchor_options}",
            "available_actions": {"has_search_bar": self._has_search_bar, "clickables": list(self._clickables)},
            "instruction": goal["instruction_text"],
            "page": self._page,
        }

    # -- extras ----------------------------------------------------------------------------------

    def goal_of(self, task_id: str) -> dict[str, Any]:
        split, _, index = task_id.partition("/")
        goals = self.goals.splits.get(split)
        if goals is None or not index.isdigit():
            raise ValueError(
                f"webshop_lite: bad task_id {task_id!r} (expected '<split>/<n>', splits: {', '.join(self.goals.splits)})"
            )
        if int(index) >= len(goals):
            raise ValueError(f"webshop_lite: task_id {task_id!r} out of range ({split} has {len(goals)} goals)")
        return goals[int(index)]

    @property
    def goal(self) -> dict[str, Any]:
        """The current goal (privileged: it names the target product)."""
        if self._goal is None:
            raise RuntimeError("webshop_lite: no goal before reset()")
        return self._goal

    @property
    def instruction(self) -> str:
        return self.goal["instruction_text"]

    def state(self) -> dict[str, Any]:
        """The session (page, keywords, result page, product, chosen options), for tools and tests."""
        return {"page": self._page, "keywords": self._keywords, "page_no": self._page_no, "asin": self._asin,
                "sub": self._sub, "options": dict(self._options), "results": list(self._results)}

    def searching_expert(self) -> Callable[[str, dict[str, Any]], str]:
        """The non-privileged shopper for the episode just reset: it searches with the goal text and
        inspects results (``act(observation, info)``)."""
        return Shopper(max_steps=self.spec.max_steps).act

    def expert_action(self) -> str | None:
        """The privileged shopper: it knows the target product and the goal options."""
        if self._goal is None or self._done:
            return None
        target = self._goal["asin"]
        if self._page == "search":
            return f"search[{self.catalog.by_asin[target]['Title'].lower()}]"
        if self._page == "results":
            shown = self._results[(self._page_no - 1) * PER_PAGE : self._page_no * PER_PAGE]
            if target in shown:
                return f"click[{target.lower()}]"
            if target in self._results[self._page_no * PER_PAGE :]:
                return "click[next >]"
            return f"search[{self.catalog.by_asin[target]['Title'].lower()}]"
        if self._page == "sub":
            return "click[< prev]"
        if self._asin != target:
            return "click[< prev]"
        for name, value in self._goal["goal_options"].items():
            if self._options.get(name) != value:
                return f"click[{value}]"
        return "click[buy now]"

    # -- internals -------------------------------------------------------------------------------

    def _search(self, keywords: str) -> None:
        self._keywords = keywords
        self._results = self.engine.search(keywords)
        self._page, self._page_no, self._asin, self._sub, self._options = "results", 1, None, None, {}

    def _click(self, clickable: str) -> None:
        if clickable == "back to search":
            self._page, self._keywords, self._results, self._asin, self._sub, self._options = "search", "", [], None, None, {}
        elif self._page == "results":
            if clickable == "next >":
                self._page_no += 1
            elif clickable == "< prev":
                self._page_no -= 1
            else:
                self._page, self._asin, self._options = "item", clickable.upper(), {}
        elif self._page == "item":
            if clickable == "< prev":
                self._page, self._asin, self._options = "results", None, {}
            elif clickable in ("description", "features", "reviews"):
                self._page, self._sub = "sub", clickable
            else:
                assert self._asin is not None  # an item page shows one product
                product = self.catalog.by_asin[self._asin]
                for name, values in product["options"].items():
                    if clickable in values:
                        self._options[name] = clickable
        elif self._page == "sub" and clickable == "< prev":
            self._page, self._sub = "item", None

    def _buy(self) -> tuple[float, dict[str, Any]]:
        assert self._asin is not None  # "buy now" is on an item page
        product = self.catalog.by_asin[self._asin]
        reward, parts = purchase_reward(product, self.goal, product["price"], self._options)
        self._page = "done"
        self._observation = text.done_page(self.instruction, product["asin"], self._options, reward)
        self._has_search_bar, self._clickables = False, []
        return reward, {**parts, "purchased_asin": product["asin"], "purchased_options": dict(self._options)}

    def _render(self) -> None:
        instruction = self.instruction
        if self._page == "search":
            self._observation, self._clickables = text.search_page(instruction)
        elif self._page == "results":
            start = (self._page_no - 1) * PER_PAGE
            shown = [self.catalog.by_asin[a] for a in self._results[start : start + PER_PAGE]]
            self._observation, self._clickables = text.results_page(
                instruction, shown, self._page_no, len(self._results), PER_PAGE
            )
        elif self._page == "item":
            assert self._asin is not None
            self._observation, self._clickables = text.item_page(instruction, self.catalog.by_asin[self._asin])
        else:
            assert self._asin is not None and self._sub is not None
            self._observation, self._clickables = text.sub_page(instruction, self.catalog.by_asin[self._asin], self._sub)
        self._has_search_bar = self._page == "search"
