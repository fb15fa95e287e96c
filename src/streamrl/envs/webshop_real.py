"""``webshop_real``: the real WebShop text environment (``princeton-nlp/WebShop``) behind the ``Env`` contract.

Needs a user checkout of WebShop with its data and search index (``setup.sh``: products, goals,
the pyserini/Lucene index, spaCy model, Java): put the checkout on ``PYTHONPATH`` or pass
``webshop_dir``. Nothing is downloaded here. It builds ``WebAgentTextEnv(observation_mode="text")``
and maps ``get_available_actions()`` to the same admissible strings as ``webshop_lite``
(``search[<your query>]`` and ``click[...]``), ``reset(session=idx)`` to the goal index, and
WebShop's reward to ``score = 100 * r`` and ``won = (r == 1)``, and reads ``click[k]`` on a results
page as the k-th result as ``webshop_lite`` does; so a policy trained on ``webshop_lite`` runs here
unchanged. Task ids follow WebShop's split: ``test/<n>`` = goal n
(n < 500), ``eval/<n>`` = goal 500 + n (n < 1000), ``train/<n>`` = goal 1500 + n.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from streamrl.envs.base import Env, EnvSpec, Step
from streamrl.envs.webshop_lite.env import WebshopLiteEnv, parse_action
from streamrl.envs.webshop_lite.prompts import WebshopPromptBuilder, webshop_action_parser
from streamrl.envs.webshop_lite.text import admissible, resolve_result_number

OFFSETS = {"test": 0, "eval": 500, "train": 1500}
SIZES = {"test": 500, "eval": 1000, "train": None}
MAX_STEPS = 15


class WebshopUnavailableError(ImportError):
    """The real WebShop (``web_agent_site``) cannot be imported or has no data."""


def _import_text_env(webshop_dir: str | os.PathLike[str] | None) -> Any:
    root = webshop_dir or os.environ.get("WEBSHOP_DIR")
    if root is not None and str(Path(root).expanduser()) not in sys.path:
        sys.path.insert(0, str(Path(root).expanduser()))
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
    except ImportError as error:
        raise WebshopUnavailableError(
            f"webshop_real needs a checkout of princeton-nlp/WebShop with its data ({error}); clone it, run its "
            "setup.sh, and set WEBSHOP_DIR (or pass webshop_dir) to the checkout"
        ) from error
    return WebAgentTextEnv


class WebshopRealEnv(Env):
    """Not a built-in name (the built-in list covers environments that run without user data): use it
    as ``--env streamrl.envs.webshop_real:WebshopRealEnv`` (its parser and prompt builder are the
    class attributes below), or ``register("webshop_real", ...)`` yourself."""

    action_parser = staticmethod(webshop_action_parser)
    prompt_builder = WebshopPromptBuilder

    def __init__(self, webshop_dir: str | None = None, max_steps: int = MAX_STEPS, num_products: int | None = None,
                 human_goals: bool = False, seed: int | None = None, _text_env: Any = None):
        if max_steps < 1:
            raise ValueError(f"webshop_real: max_steps must be >= 1, got {max_steps}")
        if _text_env is None:
            text_env_class = _import_text_env(webshop_dir)
            try:
                _text_env = text_env_class(observation_mode="text", num_products=num_products, human_goals=human_goals)
            except (OSError, FileNotFoundError) as error:
                raise WebshopUnavailableError(
                    f"webshop_real: the WebShop checkout has no usable data ({error}); run its setup.sh"
                ) from error
        self._env = _text_env
        super().__init__(seed=seed)
        self.spec = EnvSpec(name="webshop_real", max_steps=max_steps, action_format="command", reward_range=(0.0, 1.0),
                            splits=dict(SIZES), eval_split="test")

    def start(self, task_id: str) -> str:
        split, index = self.check_task_id(task_id)
        self._observation, _ = self._env.reset(session=OFFSETS[split] + index)
        self._finished = False
        return self._observation

    def act(self, action: str) -> Step:
        before = self._observation
        action = resolve_result_number(action, self.admissible_actions)
        observation, reward, done, _ = self._env.step(action)
        self._observation, self._finished = observation, bool(done)
        reward = float(reward or 0.0) if done else 0.0
        name, arg = parse_action(action)
        won = bool(done) and reward == 1.0
        return Step(observation, reward=reward, done=bool(done), won=won, score=100.0 * reward,
                    effective=bool(done) or observation != before, valid=name in ("search", "click") and bool(arg),
                    reason=("won" if won else "purchased") if done else None)

    search = WebshopLiteEnv.search  # the same tool form: search(query), click(target)
    click = WebshopLiteEnv.click
    tool_call_for = WebshopLiteEnv.tool_call_for

    def admissible_actions(self) -> list[str] | None:
        if self._finished:
            return []
        available = self._env.get_available_actions()
        return admissible(bool(available["has_search_bar"]), list(available["clickables"]))

    def describe(self) -> dict[str, Any]:
        done = self._finished
        return {
            "task_type": "webshop",
            "anchor": f"{self.task_id}|{self._observation}",
            "available_actions": {"has_search_bar": False, "clickables": []} if done else self._env.get_available_actions(),
            "instruction": getattr(self._env, "instruction_text", ""),
        }
