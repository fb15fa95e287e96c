"""Every sandbox test runs with a private temp root and must leave no process and no file behind."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import psutil
import pytest

from .leaks import alive


@pytest.fixture(autouse=True)
def no_leftovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Private temp root for the sandbox's work dirs; afterwards, none of them and no child
    process of ours may remain."""
    root = tmp_path / "sandbox-tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    yield root
    deadline = time.monotonic() + 3.0
    while True:
        extra = [c for c in me.children(recursive=True) if c.pid not in before and alive(c)]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra, f"sandbox left child processes behind: {[c.pid for c in extra]}"
    assert sorted(p.name for p in root.iterdir()) == [], "sandbox left work dirs behind"
