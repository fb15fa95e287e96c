"""Checkpoints: atomic, verified, and a corrupt one falls back to the previous with a message."""

from __future__ import annotations

import json

from streamrl.training.checkpoint import latest_valid, list_checkpoints, save_checkpoint, verify


def _write(payload: bytes):
    def write(folder):
        (folder / "weights.bin").write_bytes(payload)
    return write


def test_save_then_load(tmp_path):
    checkpoint = save_checkpoint(tmp_path, 3, {"step": 3}, _write(b"abc"))
    assert verify(checkpoint.path) is None
    assert latest_valid(tmp_path).state() == {"step": 3}


def test_corrupt_newest_falls_back_with_message(tmp_path):
    save_checkpoint(tmp_path, 1, {"step": 1}, _write(b"one"), keep=3)
    newest = save_checkpoint(tmp_path, 2, {"step": 2}, _write(b"two"), keep=3)
    (newest.path / "weights.bin").write_bytes(b"tw0")  # same size, different content
    messages = []
    chosen = latest_valid(tmp_path, warn=messages.append)
    assert chosen.step == 1
    assert len(messages) == 1 and "step_00000002" in messages[0] and "hash" in messages[0]


def test_partial_write_is_never_taken_for_complete(tmp_path):
    save_checkpoint(tmp_path, 1, {"step": 1}, _write(b"one"))
    partial = tmp_path / "step_00000002"
    partial.mkdir()
    (partial / "state.json").write_text(json.dumps({"step": 2}))  # no manifest: killed mid-write
    messages = []
    assert latest_valid(tmp_path, warn=messages.append).step == 1
    assert "no manifest" in messages[0]


def test_failed_writer_leaves_previous_checkpoint_intact(tmp_path):
    save_checkpoint(tmp_path, 1, {"step": 1}, _write(b"one"))

    def crash(folder):
        (folder / "weights.bin").write_bytes(b"half")
        raise RuntimeError("killed")

    try:
        save_checkpoint(tmp_path, 2, {"step": 2}, crash)
    except RuntimeError:
        pass
    assert [c.step for c in list_checkpoints(tmp_path)] == [1]
    assert latest_valid(tmp_path).step == 1


def test_keeps_only_the_newest(tmp_path):
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, {"step": step}, _write(bytes([step])), keep=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [4, 3]


def _corrupt(checkpoint):
    (checkpoint.path / "weights.bin").write_bytes(b"\xff" * len((checkpoint.path / "weights.bin").read_bytes()))


def test_corrupt_checkpoints_never_push_out_valid_ones(tmp_path):
    """Issue 12: every checkpoint corrupt, the resumed run's new ones must survive their pruning."""
    for step in (10, 20):
        _corrupt(save_checkpoint(tmp_path, step, {"step": step}, _write(bytes([step])), keep=2))
    assert latest_valid(tmp_path, warn=lambda _: None) is None  # the run resumes from scratch
    save_checkpoint(tmp_path, 1, {"step": 1}, _write(b"one"), keep=2)
    assert latest_valid(tmp_path, warn=lambda _: None).step == 1  # not pruned by the corrupt 10 and 20
    save_checkpoint(tmp_path, 2, {"step": 2}, _write(b"two"), keep=2)
    save_checkpoint(tmp_path, 3, {"step": 3}, _write(b"three"), keep=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [3, 2]  # the newest valid ones
    assert latest_valid(tmp_path).state() == {"step": 3}


def test_a_corrupt_checkpoint_between_valid_ones_does_not_count(tmp_path):
    save_checkpoint(tmp_path, 1, {"step": 1}, _write(b"one"), keep=2)
    _corrupt(save_checkpoint(tmp_path, 2, {"step": 2}, _write(b"two"), keep=2))
    save_checkpoint(tmp_path, 3, {"step": 3}, _write(b"three"), keep=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [3, 1]
    assert all(verify(c.path) is None for c in list_checkpoints(tmp_path))


def test_halves_of_failed_saves_are_removed_at_the_next_save(tmp_path):
    def full_disk(folder):
        (folder / "weights.bin").write_bytes(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file")

    for step in (1, 2):
        try:
            save_checkpoint(tmp_path, step, {"step": step}, full_disk)
        except RuntimeError:
            pass
    stale = sorted(p.name for p in tmp_path.glob(".tmp-*"))
    assert stale  # what the failed saves left
    save_checkpoint(tmp_path, 3, {"step": 3}, _write(b"ok"))
    assert list(tmp_path.glob(".tmp-*")) == [] and [c.step for c in list_checkpoints(tmp_path)] == [3]
