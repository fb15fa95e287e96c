"""Optional symbolic grading with ``math-verify`` (``pip install 'streamrl[math]'``).

math-verify guards parsing and comparison with SIGALRM, which raises ``ValueError: signal only
works in main thread`` in threads (where async rollouts grade). So its timeouts are turned off
and it runs in a persistent sandboxed worker instead: the wall clock and memory limit of the
sandbox stop a runaway parse, and a killed worker is restarted on the next call. Gold comes
first, as math-verify expects; the prediction is wrapped in ``\\boxed{}`` so only it is read.
"""

from __future__ import annotations

import atexit
import importlib.util
import threading

from streamrl.sandbox import PythonSession

_SETUP = """
import logging as _logging
_logging.disable(_logging.WARNING)
from math_verify import parse as _mv_parse, verify as _mv_verify

def _streamrl_verify(truth, pred):
    gold = _mv_parse(truth if ("$" in truth or "\\\\boxed" in truth) else "$" + truth + "$", parsing_timeout=None)
    answer = _mv_parse("\\\\boxed{" + pred + "}", parsing_timeout=None)
    return bool(gold) and bool(answer) and bool(_mv_verify(gold, answer, timeout_seconds=None))
"""


def math_verify_installed() -> bool:
    return importlib.util.find_spec("math_verify") is not None


class MathVerifyChecker:
    """``check(pred, truth) -> bool | None`` through math-verify in a sandboxed worker; None
    when math-verify is missing, fails, or runs past ``timeout_s``. Thread-safe (serialised)."""

    #: the first call imports sympy in the worker, which takes a few seconds
    SETUP_TIMEOUT_S = 60.0

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 2048):
        self.timeout_s = timeout_s
        self._memory_mb = memory_mb
        self._session: PythonSession | None = None
        self._ready = False
        self._lock = threading.Lock()

    def _ensure_ready(self) -> bool:
        if self._session is None:
            self._session = PythonSession(memory_mb=self._memory_mb, cpu_budget_s=10**6, echo_last_expr=True)
        if not self._ready:
            self._ready = self._session.run(_SETUP, timeout=self.SETUP_TIMEOUT_S).ok
        return self._ready

    def check(self, pred: str, truth: str) -> bool | None:
        if not math_verify_installed():
            return None
        with self._lock:
            if not self._ensure_ready():
                return None
            assert self._session is not None
            result = self._session.run(f"_streamrl_verify({truth!r}, {pred!r})", timeout=self.timeout_s)
            if result.state_reset:
                self._ready = False  # the next call sets the fresh worker up again
            lines = result.stdout.strip().splitlines()
            if not result.ok or not lines or lines[-1] not in ("True", "False"):
                return None
            return lines[-1] == "True"

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None
            self._ready = False


_shared: MathVerifyChecker | None = None
_shared_lock = threading.Lock()


def shared_checker() -> MathVerifyChecker | None:
    """One checker for the whole process (its worker holds sympy: ~100 MB), or None when
    math-verify is not installed."""
    global _shared
    if not math_verify_installed():
        return None
    with _shared_lock:
        if _shared is None:
            _shared = MathVerifyChecker()
            atexit.register(_shared.close)
        return _shared
