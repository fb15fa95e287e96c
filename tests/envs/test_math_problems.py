"""math_tir generator (environments.md section 6, math_tir item 5).

Every answer is re-derived here by a second, independent implementation: plain floats (with
``log1p``/``exp`` for long compounding), the ``statistics`` module, numpy for linear systems,
a civil-calendar day count and Zeller's congruence for dates, trial division for factors.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import statistics
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from streamrl.envs.math_tir.problems import (
    DISTRACTORS,
    FAMILIES,
    FAMILY_NAMES,
    TEST_SIZE,
    TRAIN_SEED_LIMIT,
    Knobs,
    eval_set,
    generate,
    ood_indices,
    train_problem,
)
from streamrl.envs.math_tir.problems.exact import RejectDraw, round_stated

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


# ----------------------------------------------------------------------------- independent solvers
def _round_half_up(value: float, places: int) -> float:
    scaled = abs(value) * 10**places
    return math.copysign(math.floor(scaled + 0.5), value) / 10**places


def _growth(rate: float, periods: int, count: int) -> float:
    return math.exp(count * math.log1p(rate / periods))


def _float_payment(principal: float, rate_percent: float, months: int) -> float:
    i = rate_percent / 1200
    return principal * i / (1 - math.exp(-months * math.log1p(i)))


def _days_from_civil(iso: str) -> int:
    year, month, day = map(int, iso.split("-"))
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy


def _zeller_weekday(iso: str) -> str:
    year, month, day = map(int, iso.split("-"))
    if month < 3:
        month, year = month + 12, year - 1
    h = (day + 13 * (month + 1) // 5 + year % 100 + (year % 100) // 4 + (year // 100) // 4 + 5 * (year // 100)) % 7
    return WEEKDAYS[(h + 5) % 7]  # Zeller: 0 = Saturday


def _largest_prime_factor(number: int) -> int:
    largest, divisor = 1, 2
    while divisor * divisor <= number:
        while number % divisor == 0:
            largest, number = divisor, number // divisor
        divisor += 1
    return max(largest, number)


def _euclid(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _power_mod(base: int, exponent: int, modulus: int) -> int:
    result, base = 1, base % modulus
    while exponent:
        if exponent & 1:
            result = result * base % modulus
        base, exponent = base * base % modulus, exponent >> 1
    return result


def _money_float(problem) -> tuple[float, int]:
    """(unrounded value, places) for the families whose answer is a rounded decimal."""
    p, template = problem.params, problem.template.split("/")[1]
    f = float
    if problem.family == "compound_interest":
        rate = f(p["rate_percent"]) / 100
        if p["periods_per_year"] is None:
            amount = p["principal"] * math.exp(rate * p["years"])
        else:
            n = p["periods_per_year"]
            amount = p["principal"] * _growth(rate, n, n * p["years"])
        return (amount - p["principal"] if p["ask"] == "interest" else amount), 2
    if problem.family == "loan_payment":
        if template == "car_loan":
            principal = f(p["price"]) * (100 - p["down_percent"]) / 100
            return _float_payment(principal, f(p["rate_percent"]), 12 * p["years"]), 2
        months = 12 * p["years"]
        payment = _float_payment(p["principal"], f(p["rate_percent"]), months)
        if p["ask"] == "payment":
            return payment, 2
        cents = round(_round_half_up(payment, 2) * 100) * months
        return (cents / 100 - p["principal"] if p["ask"] == "interest" else cents / 100), 2
    if problem.family == "percent_chain":
        if template == "restaurant_bill":
            value = f(p["bill"]) * (1 - p["discount_percent"] / 100) * (1 + f(p["tax_percent"]) / 100)
            return value * (1 + p["tip_percent"] / 100), 2
        if template in ("price_changes", "salary_raises"):
            return math.prod([f(p["start"])] + [1 + f(c) / 100 for c in p["changes_percent"]]), 2
        if template == "percent_change":
            return (f(p["new"]) - f(p["old"])) / f(p["old"]) * 100, 2
        return f(p["after"]) / (1 + f(p["increase_percent"]) / 100), 2
    if problem.family == "unit_conversion":
        total = sum(map(f, p.get("values", [])))
        if template == "road_trip_meters":
            return total * 1.609344 * 1000, 0
        if template == "fuel_liters":
            return total * 3.785411784, 2
        if template == "parcel_kg":
            return total * 0.45359237, 2
        if template == "oven_kelvin":
            return (p["start"] + sum(p["raises"]) - 32) * 5 / 9 + 273.15, 2
        if template == "speed_ms":
            return f(p["mph"]) * 1.609344 * 1000 / 3600, 2
        return (f(p["start"]) - sum(map(f, p["drops"]))) * 9 / 5 + 32, 1
    if problem.family == "statistics":
        values = list(map(f, p["values"]))
        pick = {
            "test_scores_mean": statistics.fmean,
            "house_prices_median": statistics.median,
            "temperatures_pstdev": statistics.pstdev,
            "delivery_times_sstdev": statistics.stdev,
        }[template]
        return pick(values), 2
    if problem.family == "inventory":
        if template == "supply_costs":
            costs = [q * f(c) for q, c in p["purchases"]]
            return sum(costs) - p["returned"] * f(p["purchases"][0][1]), 2
        if template == "warehouse_value":
            stock = p["start"] + sum(q if kind == "receive" else -q for kind, q in p["ops"])
            return stock * f(p["unit_price"]), 2
        sales = sum(op[1] * f(op[2]) for op in p["ops"] if op[0] == "sell")
        return sales - sum(op[1] * f(op[2]) for op in p["ops"] if op[0] == "refund"), 2
    raise AssertionError(f"no float solver for {problem.family}")


def rederive(problem) -> str | int | tuple | float:
    """The answer by the independent route, in a comparable form."""
    p, template = problem.params, problem.template.split("/")[1]
    if problem.family == "number_theory":
        if template == "committee":
            return math.factorial(p["n"]) // (math.factorial(p["k"]) * math.factorial(p["n"] - p["k"]))
        if template == "power_mod":
            return _power_mod(p["base"], p["exponent"], p["modulus"])
        if template == "gcd_three":
            return _euclid(_euclid(p["values"][0], p["values"][1]), p["values"][2])
        if template == "lcm_three":
            a, b, c = p["values"]
            ab = a * b // _euclid(a, b)
            return ab * c // _euclid(ab, c)
        return _largest_prime_factor(p["number"])
    if problem.family == "dates":
        if template == "weekday_after":
            return WEEKDAYS[(WEEKDAYS.index(_zeller_weekday(p["start"])) + p["offset"]) % 7]
        days = _days_from_civil(p["second"]) - _days_from_civil(p["first"])
        return days + 1 if template == "inclusive_days" else days
    if problem.family == "linear_system":
        solution = np.linalg.solve(np.array(p["matrix"], dtype=float), np.array(p["rhs"], dtype=float))
        return tuple(int(round(x)) for x in solution)
    value, places = _money_float(problem)
    boundary = (math.floor(abs(value) * 10**places) + 0.5) / 10**places
    assert abs(abs(value) - boundary) > 0.5e-6, f"{problem.task_id} lies on a rounding boundary: {value}"
    return _round_half_up(value, places)


def _check(problem) -> None:
    expected = rederive(problem)
    if isinstance(expected, float):
        assert abs(expected - float(problem.answer)) <= 1e-9 * max(1.0, abs(expected)), (problem, expected)
    elif isinstance(expected, tuple):
        assert problem.answer == "(" + ", ".join(map(str, expected)) + ")", (problem, expected)
    else:
        assert problem.answer == str(expected), (problem, expected)


def _numbers_in(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [n for item in value for n in _numbers_in(item)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [str(abs(value))]
    if isinstance(value, str) and value.lstrip("-").replace(".", "", 1).isdigit():
        return [value.lstrip("-")]
    return []


def _parse_equations(question: str) -> list[list[int]]:
    """Coefficient rows of "Solve the system of equations: 2x - y + 3z = 4; ..." (rhs last)."""
    body = question.split(":", 1)[1].split(".")[0]
    rows = []
    for equation in body.split(";"):
        left, right = equation.split("=")
        row = [0, 0, 0]
        for sign, size, name in re.findall(r"([-+]?)\s*(\d*)([xyz])", left):
            row["xyz".index(name)] = (-1 if sign == "-" else 1) * int(size or 1)
        rows.append(row + [int(right)])
    return rows


def _check_text_states_params(problem) -> None:
    """Every stated number in ``params`` occurs in the question (dates are spoken, so skipped;
    the equations of a plain system are parsed back instead)."""
    if problem.template == "linear_system/equations":
        rows = _parse_equations(problem.question)
        assert [r[:3] for r in rows] == problem.params["matrix"] and [r[3] for r in rows] == problem.params["rhs"]
        return
    skip = (
        {"ask", "periods_per_year", "first", "second", "start"}
        if problem.family == "dates"
        else {"ask", "periods_per_year"}
    )
    for key, value in problem.params.items():
        if key in skip:
            continue
        for number in _numbers_in(value):
            assert number in problem.question, f"{problem.task_id}: {key}={number} not in the question"


# ----------------------------------------------------------------------------- tests
def test_every_evaluation_answer_is_rederived_independently():
    problems = eval_set()
    assert len(problems) == TEST_SIZE == 1500
    for problem in problems:
        _check(problem)
        _check_text_states_params(problem)


@pytest.mark.parametrize(
    "knobs", [Knobs(), Knobs(digits=1, n_steps=1), Knobs(digits=12, n_steps=12, distractors=3)], ids=str
)
def test_training_answers_are_rederived_at_every_knob_setting(knobs):
    for seed in range(0, 450):
        problem = train_problem(seed, knobs)
        _check(problem)
        _check_text_states_params(problem)


def test_all_nine_families_are_stratified_in_the_evaluation_set():
    counts = Counter(p.family for p in eval_set())
    assert set(counts) == set(FAMILY_NAMES) and len(FAMILY_NAMES) == 9
    assert max(counts.values()) - min(counts.values()) <= 1


def test_ood_slice_uses_only_held_out_templates_and_training_never_does():
    problems = eval_set()
    ood = set(ood_indices())
    assert 250 <= len(ood) <= 350
    for index, problem in enumerate(problems):
        family = FAMILIES[problem.family]
        template = problem.template.split("/")[1]
        assert problem.held_out == (index in ood)
        assert template in (family.held_out if problem.held_out else family.templates)
    for family in FAMILIES.values():
        assert {p.template.split("/")[1] for p in problems if p.family == family.name and p.held_out} == set(
            family.held_out
        )
    train_templates = {train_problem(seed).template.split("/")[1] for seed in range(2000)}
    held_out = {t for family in FAMILIES.values() for t in family.held_out}
    assert not train_templates & held_out


def test_generation_is_deterministic_across_processes():
    digest = hashlib.sha256("".join(p.question + p.answer for p in eval_set()).encode()).hexdigest()
    code = (
        "import hashlib; from streamrl.envs.math_tir.problems import eval_set; "
        "print(hashlib.sha256(''.join(p.question + p.answer for p in eval_set()).encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert other.stdout.strip() == digest
    assert train_problem(77) == train_problem(77)
    assert generate("dates", 5, knobs=Knobs(distractors=2)) == generate("dates", 5, knobs=Knobs(distractors=2))


def test_train_and_test_are_disjoint():
    with pytest.raises(ValueError, match="train seed"):
        train_problem(TRAIN_SEED_LIMIT)
    with pytest.raises(ValueError, match="train seed"):
        train_problem(-1)
    test_questions = {p.question for p in eval_set()}
    assert not any(train_problem(seed).question in test_questions for seed in range(3000))


def _first_seed(family: str, templates: tuple[str, ...]) -> int:
    return next(seed for seed in range(1000) if generate(family, seed).template.split("/")[1] in templates)


def test_knobs_change_size_length_and_distractors_but_not_the_answer():
    seed = _first_seed("inventory", ("warehouse_value",))
    small, large = (generate("inventory", seed, knobs=Knobs(digits=d)) for d in (3, 5))
    assert len(str(small.params["start"])) == 3 and len(str(large.params["start"])) == 5
    seed = _first_seed("percent_chain", ("price_changes",))
    short, long = (generate("percent_chain", seed, knobs=Knobs(n_steps=n)) for n in (2, 5))
    assert len(short.params["changes_percent"]) == 2 and len(long.params["changes_percent"]) == 5
    plain, noisy = (generate("loan_payment", 9, knobs=Knobs(distractors=d)) for d in (0, 3))
    assert plain.answer == noisy.answer and plain.params == noisy.params
    stems = [d.split("{n}")[0] or d.split("{n}")[1] for d in DISTRACTORS]
    assert sum(noisy.question.count(stem) for stem in stems) == 3
    assert sum(plain.question.count(stem) for stem in stems) == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"digits": 0}, "digits"),
        ({"n_steps": 13}, "n_steps"),
        ({"distractors": 9}, "distractors"),
        ({"digits": True}, "digits"),
    ],
)
def test_bad_knobs_are_rejected_with_the_knob_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Knobs(**kwargs)


def test_unknown_family_is_named():
    with pytest.raises(ValueError, match="unknown math_tir family 'algebra'"):
        generate("algebra", 1)


def test_rounding_is_half_up_and_boundary_draws_are_rejected():
    assert str(round_stated(Fraction(12344, 1000), 2)) == "12.34"
    assert str(round_stated(Fraction(123451, 10000) + Fraction(1, 10**5), 2)) == "12.35"
    assert str(round_stated(Decimal("-2.3449"), 2)) == "-2.34"
    for tie in (Fraction(12345, 1000), Fraction(12345, 1000) + Fraction(1, 10**7), Decimal("-0.125")):
        with pytest.raises(RejectDraw):
            round_stated(tie, 2)
    with pytest.raises(RejectDraw):  # the relative margin for large values
        round_stated(Decimal("36000000.005") + Decimal("1e-5"), 2)
