"""``streamrl.sandbox``: run model-written Python safely, without Docker.

* ``run_python`` / ``arun_python``: a fresh interpreter per call (stateless, the default).
* ``PythonSession``: one persistent interpreter per trajectory, with ``[state reset]`` on a
  timeout or a crash.
* ``isolation_level()``: the level ``"auto"`` gives here; every result also carries the level
  in force for it. See ``isolation.py`` for the levels and what each stops, and
  ``docs/sandbox.md``. A level weaker than the safe ones (``SAFE_LEVELS``) runs only with an
  explicit opt-in (``allow_weak=True`` / ``set_allow_weak(True)`` / ``sandbox.allow_weak``).

Pure Python and standard library (the kernel's primitives through ``ctypes``, plus the
``unshare``/``bwrap`` binaries when present); no other ``streamrl`` package is imported.
"""

from streamrl.sandbox.gate import max_concurrency, set_max_concurrency
from streamrl.sandbox.isolation import (
    LEVELS,
    SAFE_LEVELS,
    Isolation,
    SandboxUnavailableError,
    allow_weak,
    available_isolations,
    describe,
    isolation_level,
    resolve_isolation,
    set_allow_weak,
)
from streamrl.sandbox.limits import SandboxLimits
from streamrl.sandbox.result import SandboxResult, Status
from streamrl.sandbox.runner import arun_python, run_python
from streamrl.sandbox.session import PythonSession

__all__ = [
    "LEVELS",
    "SAFE_LEVELS",
    "Isolation",
    "SandboxUnavailableError",
    "allow_weak",
    "describe",
    "PythonSession",
    "SandboxLimits",
    "SandboxResult",
    "Status",
    "arun_python",
    "available_isolations",
    "isolation_level",
    "max_concurrency",
    "resolve_isolation",
    "run_python",
    "set_allow_weak",
    "set_max_concurrency",
]
