"""Every source path the docs, the README and the docstrings name exists: a file moved or renamed
leaves no reader at a dead end (``train/learner.py`` after the package became ``training/``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algos", "sandbox", "policy", "envs", "rollout", "agents", "training", "train")
#: ``policy/fused_forward.py``, ``src/streamrl/training/run.py``, ``tests/...py``, ``benchmarks/...py``
CITED = re.compile(r"(?<![\w/.-])((?:src/streamrl/|streamrl/)?(?:%s)/[\w/]+\.py|(?:tests|benchmarks|scripts|examples)/[\w/]+\.py)"
                   % "|".join(PACKAGES))


def cited_paths() -> list[tuple[str, str]]:
    """(where, path) for every source path cited in docs/, README.md and src/."""
    found = []
    for document in [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("src/streamrl/**/*.py")]:
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            found += [(f"{document.relative_to(ROOT)}:{number}", match.group(1)) for match in CITED.finditer(line)]
    return found


def exists(path: str) -> bool:
    if path.startswith(("tests/", "benchmarks/", "scripts/", "examples/", "src/")):
        return (ROOT / path).exists()
    return (ROOT / "src" / (path if path.startswith("streamrl/") else f"streamrl/{path}")).exists()


def test_every_cited_source_path_exists():
    cited = cited_paths()
    assert len(cited) > 100  # the pattern still finds the docs' citations
    assert [f"{where}: {path}" for where, path in cited if not exists(path)] == []
    assert not (ROOT / "tests" / "train").exists()  # tests mirror the package names
