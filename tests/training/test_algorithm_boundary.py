"""The boundary of issue 14, kept: algorithms never import the learner, and neither the loop nor the
learner reads an algorithm's config fields or the rollout layout (they see the ``Algorithm``
protocol and the ``UpdateConfig`` only)."""

from __future__ import annotations

import ast
from pathlib import Path

import streamrl.training

TRAIN = Path(streamrl.training.__file__).parent


def _imports(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def _attribute_chains(path: Path) -> set[str]:
    chains = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            parts, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                chains.add(".".join([value.id, *reversed(parts)]))
    return chains


def test_algorithms_do_not_import_the_learner_or_the_loop():
    for path in sorted((TRAIN / "algorithms").glob("*.py")):
        assert not _imports(path) & {"streamrl.training.learner", "streamrl.training.loop", "streamrl.training.assemble"}, path.name


def test_loop_and_learner_read_no_algorithm_fields_and_no_rollout_layout():
    for name in ("loop.py", "learner.py"):
        chains = _attribute_chains(TRAIN / name)
        assert not {c for c in chains if c.startswith("config.algo")}, name
        assert not {c for c in chains if c.endswith("rollout.layout")}, name
    assert not _imports(TRAIN / "learner.py") & {"streamrl.training.algorithms"}
