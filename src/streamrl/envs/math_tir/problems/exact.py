"""Exact arithmetic for the generator: high-precision ``Decimal``, stated rounding, formatting.

Rational answers are computed with ``Fraction`` and irrational ones (``e**x``, square roots,
long powers) with 50-digit ``Decimal``. A value is rounded once, at the end, with ROUND_HALF_UP
to the places the question states. A draw whose exact value lies within 1e-6 of a rounding
boundary is rejected (within 1e-11 of its size, for large values: a float power over thousands
of compounding periods loses that much), so every sensible way of computing it, floats
included, rounds the same.
"""

from __future__ import annotations

import decimal
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal
from fractions import Fraction

PRECISION = 50
#: a value closer than this to a rounding boundary (x.xx5 for cents) is rejected ...
BOUNDARY_MARGIN = Decimal("1e-6")
#: ... or closer than this fraction of its magnitude
RELATIVE_BOUNDARY_MARGIN = Decimal("1e-11")
HIGH_PRECISION = decimal.Context(prec=PRECISION, rounding=decimal.ROUND_HALF_EVEN)


class RejectDraw(Exception):
    """The random draw gives an unfit problem (a rounding tie, a degenerate system, ...)."""


def to_decimal(value: Fraction | int | Decimal | str) -> Decimal:
    """``value`` as a 50-digit Decimal (exact for ints and decimal strings that fit)."""
    if isinstance(value, Fraction):
        return HIGH_PRECISION.divide(Decimal(value.numerator), Decimal(value.denominator))
    return HIGH_PRECISION.plus(Decimal(value))


def round_stated(value: Fraction | Decimal | int, places: int) -> Decimal:
    """ROUND_HALF_UP to ``places`` decimals; ``RejectDraw`` if too close to a boundary."""
    exact = to_decimal(value) if not isinstance(value, Decimal) else HIGH_PRECISION.plus(value)
    unit = Decimal(1).scaleb(-places)
    scaled = HIGH_PRECISION.divide(exact, unit)
    fraction = abs(scaled) - abs(scaled).to_integral_value(rounding=ROUND_FLOOR)
    margin = max(BOUNDARY_MARGIN, HIGH_PRECISION.multiply(abs(exact), RELATIVE_BOUNDARY_MARGIN))
    if HIGH_PRECISION.multiply(abs(fraction - Decimal("0.5")), unit) < margin:
        raise RejectDraw(f"{exact} is within {margin} of a rounding boundary at {places} places")
    return exact.quantize(unit, rounding=ROUND_HALF_UP, context=HIGH_PRECISION)


def fixed(value: Fraction | Decimal | int, places: int) -> str:
    """Exact decimal text with ``places`` decimals (``value`` must already be that precise)."""
    quantized = to_decimal(value).quantize(Decimal(1).scaleb(-places), context=HIGH_PRECISION)
    if to_decimal(value) != quantized:
        raise ValueError(f"{value} is not exact at {places} places")
    return f"{quantized:f}"


def money(cents: int) -> str:
    """``1234`` -> ``"12.34"``."""
    return fixed(Fraction(cents, 100), 2)


def plain(value: Fraction | Decimal | int) -> str:
    """Shortest exact decimal text of a terminating value (``Fraction(5, 2)`` -> ``"2.5"``)."""
    return f"{to_decimal(value).normalize(context=HIGH_PRECISION):f}"
