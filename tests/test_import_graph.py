"""The house's structure, from the modules' own imports (every ``import`` statement, at any depth,
type-only ones included): no cycle between modules, and no arrow from a lower layer to a higher one.

Layers, lowest first: ``algos`` and ``sandbox``; ``policy`` and ``envs``; ``rollout``; ``agents``;
``training``; the command line (``api``, ``cli``, ``commands``, ``play``). A package's
``__init__`` re-exporting its own modules is not an arrow; a ``__main__`` module is an entry
point, started from outside, and sits with the command line."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "streamrl"
LAYERS = {"algos": 0, "sandbox": 0, "policy": 1, "envs": 1, "rollout": 2, "agents": 3, "training": 4}
TOP = 5


def modules() -> dict[str, Path]:
    found = {}
    for path in SOURCE.rglob("*.py"):
        parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the streamrl modules it imports (a name imported from a package that is one of
    its modules counts as that module)."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *([base] if base else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name and not target.startswith(name + "."):  # not its own re-exports
                    graph[name].add(target)
    return graph


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[-1] == "__main__":
        return TOP
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_no_import_goes_up_a_layer():
    upward = [f"{module} -> {target}" for module, targets in sorted(import_graph().items()) for target in sorted(targets)
              if layer(target) > layer(module)]
    assert upward == []


def test_no_module_uses_an_entry_point_as_a_library():
    """A ``__main__`` sits with the command line only because nothing imports it."""
    users = [f"{module} -> {target}" for module, targets in sorted(import_graph().items()) for target in sorted(targets)
             if target.endswith(".__main__")]
    assert users == []


def test_the_checks_would_see_a_cycle_and_an_upward_arrow():
    """The checks themselves: a made-up graph with both faults is caught."""
    graph = {"streamrl.envs.a": {"streamrl.training.b"}, "streamrl.training.b": {"streamrl.envs.a"}}
    assert cycles(graph) == [["streamrl.envs.a", "streamrl.training.b"]]
    assert layer("streamrl.training.b") > layer("streamrl.envs.a")
    assert "streamrl.sandbox.launch" in import_graph()["streamrl.sandbox.isolation"]  # a lazy import counts


def _calls(text: str) -> list[str]:
    """The src modules (outside the one that defines it) whose code contains ``text``."""
    return sorted(str(path.relative_to(SOURCE)) for path in SOURCE.rglob("*.py") if text in path.read_text(encoding="utf-8"))


def test_each_setting_is_resolved_in_one_place():
    """The tool format from ``model.tool_format`` once, on the policy (as TRL attaches it to the
    tokenizer); the CPU engine built only in ``policy/`` (everyone else goes through ``make_engine``)."""
    assert [p for p in _calls("resolve_tool_format(") if p != "policy/tool_format.py"] == ["policy/policy.py"]
    assert all(p.startswith("policy/") for p in _calls("HFEngine.from_policy(") + _calls("HFEngine("))


def test_the_configured_environment_is_built_in_one_place():
    assert _calls("make(config.env.name") == []
    assert [p for p in _calls("make(self.name, **self.options)")] == ["training/environment.py"]
