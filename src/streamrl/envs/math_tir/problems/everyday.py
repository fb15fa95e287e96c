"""Everyday families: multi-step shopping/inventory and unit-conversion chains."""

from __future__ import annotations

import random
from fractions import Fraction

from streamrl.envs.math_tir.problems.exact import fixed, money, round_stated
from streamrl.envs.math_tir.problems.model import Draft, Family, Knobs, digits_number

GOODS = (
    ("boxes of printer paper", "box"),
    ("bags of rice", "bag"),
    ("cans of paint", "can"),
    ("bottles of olive oil", "bottle"),
    ("packs of batteries", "pack"),
)
SUPPLIES = ("paper cups", "coffee filters", "milk cartons", "sugar packets", "napkins", "tea boxes", "lids")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
TIMES = ("early morning", "mid-morning", "late morning", "early afternoon", "late afternoon", "evening")


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ----------------------------------------------------------------------------- inventory
def _supply_costs(rng: random.Random, digits: int, steps: int) -> Draft:
    items = rng.sample(SUPPLIES, min(steps, len(SUPPLIES)))
    purchases = [(digits_number(rng, digits), rng.randint(25, 4999)) for _ in items]
    returned = rng.randint(1, purchases[0][0])
    total = sum(q * c for q, c in purchases) - returned * purchases[0][1]
    context = ["A cafe restocks its supplies."]
    context += [f"It buys {q} {item} at ${money(c)} each." for item, (q, c) in zip(items, purchases)]
    context.append(f"Later it returns {returned} of the {items[0]} for a full refund.")
    params = {"purchases": [[q, money(c)] for q, c in purchases], "returned": returned}
    return Draft(
        context,
        "How much does the cafe spend in total after the refund, in dollars (to the cent)?",
        money(total),
        params,
    )


