"""math_tir grader (environments.md section 6, math_tir item 4)."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.envs.math_tir.grading import compare, extract_answer, extract_boxed, grade, parse_number, parse_tuple
from streamrl.envs.math_tir.mathverify import MathVerifyChecker, math_verify_installed


@pytest.mark.parametrize(
    "written", ["\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "\\boxed{\\dfrac12}", "\\boxed{1/2}", "\\boxed{\\tfrac{1}{2}}"]
)
def test_one_half_in_every_spelling(written):
    assert grade(f"so the answer is {written}.", "0.5").correct
    assert grade(f"so the answer is {written}.", "\\frac{1}{2}").correct


def test_thousands_commas_currency_and_percent():
    assert grade("\\boxed{1,319}", "1319").correct
    assert grade("\\boxed{\\$1,234.50}", "1234.50").correct
    assert grade("\\boxed{25\\%}", "25").correct
    assert grade("\\boxed{12.5 \\text{ km}}", "12.5").correct
    assert not grade("\\boxed{1,318}", "1319").correct


def test_nested_braces_and_the_last_box_wins():
    assert extract_boxed("\\boxed{\\frac{\\sqrt{2}}{2}}") == "\\frac{\\sqrt{2}}{2}"
    text = "First guess \\boxed{3}, but on reflection \\boxed{\\frac{7}{2}}."
    assert extract_boxed(text) == "\\frac{7}{2}"
    assert grade(text, "3.5").correct and not grade(text, "3").correct
    assert extract_boxed("\\fbox{9} then \\boxed 10.") == "10"
    assert extract_boxed("unclosed \\boxed{12") is None


def test_strict_mode_needs_a_box():
    assert grade("The answer is 42.", "42").pred is None
    assert not grade("The answer is 42.", "42").correct
    relaxed = grade("The answer is 42.", "42", strict=False)
    assert relaxed.correct and relaxed.pred == "42"
    assert extract_answer("... so we get 17 and then 18", strict=False) == "18"


def test_integers_are_exact_decimals_use_relative_tolerance_capped_by_stated_places():
    assert not compare("1319.0000001", "1319")
    assert compare("1319.0", "1319")
    assert compare("12.3499999", "12.35")  # within 1e-6 relative
    assert not compare("12.34", "12.35")
    assert not compare("250000.2", "250000.00")  # 1e-6 relative would allow 0.25
    assert compare("0.333333333", "\\frac{1}{3}")
    assert compare("-0.5", "-\\frac{1}{2}") and compare("1\\frac{1}{2}", "1.5")
    assert compare("3 \\times 10^{4}", "30000")


def test_ordered_triples():
    assert compare("(1, -2, 3)", "(1, -2, 3)")
    assert compare("\\left(1,-2,3\\right)", "(1, -2, 3)")
    assert compare("x=1, y=-2, z=3", "(1, -2, 3)")
    assert compare("(1, -2)", "(1, -2, 3)") is False
    assert compare("(1, 2, 3)", "(1, -2, 3)") is False
    assert parse_tuple("(1, 2)") == (Fraction(1), Fraction(2))


def test_text_answers_such_as_weekdays():
    assert grade("\\boxed{\\text{Tuesday}}", "Tuesday").correct
    assert grade("\\boxed{tuesday.}", "Tuesday").correct
    assert not grade("\\boxed{Monday}", "Tuesday").correct


def test_unreadable_prediction_is_undecided_not_right():
    assert compare("\\sqrt{2}/2", "0.7071067811865476") is None
    assert not grade("\\boxed{\\sqrt{2}/2}", "0.7071067811865476").correct


@settings(max_examples=80, deadline=None)
@given(st.fractions(min_value=-(10**6), max_value=10**6, max_denominator=1000))
def test_numbers_round_trip_through_their_spellings(value):
    assert parse_number(f"\\frac{{{value.numerator}}}{{{value.denominator}}}") == value
    assert parse_number(f"{value.numerator}/{value.denominator}") == value
    if value.denominator == 1:
        assert parse_number(f"{int(value):,}") == value
        assert grade(f"\\boxed{{{int(value):,}}}", str(int(value))).correct


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200), st.text(max_size=30))
def test_grading_never_raises(text, truth):
    result = grade(text, truth)
    assert isinstance(result.correct, bool)


class _Recorder:
    def __init__(self, verdict):
        self.verdict, self.calls = verdict, []

    def check(self, pred, truth):
        self.calls.append((pred, truth))
        return self.verdict


def test_symbolic_checker_is_consulted_only_when_the_builtin_rules_cannot_decide():
    checker = _Recorder(True)
    assert grade("\\boxed{\\frac{\\sqrt{2}}{2}}", "0.7071067811865476", checker=checker).method == "math_verify"
    assert checker.calls == [("\\frac{\\sqrt{2}}{2}", "0.7071067811865476")]
    assert grade("\\boxed{3}", "4", checker=checker).method == "builtin"
    assert len(checker.calls) == 1


@pytest.mark.skipif(not math_verify_installed(), reason="math-verify is not installed (optional extra 'math')")
def test_math_verify_path_runs_with_timeouts_off_from_threads():
    checker = MathVerifyChecker(timeout_s=20.0)
    results: dict[int, object] = {}
    cases = [
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{2}", False),
        ("(1,2)", "(1, 2)", True),
        ("x^2+2x+1", "(x+1)^2", True),
    ]

    def worker(index: int, pred: str, truth: str) -> None:
        try:
            results[index] = checker.check(pred, truth)
        except Exception as exc:  # a SIGALRM in a thread would surface here
            results[index] = exc

    try:
        threads = [threading.Thread(target=worker, args=(i, pred, truth)) for i, (pred, truth, _) in enumerate(cases)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        checker.close()
    assert [results.get(i) for i in range(len(cases))] == [want for _, _, want in cases]
