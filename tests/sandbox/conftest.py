"""Every sandbox test runs with a private temp root and must leave nothing behind: no process
(of ours, or anywhere with a sandbox uid), no work dir, no mount, no cgroup."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import psutil
import pytest

from .leaks import alive, mounts, sandbox_cgroups, sandbox_uid_processes


@pytest.fixture(autouse=True)
def no_leftovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Private temp root for the sandbox's work dirs; afterwards, none of them, no child
    process of ours, no sandbox-uid process, no new mount and no new cgroup may remain."""
    root = tmp_path / "sandbox-tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    mounts_before, groups_before = mounts(), sandbox_cgroups()
    yield root
    deadline = time.monotonic() + 3.0
    while True:
        extra = [c for c in me.children(recursive=True) if c.pid not in before and alive(c)]
        strays = sandbox_uid_processes()
        if not (extra or strays) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra, f"sandbox left child processes behind: {[c.pid for c in extra]}"
    assert not strays, f"processes with a sandbox uid are still running: {[p.pid for p in strays]}"
    assert sorted(p.name for p in root.iterdir()) == [], "sandbox left work dirs behind"
    assert mounts() == mounts_before, "the host's mount table changed"
    assert sandbox_cgroups() <= groups_before, f"sandbox left cgroups behind: {sandbox_cgroups() - groups_before}"
