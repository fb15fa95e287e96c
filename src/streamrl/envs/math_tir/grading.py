"""Grading final answers: a pure-Python ``\\boxed{}`` extractor and an exact numeric comparison.

The ground truth decides how a prediction is read:

* a number: ``Fraction`` comparison after stripping ``$``, ``%``, thousands commas, ``\\text{}``
  units and LaTeX spacing; ``\\frac{1}{2}``, ``\\dfrac12``, ``1/2``, mixed numbers and
  scientific notation are understood. Integers must match exactly; other values within a
  relative tolerance of 1e-6, but never looser than half a unit in the truth's last stated
  decimal (so ``250000.00`` does not accept ``250000.2``);
* an ordered tuple such as ``(1, -2, 3)``: element by element, same rules;
* anything else: normalised text (case, spacing, ``\\text{}``, surrounding punctuation).

When the truth is numeric but the prediction cannot be read (``\\sqrt2/2`` for ``0.7071...``),
or the truth is neither a number nor a tuple, the optional ``math-verify`` checker decides
when it is installed (see ``mathverify.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Protocol

RELATIVE_TOLERANCE = 1e-6

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_SPACING = re.compile(r"\\[,;:! ]|\\quad|\\qquad|~|\\left|\\right|\\displaystyle")
_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DECIMAL = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SLASH_FRACTION = re.compile(r"([-+]?\d+)\s*/\s*([-+]?\d+)")
_LATEX_FRACTION = re.compile(
    r"(?P<sign>[-+]?)(?P<whole>\d+)?\\[dt]?frac\s*(?:\{(?P<a>[^{}]+)\}|(?P<a1>\d))\s*(?:\{(?P<b>[^{}]+)\}|(?P<b1>\d))"
)
_TIMES_POWER = re.compile(r"(?P<m>[-+]?\d+(?:\.\d+)?)\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?(?P<e>[-+]?\d+)\}?")
_UNIT_TAIL = re.compile(r"^(?P<number>.*?\d)\s*(?:[a-zA-Z°][a-zA-Z°/.\s]*)$")


def _closing_brace(text: str, open_at: int) -> int | None:
    depth = 0
    for index in range(open_at, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``); nested braces are
    kept. ``\\boxed 5`` (no braces) gives ``"5"``. None when there is no complete box."""
    found: list[tuple[int, str]] = []
    for command in _BOX_COMMANDS:
        start = 0
        while (at := text.find(command, start)) >= 0:
            after = at + len(command)
            start = after
            rest = text[after:]
            if rest.startswith("{"):
                end = _closing_brace(text, after)
                if end is not None:
                    found.append((at, text[after + 1 : end]))
            elif rest[:1] == " ":
                token = rest.strip().split()
                if token:
                    found.append((at, token[0].rstrip(".,;$")))
    return max(found)[1].strip() if found else None


def _strip_decorations(text: str) -> str:
    text = _SPACING.sub(" ", text)
    while True:
        unwrapped = _TEXT_WRAPPERS.sub(r" \1 ", text)
        if unwrapped == text:
            break
        text = unwrapped
    for token in ("\\$", "$", "\\%", "%", "^\\circ", "^{\\circ}", "°", "\\!"):
        text = text.replace(token, " ")
    return " ".join(text.split()).strip().rstrip(".")


def _plain_number(text: str) -> Fraction | None:
    text = text.replace(" ", "")
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    if _DECIMAL.fullmatch(text):
        try:
            return Fraction(Decimal(text))
        except (InvalidOperation, ValueError):
            return None
    if match := _SLASH_FRACTION.fullmatch(text):
        numerator, denominator = int(match.group(1)), int(match.group(2))
        return Fraction(numerator, denominator) if denominator else None
    if match := _TIMES_POWER.fullmatch(text):
        return Fraction(Decimal(match.group("m"))) * Fraction(10) ** int(match.group("e"))
    if match := _LATEX_FRACTION.fullmatch(text):
        top = _plain_number(match.group("a") or match.group("a1"))
        bottom = _plain_number(match.group("b") or match.group("b1"))
        if top is None or not bottom:
            return None
        value = top / bottom + int(match.group("whole") or 0)
        return -value if match.group("sign") == "-" else value
    return None


