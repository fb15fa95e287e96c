"""Student-t distribution function and quantiles in plain Python (no scipy).

The CDF goes through the regularised incomplete beta function, evaluated by its continued fraction
(modified Lentz iteration); quantiles invert the CDF by bisection, which is robust for the small
degrees of freedom of seed-paired comparisons (3 seeds -> 2 d.o.f.).
"""

from __future__ import annotations

import math

_TINY = 1e-300
_CF_TOLERANCE = 1e-15
_CF_MAX_TERMS = 10_000


def _fraction_coefficient(k: int, x: float, a: float, b: float) -> float:
    """The ``k``-th partial numerator ``d_k`` of the incomplete-beta continued fraction."""
    if k % 2:  # d_{2m+1}
        m = (k - 1) // 2
        return -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
    m = k // 2  # d_{2m}
    return m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))


def _beta_fraction(x: float, a: float, b: float) -> float:
    """``1 / g`` with ``g = 1 + d_1 / (1 + d_2 / (1 + ...))``, ``g`` by the modified Lentz iteration."""
    f = c = 1.0
    d = 0.0
    for k in range(1, _CF_MAX_TERMS):
        numerator = _fraction_coefficient(k, x, a, b)
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + numerator / c
        c = c if abs(c) > _TINY else _TINY
        step = c * d
        f *= step
        if abs(step - 1.0) < _CF_TOLERANCE:
            return 1.0 / f
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (x={x}, a={a}, b={b})")


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """``I_x(a, b)`` for ``a, b > 0`` and ``x`` in [0, 1]."""
    if not (a > 0 and b > 0):
        raise ValueError(f"incomplete beta needs a, b > 0, got {a}, {b}")
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast only below this point
        return 1.0 - regularized_incomplete_beta(1.0 - x, b, a)
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    return math.exp(log_front) * _beta_fraction(x, a, b) / a


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = 0.5 * regularized_incomplete_beta(df / (df + t * t), 0.5 * df, 0.5)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``t`` with ``t_cdf(t, df) == p`` (e.g. ``t_quantile(0.975, n - 1)`` for a 95% interval)."""
    if not (0.0 < p < 1.0):
        raise ValueError(f"quantile level must lie in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, 2.0 * high
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-14 * max(1.0, high):
            break
    return 0.5 * (low + high)
