"""Money families: compound interest, loan payments, percent chains."""

from __future__ import annotations

import random
from decimal import Decimal
from fractions import Fraction

from streamrl.envs.math_tir.problems.exact import HIGH_PRECISION, RejectDraw, fixed, money, round_stated, to_decimal
from streamrl.envs.math_tir.problems.model import Draft, Family, Knobs, digits_number

NAMES = (
    "Ana",
    "Ben",
    "Chloe",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jamal",
    "Kira",
    "Luis",
    "Maya",
    "Noah",
)
COMPOUNDING = {1: "annually", 4: "quarterly", 12: "monthly", 365: "daily"}


def _percent_text(basis_points: int) -> str:
    return fixed(Fraction(basis_points, 100), 2)


def _cents_text(value: Fraction | Decimal) -> str:
    return f"{round_stated(value, 2):f}"


# ----------------------------------------------------------------------------- compound interest
def build_compound_interest(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    principal = digits_number(rng, knobs.pick_digits(rng, 3, 6))
    rate_bp = rng.randint(50, 1200)
    years = rng.randint(2, 30)
    rate, name = _percent_text(rate_bp), rng.choice(NAMES)
    continuous = template in ("continuous", "continuous_interest")
    if continuous:
        periods = None
        amount = HIGH_PRECISION.multiply(
            to_decimal(principal), HIGH_PRECISION.exp(to_decimal(Fraction(rate_bp * years, 10000)))
        )
    else:
        periods = rng.choice(sorted(COMPOUNDING))
        growth = HIGH_PRECISION.power(to_decimal(1 + Fraction(rate_bp, 10000 * periods)), periods * years)
        amount = HIGH_PRECISION.multiply(to_decimal(principal), growth)
    wants_interest = template in ("interest_earned", "continuous_interest")
    value = HIGH_PRECISION.subtract(amount, to_decimal(principal)) if wants_interest else amount
    params = {
        "principal": principal,
        "rate_percent": rate,
        "periods_per_year": periods,
        "years": years,
        "ask": "interest" if wants_interest else "balance",
    }
    cents = "Round to the nearest cent."
    if template == "balance":
        assert periods is not None
        context = [
            f"{name} deposits ${principal} in a savings account that pays {rate}% annual interest, compounded {COMPOUNDING[periods]}.",
            "No other deposits or withdrawals are made.",
        ]
        ask = f"What is the balance after {years} years, in dollars? {cents}"
    elif template == "interest_earned":
        assert periods is not None
        context = [
            f"A credit union pays {rate}% per year, compounded {COMPOUNDING[periods]}, on a certificate of deposit.",
            f"{name} puts ${principal} into it for {years} years.",
        ]
        ask = f"How much interest, in dollars, does the deposit earn over that time? {cents}"
    elif template == "continuous":
        context = [
            f"An investment of ${principal} grows at an annual rate of {rate}% compounded continuously, "
            "so its value after t years is P*e^(r*t)."
        ]
        ask = f"What is the investment worth after {years} years, in dollars? {cents}"
    else:  # continuous_interest (held out)
        context = [
            f"A grandparent opens a college fund for {name} with ${principal}.",
            f"The fund earns {rate}% a year with continuous compounding.",
        ]
        ask = f"How many dollars of interest has the fund earned after {years} years? {cents}"
    return Draft(context, ask, _cents_text(value), params)


# ----------------------------------------------------------------------------- loans
def _monthly_payment(principal: Fraction, rate_bp: int, months: int) -> Fraction:
    """M = P i (1+i)^N / ((1+i)^N - 1), exactly."""
    monthly = Fraction(rate_bp, 10000 * 12)
    growth = (1 + monthly) ** months
    return principal * monthly * growth / (growth - 1)


def build_loan(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    rate_bp = rng.randint(200, 1200)
    rate, name = _percent_text(rate_bp), rng.choice(NAMES)
    formula = "The monthly payment is M = P*i*(1+i)^N / ((1+i)^N - 1), with i the monthly rate (annual rate / 12) and N the number of payments."
    if template == "car_loan":
        price = digits_number(rng, knobs.pick_digits(rng, 4, 5)) * 100 + rng.choice((0, 50, 99))
        down = rng.randint(10, 30)
        years = rng.randint(3, 7)
        financed = Fraction(price, 100) * Fraction(100 - down, 100)
        params = {
            "price": fixed(Fraction(price, 100), 2),
            "down_percent": down,
            "rate_percent": rate,
            "years": years,
            "ask": "payment",
        }
        context = [
            f"{name} buys a car for ${fixed(Fraction(price, 100), 2)}, pays {down}% of the price up front and finances the rest.",
            f"The loan runs {years} years at {rate}% a year, compounded monthly, with equal monthly payments.",
            formula,
        ]
        payment = round_stated(_monthly_payment(financed, rate_bp, 12 * years), 2)
        return Draft(
            context, "What is the monthly payment in dollars? Round to the nearest cent.", f"{payment:f}", params
        )
    principal = digits_number(rng, knobs.pick_digits(rng, 4, 6))
    years = rng.randint(2, 30)
    months = 12 * years
    payment = round_stated(_monthly_payment(Fraction(principal), rate_bp, months), 2)
    ask_key = {"monthly_payment": "payment", "total_interest": "interest", "mortgage_total_paid": "total"}[template]
    params = {"principal": principal, "rate_percent": rate, "years": years, "ask": ask_key}
    rounded_rule = "Each monthly payment is the exact payment rounded to the nearest cent."
    if template == "monthly_payment":
        context = [
            f"{name} borrows ${principal} at an annual interest rate of {rate}%, compounded monthly, "
            f"and repays it in equal monthly payments over {years} years.",
            formula,
        ]
        return Draft(
            context, "What is the monthly payment in dollars? Round to the nearest cent.", f"{payment:f}", params
        )
    if template == "total_interest":
        context = [
            f"A small business takes out a loan of ${principal} at {rate}% a year, compounded monthly, "
            f"repaid in equal monthly payments for {years} years.",
            formula,
            rounded_rule,
        ]
        interest = payment * months - principal
        return Draft(context, "How much interest does the business pay in total, in dollars?", f"{interest:f}", params)
    # mortgage_total_paid (held out): no formula given
    context = [
        f"A family takes out a {years}-year fixed-rate mortgage of ${principal} at {rate}% annual interest, "
        "with interest compounded monthly and equal monthly payments.",
        rounded_rule,
    ]
    return Draft(
        context,
        "How much money will the family have paid in total once the mortgage is repaid?",
        f"{payment * months:f}",
        params,
    )


# ----------------------------------------------------------------------------- percent chains
def _signed_change(rng: random.Random) -> Fraction:
    tenths = rng.randint(5, 400) * rng.choice((1, 1, -1))
    return Fraction(tenths, 10)


def _change_sentence(change: Fraction, rise: str, fall: str) -> str:
    verb = rise if change > 0 else fall
    return f"{verb} by {fixed(abs(change), 1)}%"


def build_percent_chain(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    if template == "restaurant_bill":
        bill = digits_number(rng, knobs.pick_digits(rng, 2, 3)) * 100 + rng.randint(0, 99)
        discount, tip = rng.randint(5, 30), rng.randint(10, 25)
        tax_bp = rng.randint(200, 1050)
        total = (
            Fraction(bill, 100)
            * Fraction(100 - discount, 100)
            * (1 + Fraction(tax_bp, 10000))
            * Fraction(100 + tip, 100)
        )
        params = {
            "bill": money(bill),
            "discount_percent": discount,
            "tax_percent": _percent_text(tax_bp),
            "tip_percent": tip,
        }
        context = [
            f"A dinner bill comes to ${money(bill)}.",
            f"A coupon takes {discount}% off the bill, then {_percent_text(tax_bp)}% sales tax is added to the discounted amount, "
            f"and finally a {tip}% tip is added on the taxed amount.",
        ]
        ask = "What is the final amount paid, in dollars? Do not round along the way; round only the final amount to the nearest cent."
        return Draft(context, ask, _cents_text(total), params)
    if template in ("price_changes", "salary_raises"):
        steps = knobs.pick_steps(rng, 2, 5)
        changes = [_signed_change(rng) for _ in range(steps)]
        if template == "salary_raises":
            start = digits_number(rng, knobs.pick_digits(rng, 4, 6)) * 100
            changes = [abs(c) for c in changes[:-1]] + [-abs(changes[-1])]
            story = [f"{rng.choice(NAMES)} starts a job with a yearly salary of ${money(start)}."]
            story += [
                f"In year {k + 1} the salary {_change_sentence(c, 'rises', 'is cut')}." for k, c in enumerate(changes)
            ]
            ask = "What is the salary after these changes, in dollars? Round only the final amount to the nearest cent."
        else:
            start = digits_number(rng, knobs.pick_digits(rng, 2, 4)) * 100 + rng.randint(0, 99)
            story = [f"A jacket is priced at ${money(start)}."]
            story += [f"Then its price {_change_sentence(c, 'rises', 'falls')}." for c in changes]
            ask = "What is the final price in dollars? Apply each change to the current price and round only the final price to the nearest cent."
        value = Fraction(start, 100)
        for change in changes:
            value *= 1 + change / 100
        params = {"start": money(start), "changes_percent": [fixed(c, 1) for c in changes]}
        return Draft(story, ask, _cents_text(value), params)
    if template == "percent_change":
        digits = knobs.pick_digits(rng, 2, 5)
        old = digits_number(rng, digits) * 100 + rng.randint(0, 99)
        new = max(1, old + rng.randint(-old // 2, old // 2))
        if new == old:
            raise RejectDraw("no change")
        params = {"old": money(old), "new": money(new)}
        context = [f"A company's share price moved from ${money(old)} to ${money(new)} over a month."]
        ask = "What was the percent change? Use a negative number for a decrease and round to 2 decimal places."
        return Draft(context, ask, f"{round_stated(Fraction(new - old, old) * 100, 2):f}", params)
    # reverse_percentage
    after = digits_number(rng, knobs.pick_digits(rng, 3, 4)) * 100 + rng.randint(0, 99)
    increase = Fraction(rng.randint(15, 300), 10)
    params = {"after": money(after), "increase_percent": fixed(increase, 1)}
    context = [f"After a {fixed(increase, 1)}% increase, the monthly rent of an apartment is ${money(after)}."]
    ask = "What was the rent before the increase, in dollars? Round to the nearest cent."
    return Draft(context, ask, _cents_text(Fraction(after, 100) / (1 + increase / 100)), params)


FAMILIES = (
    Family(
        "compound_interest",
        ("balance", "interest_earned", "continuous"),
        ("continuous_interest",),
        build_compound_interest,
    ),
    Family("loan_payment", ("monthly_payment", "total_interest", "car_loan"), ("mortgage_total_paid",), build_loan),
    Family(
        "percent_chain",
        ("restaurant_bill", "price_changes", "percent_change", "reverse_percentage"),
        ("salary_raises",),
        build_percent_chain,
    ),
)
