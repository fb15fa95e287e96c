"""Suite-wide settings: hypothesis runs derandomised, so a fresh clone draws the same examples
every time (``HYPOTHESIS_PROFILE=explore`` draws fresh random ones; a failure prints its blob)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
