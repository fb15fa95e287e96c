"""The suite is deterministic: hypothesis draws the same examples on every run (tests/conftest.py)."""

import os

import pytest
from hypothesis import settings


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci", reason="another profile was asked for")
def test_hypothesis_is_derandomised_by_default():
    assert settings.default.derandomize is True
    assert settings.default.database is None
    assert settings.default.print_blob is True
