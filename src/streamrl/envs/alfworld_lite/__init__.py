"""``alfworld_lite``: an embedded, ALFWorld-compatible household simulator.

It reproduces the TextWorld side of ALFWorld: the same observation strings, admissible commands,
six task types and goal templates, ``Nothing happens.`` for anything else, and a 50-step cap; it
generates its own households (four room kinds) instead of reading ALFRED game files.

Modules: ``catalog`` (kinds, affordances, rooms, task types), ``world`` (state), ``text``
(observation strings), ``rules`` (grammar, admissibility, effects), ``task`` (goals),
``generator`` (task ids, splits, layouts), ``expert`` (privileged planner and searching expert),
``env`` (the ``Env``), ``prompts`` (verl-agent-style and compact prompt builders, parser).
"""

from streamrl.envs.alfworld_lite.env import AlfworldLiteEnv
from streamrl.envs.alfworld_lite.expert import SearchingExpert, expert_plan
from streamrl.envs.alfworld_lite.generator import EVAL_FINGERPRINTS, UNSEEN_SCENES, fingerprint
from streamrl.envs.alfworld_lite.prompts import AlfworldPromptBuilder, alfworld_action_parser
from streamrl.envs.registry import register

register("alfworld_lite", AlfworldLiteEnv, alfworld_action_parser, AlfworldPromptBuilder)

__all__ = [
    "EVAL_FINGERPRINTS",
    "UNSEEN_SCENES",
    "AlfworldLiteEnv",
    "AlfworldPromptBuilder",
    "SearchingExpert",
    "alfworld_action_parser",
    "expert_plan",
    "fingerprint",
]
