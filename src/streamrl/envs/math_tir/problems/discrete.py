"""Exact families: combinatorics and number theory, statistics, dates, 3x3 linear systems."""

from __future__ import annotations

import datetime
import math
import random
from decimal import Decimal
from fractions import Fraction

from streamrl.envs.math_tir.problems.exact import HIGH_PRECISION, RejectDraw, fixed, round_stated, to_decimal
from streamrl.envs.math_tir.problems.model import Draft, Family, Knobs, digits_number

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def _prime_with_digits(rng: random.Random, digits: int) -> int:
    candidate = digits_number(rng, digits) | 1
    while not _is_prime(candidate):
        candidate += 2
    return candidate


# ----------------------------------------------------------------------------- number theory
def build_number_theory(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    if template == "committee":
        n = rng.randint(20, 60)
        k = rng.randint(3, n // 2)
        context = [
            f"A club has {n} members.",
            "A committee is any group of members; the order of choosing does not matter.",
        ]
        return Draft(
            context,
            f"How many different committees of exactly {k} members can be formed?",
            str(math.comb(n, k)),
            {"n": n, "k": k},
        )
    if template == "power_mod":
        digits = knobs.pick_digits(rng, 3, 6)
        base, exponent, modulus = (
            digits_number(rng, digits),
            digits_number(rng, digits + 1),
            digits_number(rng, digits) + 2,
        )
        context = [f"Consider the number {base}^{exponent}, which is far too large to write out."]
        ask = f"What is the remainder when {base}^{exponent} is divided by {modulus}?"
        return Draft(
            context, ask, str(pow(base, exponent, modulus)), {"base": base, "exponent": exponent, "modulus": modulus}
        )
    if template in ("gcd_three", "lcm_three"):
        if template == "gcd_three":
            digits = knobs.pick_digits(rng, 5, 8)
            common = digits_number(rng, max(2, digits - 4))
            values = [common * digits_number(rng, digits - len(str(common)) + 1) for _ in range(3)]
            context = [
                f"Three rolls of fabric are {values[0]}, {values[1]} and {values[2]} millimeters long.",
                "They must all be cut into pieces of one equal length, with nothing left over.",
            ]
            ask = "What is the greatest possible piece length, in millimeters?"
            answer = math.gcd(*values)
        else:
            values = [rng.randint(12, 10 ** knobs.pick_digits(rng, 2, 3) - 1) for _ in range(3)]
            context = [
                f"Three buses leave the depot together at noon; they return to it every {values[0]}, {values[1]} and {values[2]} minutes, respectively."
            ]
            ask = "After how many minutes are all three buses back at the depot at the same time for the first time?"
            answer = math.lcm(*values)
        return Draft(context, ask, str(answer), {"values": values})
    # largest_prime_factor
    total_digits = knobs.pick_digits(rng, 7, 9)
    largest = _prime_with_digits(rng, rng.randint(3, min(5, total_digits - 2)))
    number, factors = largest, [largest]
    while len(str(number)) < total_digits:
        factor = _prime_with_digits(rng, rng.randint(1, max(1, len(str(largest)) - 1)))
        if factor > largest or len(str(number * factor)) > total_digits:
            factor = rng.choice((2, 3, 5, 7))
        number, factors = number * factor, factors + [factor]
    if len(str(number)) != total_digits:
        raise RejectDraw("overshot the digit count")
    context = [f"The number {number} is a product of primes."]
    return Draft(context, f"What is the largest prime factor of {number}?", str(max(factors)), {"number": number})


# ----------------------------------------------------------------------------- statistics
def build_statistics(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    size = rng.randint(10, 20)
    digits = knobs.pick_digits(rng, 2, 3)
    low, high = 10 ** (digits - 1), 10**digits - 1
    if template == "temperatures_pstdev":
        values = [Fraction(rng.randint(-150, 400), 10) for _ in range(size)]
        shown = [fixed(v, 1) for v in values]
    else:
        values = [Fraction(rng.randint(low, high)) for _ in range(size)]
        shown = [str(v) for v in values]
    listed = ", ".join(shown)
    mean = sum(values, Fraction(0)) / size
    value: Fraction | Decimal
    if template == "test_scores_mean":
        context, ask, value = (
            [f"A class of {size} students scored {listed} points on a test."],
            "What is the mean score? Round to 2 decimal places.",
            mean,
        )
    elif template == "house_prices_median":
        ordered = sorted(values)
        median = (ordered[(size - 1) // 2] + ordered[size // 2]) / 2
        context = [f"The sale prices of {size} houses on one street were {listed} thousand dollars."]
        ask, value = "What is the median sale price, in thousands of dollars? Give it with 2 decimal places.", median
    else:
        sample = template == "delivery_times_sstdev"
        squares = sum(((v - mean) ** 2 for v in values), Fraction(0))
        variance = squares / (size - 1 if sample else size)
        value = HIGH_PRECISION.sqrt(to_decimal(variance))
        if sample:
            context = [f"A courier timed {size} deliveries, in minutes: {listed}."]
            ask = "What is the sample standard deviation (dividing by n - 1) of these times? Round to 2 decimal places."
        else:
            context = [f"The noon temperatures on {size} days, in degrees Celsius, were {listed}."]
            ask = "What is the population standard deviation (dividing by n) of these temperatures? Round to 2 decimal places."
    return Draft(context, ask, f"{round_stated(value, 2):f}", {"values": shown})


# ----------------------------------------------------------------------------- dates
def _random_date(rng: random.Random) -> datetime.date:
    return datetime.date(1950, 1, 1) + datetime.timedelta(days=rng.randint(0, 36500))


def _spoken(day: datetime.date) -> str:
    return f"{MONTHS[day.month - 1]} {day.day}, {day.year}"


def build_dates(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    if template == "weekday_after":
        start = _random_date(rng)
        offset = digits_number(rng, knobs.pick_digits(rng, 3, 5))
        context = [f"{_spoken(start)} was a {WEEKDAYS[start.weekday()]}."]
        ask = f"What day of the week was it (or will it be) {offset} days after {_spoken(start)}? Answer with the weekday's name."
        later = start + datetime.timedelta(days=offset)
        return Draft(context, ask, WEEKDAYS[later.weekday()], {"start": start.isoformat(), "offset": offset})
    first, second = sorted((_random_date(rng), _random_date(rng)))
    if first == second:
        raise RejectDraw("same day twice")
    params = {"first": first.isoformat(), "second": second.isoformat()}
    days = (second - first).days
    if template == "days_between":
        context = [f"A project started on {_spoken(first)} and its final report was delivered on {_spoken(second)}."]
        return Draft(context, "How many days after the start was the report delivered?", str(days), params)
    if template == "age_in_days":
        context = [f"{rng.choice(('Ada', 'Bo', 'Cyrus', 'Dana'))} was born on {_spoken(first)}."]
        return Draft(
            context,
            f"How many days old is this person on {_spoken(second)}? (The day of birth counts as 0 days old.)",
            str(days),
            params,
        )
    # inclusive_days (held out)
    context = [f"An exhibition opens on {_spoken(first)} and closes after its last day, {_spoken(second)}."]
    return Draft(
        context,
        "On how many calendar days is the exhibition open, counting both the first and the last day?",
        str(days + 1),
        params,
    )


# ----------------------------------------------------------------------------- linear systems
def _det3(m: list[list[int]]) -> int:
    return (
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    )


def _term(coefficient: int, name: str, first: bool) -> str:
    sign = "-" if coefficient < 0 else ("" if first else "+")
    size = abs(coefficient)
    body = name if size == 1 else f"{size}{name}"
    return f"{sign}{body}" if first else f"{sign} {body}"


def _equation(row: list[int], rhs: int) -> str:
    terms = [(c, n) for c, n in zip(row, "xyz") if c != 0]
    return " ".join(_term(c, n, i == 0) for i, (c, n) in enumerate(terms)) + f" = {rhs}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def build_linear_system(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    word_problem = template in ("fruit_prices", "ticket_sales")
    bound = 10 ** knobs.pick_digits(rng, 1, 2) - 1
    if word_problem:
        solution = [rng.randint(1, max(2, bound)) for _ in range(3)]
        matrix = [[rng.randint(1, 6) for _ in range(3)] for _ in range(3)]
    else:
        solution = [rng.randint(-bound, bound) for _ in range(3)]
        matrix = [[rng.randint(-9, 9) for _ in range(3)] for _ in range(3)]
    if _det3(matrix) == 0 or any(all(c == 0 for c in row) for row in matrix):
        raise RejectDraw("singular system")
    rhs = [sum(c * s for c, s in zip(row, solution)) for row in matrix]
    answer = "(" + ", ".join(str(s) for s in solution) + ")"
    params = {"matrix": matrix, "rhs": rhs}
    if template == "equations":
        context = [
            "Solve the system of equations: " + "; ".join(_equation(row, b) for row, b in zip(matrix, rhs)) + "."
        ]
        return Draft(context, "Give the solution as an ordered triple (x, y, z).", answer, params)
    if template == "matrix_form":
        rows = "; ".join("[" + ", ".join(map(str, row)) + "]" for row in matrix)
        context = [f"Let A be the 3x3 matrix with rows {rows}, and let b = ({', '.join(map(str, rhs))})."]
        return Draft(context, "Find the vector v = (v1, v2, v3) with A v = b, as an ordered triple.", answer, params)
    if template == "fruit_prices":
        context = [
            f"{_count(row[0], 'apple')}, {_count(row[1], 'pear')} and {_count(row[2], 'melon')} cost ${b} together."
            for row, b in zip(matrix, rhs)
        ]
        context.insert(0, "At a market, each kind of fruit has a fixed whole-dollar price.")
        return Draft(
            context,
            "What are the prices of one apple, one pear and one melon, in dollars? Answer as an ordered triple (apple, pear, melon).",
            answer,
            params,
        )
    # ticket_sales
    days = ("Friday", "Saturday", "Sunday")
    context = ["A theater sells adult, child and senior tickets, each at a fixed whole-dollar price."]
    context += [
        f"On {day} it sold {row[0]} adult, {row[1]} child and {row[2]} senior tickets for ${b} in total."
        for day, row, b in zip(days, matrix, rhs)
    ]
    return Draft(
        context,
        "What are the three ticket prices in dollars? Answer as an ordered triple (adult, child, senior).",
        answer,
        params,
    )


FAMILIES = (
    Family(
        "number_theory",
        ("committee", "power_mod", "gcd_three", "largest_prime_factor"),
        ("lcm_three",),
        build_number_theory,
    ),
    Family(
        "statistics",
        ("test_scores_mean", "house_prices_median", "temperatures_pstdev"),
        ("delivery_times_sstdev",),
        build_statistics,
    ),
    Family("dates", ("days_between", "weekday_after", "age_in_days"), ("inclusive_days",), build_dates),
    Family("linear_system", ("equations", "fruit_prices", "ticket_sales"), ("matrix_form",), build_linear_system),
)
