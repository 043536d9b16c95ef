"""Procedurally generated word problems with exact answers.

Each family draws its numbers from the seeded RNG only; ``difficulty`` (1-5) scales the magnitudes and the
number of steps. Answers are exact (``fractions.Fraction``) and written canonically: ``12``, ``-3``,
``7/4`` or ``3.75`` (decimals only for families whose answers are money and always terminate).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction

Problem = tuple[str, Fraction, str]  # question, answer, how to write it ("integer", "fraction", "decimal")

NAMES = ("Ana", "Bo", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivo", "Jun", "Kofi", "Lena")
ITEMS = (("tray", "muffins"), ("box", "pencils"), ("crate", "apples"), ("bag", "marbles"), ("shelf", "books"))


def magnitude(difficulty: int) -> int:
    return 10 * 4 ** (difficulty - 1)  # 10, 40, 160, 640, 2560


def leftover(rng: random.Random, difficulty: int) -> Problem:
    name, (container, things) = rng.choice(NAMES), rng.choice(ITEMS)
    groups, per_group = rng.randint(2, 3 + difficulty * 2), rng.randint(2, magnitude(difficulty))
    left = groups * per_group
    removals = []
    for verb in ("sells", "gives away", "loses", "donates")[: 1 + difficulty // 2]:
        amount = rng.randint(1, max(1, left // 2))
        removals.append(f"{verb} {amount}")
        left -= amount
    question = (
        f"{name} has {groups} {container}s with {per_group} {things} in each. {name} "
        f"{', then '.join(removals)}. How many {things} does {name} have left?"
    )
    return question, Fraction(left), "integer"


def temperature(rng: random.Random, difficulty: int) -> Problem:
    start = rng.randint(-magnitude(difficulty) // 4, magnitude(difficulty) // 4)
    fall, rise = rng.randint(1, magnitude(difficulty) // 2), rng.randint(0, magnitude(difficulty) // 4)
    question = (
        f"At dawn the temperature was {start} degrees. By noon it had fallen {fall} degrees, and by evening "
        f"it had risen {rise} degrees. What was the temperature in the evening, in degrees?"
    )
    return question, Fraction(start - fall + rise), "integer"


def sharing(rng: random.Random, difficulty: int) -> Problem:
    people = rng.randint(2, 3 + 2 * difficulty)
    pizzas = rng.randint(1, magnitude(difficulty) // 2)
    question = (
        f"{people} friends share {pizzas} pizzas equally. How many pizzas does each friend get? "
        "Give the exact number as a fraction in lowest terms or an integer."
    )
    return question, Fraction(pizzas, people), "fraction"


def shopping(rng: random.Random, difficulty: int) -> Problem:
    first_cents, second_cents = rng.randint(5, 25 * magnitude(difficulty)), rng.randint(5, 25 * magnitude(difficulty))
    first_count, second_count = rng.randint(1, 2 + difficulty), rng.randint(1, 2 + difficulty)
    name = rng.choice(NAMES)
    question = (
        f"A notebook costs ${first_cents / 100:.2f} and a pen costs ${second_cents / 100:.2f}. {name} buys "
        f"{first_count} notebooks and {second_count} pens. How many dollars does {name} spend?"
    )
    return question, Fraction(first_cents * first_count + second_cents * second_count, 100), "decimal"


def linear_equation(rng: random.Random, difficulty: int) -> Problem:
    bound = magnitude(difficulty)
    a = rng.choice([k for k in range(-min(bound, 12), min(bound, 12) + 1) if k not in (0, 1)])
    b, c = rng.randint(-bound, bound), rng.randint(-bound, bound)
    if difficulty >= 3:  # unknowns on both sides
        d = rng.choice([k for k in range(-9, 10) if k != a])
        question = f"Solve for x: {a}x + {b} = {d}x + {c}. Give x exactly."
        return question.replace("+ -", "- "), Fraction(c - b, a - d), "fraction"
    question = f"Solve for x: {a}x + {b} = {c}. Give x exactly."
    return question.replace("+ -", "- "), Fraction(c - b, a), "fraction"


def mean(rng: random.Random, difficulty: int) -> Problem:
    values = [rng.randint(0, magnitude(difficulty)) for _ in range(3 + difficulty)]
    question = (
        f"The scores of a team in {len(values)} games were {', '.join(map(str, values))}. What is the mean "
        "score? Give the exact value."
    )
    return question, Fraction(sum(values), len(values)), "fraction"


FAMILIES: dict[str, Callable[[random.Random, int], Problem]] = {
    "leftover": leftover,
    "temperature": temperature,
    "sharing": sharing,
    "shopping": shopping,
    "linear_equation": linear_equation,
    "mean": mean,
}


def exact_text(value: Fraction, form: str) -> str:
    """Canonical text of an exact answer: an integer, ``p/q``, or a terminating decimal."""
    if value.denominator == 1:
        return str(value.numerator)
    if form == "decimal":
        sign = "-" if value < 0 else ""
        cents = abs(value) * 100
        if cents.denominator != 1:
            raise ValueError(f"{value} is not a whole number of cents")
        whole, frac = divmod(int(cents), 100)
        return f"{sign}{whole}.{frac:02d}".rstrip("0").rstrip(".")
    return f"{value.numerator}/{value.denominator}"


def generate_problem(rng: random.Random, difficulty: int) -> dict[str, str]:
    family = rng.choice(sorted(FAMILIES))
    question, answer, form = FAMILIES[family](rng, difficulty)
    return {"question": question, "answer": exact_text(answer, form), "source": "generated", "family": family}