def parse_number(text: str) -> Fraction | None:
    """A number written in any common way, or None. ``"$1,319"`` -> 1319, ``"\\dfrac12"`` -> 1/2,
    ``"12.5 km"`` -> 25/2, ``"x = -3"`` -> -3."""
    cleaned = _strip_decorations(text)
    if "=" in cleaned:
        cleaned = cleaned.rsplit("=", 1)[1].strip()
    value = _plain_number(cleaned)
    if value is None and (match := _UNIT_TAIL.match(cleaned)):
        value = _plain_number(match.group("number"))
    return value


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def parse_tuple(text: str) -> tuple[Fraction, ...] | None:
    """``"(1, -2, 3)"`` (or brackets, or ``x=1, y=-2, z=3``) -> a tuple of Fractions; None if
    any element is not a number or there are fewer than two."""
    cleaned = _SPACING.sub(" ", text).strip().rstrip(".")
    if cleaned[:1] in "([" and cleaned[-1:] in ")]":
        cleaned = cleaned[1:-1]
    parts = _split_top_level(cleaned)
    if len(parts) < 2:
        return None
    values = [parse_number(part) for part in parts]
    return tuple(v for v in values if v is not None) if None not in values else None


def normalize_text(text: str) -> str:
    cleaned = _strip_decorations(text).lower()
    cleaned = re.sub(r"^(the|a|an)\s+", "", cleaned)
    return re.sub(r"[\s.,;:!'\"()\[\]{}]+", " ", cleaned).strip()


def _decimal_places(text: str) -> int | None:
    """Places after the point in a plain decimal truth (``"12.50"`` -> 2); None otherwise."""
    cleaned = _strip_decorations(text).replace(",", "")
    if re.fullmatch(r"[-+]?\d+\.\d+", cleaned):
        return len(cleaned.split(".")[1])
    return None


def _numbers_match(pred: Fraction, truth: Fraction, truth_text: str, rel_tol: float) -> bool:
    if pred == truth:
        return True
    places = _decimal_places(truth_text)
    if truth.denominator == 1 and places is None:
        return False  # integers are exact
    tolerance = Fraction(rel_tol) * abs(truth)
    if places is not None:
        tolerance = min(tolerance, Fraction(1, 2 * 10**places))
    return abs(pred - truth) <= tolerance


def answer_kind(truth: str) -> str:
    """How ``truth`` is compared: ``"number"``, ``"tuple"`` or ``"text"``."""
    if parse_tuple(truth) is not None and "," in truth and truth.strip()[:1] in "([":
        return "tuple"
    return "number" if parse_number(truth) is not None else "text"


def compare(pred: str, truth: str, rel_tol: float = RELATIVE_TOLERANCE) -> bool | None:
    """True/False when the built-in rules can decide; None when the prediction cannot be read
    as the truth's kind (a symbolic checker may still decide)."""
    kind = answer_kind(truth)
    if kind == "tuple":
        want, got = parse_tuple(truth), parse_tuple(pred)
        if want is None or got is None:
            return None
        parts = [p.strip() for p in _split_top_level(truth.strip()[1:-1])]
        return len(got) == len(want) and all(_numbers_match(g, w, t, rel_tol) for g, w, t in zip(got, want, parts))
    if kind == "number":
        want_number, value = parse_number(truth), parse_number(pred)
        if want_number is None or value is None:
            return None
        return _numbers_match(value, want_number, truth, rel_tol)
    return True if normalize_text(pred) == normalize_text(truth) else None


_ANSWER_PHRASE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(?P<answer>[^\n]+)", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str, strict: bool = True) -> str | None:
    """The model's final answer: the last ``\\boxed{}``; in non-strict mode, else the text after
    the last "answer is"/"Answer:", else the last number in the text."""
    boxed = extract_boxed(text)
    if boxed is not None or strict:
        return boxed
    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases:
        return phrases[-1].group("answer").strip().rstrip(".")
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1] if numbers else None


class SymbolicChecker(Protocol):
    """A fallback for answers the built-in rules cannot read (``mathverify.MathVerifyChecker``)."""

    def check(self, pred: str, truth: str) -> bool | None: ...


@dataclass(frozen=True)
class Grade:
    correct: bool
    pred: str | None
    method: str  # "builtin", "math_verify", or "no_answer"


def grade(text: str, truth: str, *, strict: bool = True, checker: SymbolicChecker | None = None) -> Grade:
    """Grade a final turn against ``truth``; ``checker`` decides what the built-in rules cannot."""
    pred = extract_answer(text, strict=strict)
    if pred is None:
        return Grade(False, None, "no_answer")
    decided = compare(pred, truth)
    if decided is None and checker is not None:
        verdict = checker.check(pred, truth)
        if verdict is not None:
            return Grade(bool(verdict), pred, "math_verify")
    return Grade(bool(decided), pred, "builtin")
