"""``webshop_lite``: an embedded shop that reproduces WebShop's text environment.

It keeps WebShop's page flow, action grammar (``search[...]``, ``click[...]``), text-mode
observations with ``[SEP]``, no-op answers to invalid actions, BM25 search (``bm25s``) and the
purchase reward, over a generated catalogue of 3,900 products in WebShop's five categories with
fixed goal splits (500 test goals, WebShop's test size). Episodes end on ``buy now`` or after
15 steps.

Modules: ``catalog`` (product types and products), ``goals`` (instructions and splits),
``search`` (BM25), ``reward`` (WebShop's formula), ``text`` (pages), ``env`` (the ``Env``),
``expert`` (non-privileged shopper, random policy, evaluation helper), ``prompts`` (verl-agent
and compact prompt builders, parser).
"""

from streamrl.envs.registry import register
from streamrl.envs.webshop_lite.env import MAX_STEPS, WebshopLiteEnv, parse_action
from streamrl.envs.webshop_lite.prompts import WebshopPromptBuilder, webshop_action_parser

register("webshop_lite", WebshopLiteEnv, webshop_action_parser, WebshopPromptBuilder)

__all__ = ["MAX_STEPS", "WebshopLiteEnv", "WebshopPromptBuilder", "parse_action", "webshop_action_parser"]