def _warehouse_value(rng: random.Random, digits: int, steps: int) -> Draft:
    goods, unit = rng.choice(GOODS)
    stock = start = digits_number(rng, digits)
    context = [f"A warehouse starts the month with {start} {goods}."]
    ops = []
    for day in sorted(rng.sample(range(1, 29), steps)):
        kind = rng.choice(("receive", "ship", "ship", "damage"))
        if kind == "receive":
            qty = digits_number(rng, max(1, digits - 1))
            stock += qty
            context.append(f"On day {day} it receives {qty} more {goods}.")
        elif kind == "ship":
            qty = rng.randint(1, max(1, stock // 2))
            stock -= qty
            context.append(f"On day {day} it ships {qty} {goods} to customers.")
        else:
            qty = rng.randint(1, max(1, stock // 10))
            stock -= qty
            context.append(f"On day {day}, {qty} {goods} are found damaged and thrown away.")
        ops.append([kind, qty])
    price = rng.randint(100, 9999)
    ask = f"Each {unit} is valued at ${money(price)}. What is the total value of the {goods} left at the end of the month, in dollars?"
    return Draft(context, ask, money(stock * price), {"start": start, "ops": ops, "unit_price": money(price)})


def _net_sales(rng: random.Random, digits: int, steps: int, stall: bool) -> Draft:
    goods = "kg of apples" if stall else rng.choice(GOODS)[0]
    stock = start = digits_number(rng, digits)
    slots = TIMES if stall else DAYS
    context = [
        f"A farm stand opens the day with {start} kg of apples."
        if stall
        else f"A hardware store starts the week with {start} {goods}."
    ]
    ops, revenue, sold = [], 0, 0
    for index in range(steps):
        when = slots[index % len(slots)]
        kind = "sell" if index == 0 or sold == 0 else rng.choice(("sell", "sell", "restock", "refund"))
        if kind == "sell":
            qty, price = rng.randint(1, max(1, stock // 2)), rng.randint(100, 4999)
            stock, sold, revenue = stock - qty, sold + qty, revenue + qty * price
            ops.append(["sell", qty, money(price)])
            unit = "per kg" if stall else "each"
            context.append(
                f"In the {when} it sells {qty} {goods} at ${money(price)} {unit}."
                if stall
                else f"On {when} it sells {qty} {goods} at ${money(price)} {unit}."
            )
        elif kind == "restock":
            qty = digits_number(rng, max(1, digits - 1))
            stock += qty
            ops.append(["restock", qty])
            context.append(
                f"In the {when} the farmer brings {qty} kg more."
                if stall
                else f"On {when} a delivery adds {qty} {goods}."
            )
        else:
            qty, refund = rng.randint(1, min(sold, 50)), rng.randint(100, 4999)
            stock, sold, revenue = stock + qty, sold - qty, revenue - qty * refund
            ops.append(["refund", qty, money(refund)])
            context.append(
                f"In the {when} a customer brings back {qty} kg of bruised apples and gets ${money(refund)} per kg back."
                if stall
                else f"On {when} a customer returns {qty} {goods} and is refunded ${money(refund)} each."
            )
    ask = (
        "How much money did the stand take in, net of refunds, in dollars (to the cent)?"
        if stall
        else "What is the store's net sales revenue for the week (sales minus refunds), in dollars (to the cent)?"
    )
    return Draft(context, ask, money(revenue), {"start": start, "ops": ops})


def build_inventory(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    digits, steps = knobs.pick_digits(rng, 3, 5), knobs.pick_steps(rng, 3, 6)
    if template == "supply_costs":
        return _supply_costs(rng, digits, steps)
    if template == "warehouse_value":
        return _warehouse_value(rng, digits, steps)
    return _net_sales(rng, digits, steps, stall=template == "market_stall")


# ----------------------------------------------------------------------------- unit conversions
MILE_KM = Fraction("1.609344")
GALLON_L = Fraction("3.785411784")
POUND_KG = Fraction("0.45359237")


def _tenths(rng: random.Random, digits: int) -> Fraction:
    return Fraction(digits_number(rng, digits) * 10 + rng.randint(0, 9), 10)


def build_unit_conversion(rng: random.Random, knobs: Knobs, template: str) -> Draft:
    digits, steps = knobs.pick_digits(rng, 1, 4), knobs.pick_steps(rng, 2, 5)
    parts = [_tenths(rng, digits) for _ in range(steps)]
    shown = [fixed(p, 1) for p in parts]
    params: dict = {"values": shown}
    if template == "road_trip_meters":
        context = [
            f"A road trip has {steps} legs of {_listing(shown)} miles.",
            "Use 1 mile = 1.609344 km and 1 km = 1000 m.",
        ]
        ask, value, places = (
            "How many meters long is the whole trip? Round to the nearest meter.",
            sum(parts) * MILE_KM * 1000,
            0,
        )
    elif template == "fuel_liters":
        context = [
            f"A delivery van is refueled {steps} times, with {_listing(shown)} US gallons.",
            "One US gallon is 3.785411784 liters.",
        ]
        ask, value, places = (
            "How many liters of fuel is that in total? Round to 2 decimal places.",
            sum(parts) * GALLON_L,
            2,
        )
    elif template == "parcel_kg":
        context = [
            f"A courier loads {steps} parcels weighing {_listing(shown)} pounds.",
            "One pound is 0.45359237 kilograms.",
        ]
        ask, value, places = "What is the total mass in kilograms? Round to 2 decimal places.", sum(parts) * POUND_KG, 2
    elif template == "oven_kelvin":
        start = rng.randint(250, 500)
        raises = [rng.randint(5, 60) for _ in range(steps - 1)]
        params = {"start": start, "raises": raises}
        context = [
            f"An oven is set to {start} degrees Fahrenheit and then turned up by {_listing([str(r) for r in raises])} degrees Fahrenheit.",
            "Celsius is C = (F - 32) * 5/9 and kelvin is K = C + 273.15.",
        ]
        fahrenheit = start + sum(raises)
        ask, value, places = (
            "What is the final oven temperature in kelvins? Round to 2 decimal places.",
            (fahrenheit - 32) * Fraction(5, 9) + Fraction("273.15"),
            2,
        )
    elif template == "speed_ms":
        speed = _tenths(rng, min(digits + 1, 3))
        params = {"mph": fixed(speed, 1)}
        context = [
            f"A train travels at {fixed(speed, 1)} miles per hour.",
            "Use 1 mile = 1.609344 km, 1 km = 1000 m and 1 hour = 3600 s.",
        ]
        ask, value, places = (
            "What is its speed in meters per second? Round to 2 decimal places.",
            speed * MILE_KM * 1000 / 3600,
            2,
        )
    else:  # lab_fahrenheit (held out)
        celsius = Fraction(rng.randint(-300, 400), 10)
        drops = [Fraction(rng.randint(5, 250), 10) for _ in range(steps - 1)]
        params = {"start": fixed(celsius, 1), "drops": [fixed(d, 1) for d in drops]}
        context = [
            f"A lab sample starts at {fixed(celsius, 1)} degrees Celsius and is cooled by {_listing([fixed(d, 1) for d in drops])} degrees Celsius in turn.",
            "Fahrenheit is F = C * 9/5 + 32.",
        ]
        ask, value, places = (
            "What is the sample's final temperature in degrees Fahrenheit? Round to 1 decimal place.",
            (celsius - sum(drops)) * Fraction(9, 5) + 32,
            1,
        )
    return Draft(context, ask, f"{round_stated(value, places):f}", params)


FAMILIES = (
    Family("inventory", ("supply_costs", "warehouse_value", "shop_revenue"), ("market_stall",), build_inventory),
    Family(
        "unit_conversion",
        ("road_trip_meters", "fuel_liters", "parcel_kg", "oven_kelvin", "speed_ms"),
        ("lab_fahrenheit",),
        build_unit_conversion,
    ),
)
