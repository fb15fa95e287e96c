"""keep_freed_memory: glibc's mallopt is applied where the C library has it, and nothing fails
where it does not."""

import ctypes.util
import platform

import pytest

from streamrl.training import allocator
from streamrl.training.allocator import keep_freed_memory


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_keep_freed_memory_applies_on_glibc():
    assert keep_freed_memory() is True


def test_keep_freed_memory_without_a_c_library_is_a_no_op(monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert allocator.keep_freed_memory() is False
