"""Suite-wide settings: hypothesis runs derandomised, so a fresh clone draws the same examples
every time (``HYPOTHESIS_PROFILE=explore`` draws fresh random ones; a failure prints its blob)."""

import os
import signal
import time

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _sigkill_at_checkpoint(process, out, step: int, timeout: float) -> None:
    """SIGKILL a ``streamrl train`` process as soon as its step-``step`` checkpoint is complete."""
    manifest = out / "checkpoints" / f"step_{step:08d}" / "manifest.json"
    deadline = time.monotonic() + timeout
    while not manifest.exists():
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, f"no checkpoint at step {step} in time"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def sigkill_at_checkpoint():
    """``sigkill_at_checkpoint(process, out, step, timeout)``: the kill half of the resume tests."""
    return _sigkill_at_checkpoint
