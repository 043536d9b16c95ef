"""Built-in function-writing problems: families of templates with random constants.

Each family gives a signature, a statement, a reference solution and random test inputs; the expected
outputs are computed by running the reference (our own code) at generation time, so reference and tests
cannot disagree. The constants make every prompt distinct.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Family = Callable[[random.Random], tuple[str, str, str, list[tuple[Any, ...]]]]  # signature, statement, code, args


def _ints(rng: random.Random, low: int, high: int, size: tuple[int, int]) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(*size))]


def scale_shift(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    a, b = rng.choice([k for k in range(-9, 10) if k not in (0, 1)]), rng.randint(-50, 50)
    code = f"def transform(xs):\n    return [x * {a} + {b} for x in xs]\n"
    statement = f"returns a new list in which each element x of xs is replaced by x * {a} + {b}"
    return "transform(xs: list[int]) -> list[int]", statement, code, [(_ints(rng, -99, 99, (0, 8)),) for _ in range(6)]


def count_divisible(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    a, b = rng.sample(range(2, 30), 2)
    code = f"def count_divisible(n):\n    return sum(1 for k in range(1, n + 1) if k % {a} == 0 or k % {b} == 0)\n"
    statement = f"returns how many integers k with 1 <= k <= n are divisible by {a} or by {b}"
    return "count_divisible(n: int) -> int", statement, code, [(rng.randint(0, 500),) for _ in range(6)]


def shift_letters(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    k = rng.randint(1, 25)
    code = (
        "def shift_letters(text):\n"
        f"    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in text)\n"
    )
    statement = f"shifts every lowercase letter a-z {k} places forward in the alphabet (z wraps to a), keeping the rest"
    words = ["hello world", "zebra", "Mixed Case!", "", "xyz abc", "nodus 42", "the quick brown fox"]
    return "shift_letters(text: str) -> str", statement, code, [(w,) for w in rng.sample(words, 6)]


def clamped_sum(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    low = rng.randint(-40, 10)
    high = low + rng.randint(5, 60)
    code = f"def clamped_sum(xs):\n    return sum(min(max(x, {low}), {high}) for x in xs)\n"
    statement = f"returns the sum of the elements of xs after clamping each one to the range [{low}, {high}]"
    return "clamped_sum(xs: list[int]) -> int", statement, code, [(_ints(rng, -99, 99, (0, 9)),) for _ in range(6)]


def recurrence(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    start, m, c = rng.randint(-9, 9), rng.randint(2, 5), rng.randint(-9, 9)
    code = (
        "def term(n):\n"
        f"    value = {start}\n"
        "    for _ in range(n):\n"
        f"        value = value * {m} + {c}\n"
        "    return value\n"
    )
    statement = f"returns t(n) of the sequence t(0) = {start}, t(k + 1) = t(k) * {m} + {c}"
    return "term(n: int) -> int", statement, code, [(n,) for n in rng.sample(range(0, 25), 6)]


def digit_sum_above(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    d = rng.randint(0, 8)
    code = f"def digit_sum_above(n):\n    return sum(int(c) for c in str(abs(n)) if int(c) > {d})\n"
    statement = f"returns the sum of the decimal digits of n (ignoring its sign) that are greater than {d}"
    return "digit_sum_above(n: int) -> int", statement, code, [(rng.randint(-10**6, 10**6),) for _ in range(6)]


def best_window(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    k = rng.randint(2, 5)
    code = f"def best_window(xs):\n    return max(sum(xs[i:i + {k}]) for i in range(len(xs) - {k} + 1))\n"
    statement = f"returns the largest sum of {k} consecutive elements of xs (xs has at least {k} elements)"
    cases = [(_ints(rng, -50, 50, (k, k + 8)),) for _ in range(6)]
    return "best_window(xs: list[int]) -> int", statement, code, cases


def to_base(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    b = rng.randint(2, 16)
    code = (
        "def to_base(n):\n"
        "    digits = []\n"
        "    while True:\n"
        f"        n, digit = divmod(n, {b})\n"
        "        digits.append(digit)\n"
        "        if n == 0:\n"
        "            return digits[::-1]\n"
    )
    statement = f"returns the digits of the non-negative integer n in base {b}, most significant first ([0] for 0)"
    return "to_base(n: int) -> list[int]", statement, code, [(n,) for n in [0, *rng.sample(range(1, 10**5), 5)]]


def mask_vowels(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    mask = rng.choice("*#_-+=~.")
    vowels = "".join(sorted(rng.sample("aeiou", rng.randint(2, 5))))
    code = f"def mask_vowels(text):\n    return ''.join({mask!r} if c.lower() in {vowels!r} else c for c in text)\n"
    statement = f"replaces each of the letters {', '.join(vowels)} (either case) in text with {mask!r}"
    words = ["banana", "AEIOU aeiou", "", "rhythm", "Programming in Python", "queue", "Idea"]
    return "mask_vowels(text: str) -> str", statement, code, [(w,) for w in rng.sample(words, 6)]


def every_nth(rng: random.Random) -> tuple[str, str, str, list[tuple[Any, ...]]]:
    k, offset = rng.randint(2, 6), rng.randint(0, 3)
    code = f"def every_nth(xs):\n    return xs[{offset}::{k}]\n"
    statement = f"returns the elements of xs at positions {offset}, {offset + k}, {offset + 2 * k}, ... (0-based)"
    return "every_nth(xs: list[int]) -> list[int]", statement, code, [(_ints(rng, 0, 99, (0, 15)),) for _ in range(6)]


FAMILIES: dict[str, Family] = {
    family.__name__: family
    for family in (scale_shift, count_divisible, shift_letters, clamped_sum, recurrence, digit_sum_above,
                   best_window, to_base, mask_vowels, every_nth)
}


def generate_problem(rng: random.Random, num_tests: int) -> dict[str, Any]:
    family = rng.choice(sorted(FAMILIES))
    signature, statement, code, cases = FAMILIES[family](rng)
    cases = cases[:num_tests]
    entry = signature.split("(")[0]
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # our own reference: the expected outputs are what it returns
    # Expected value on the left of a type-strict comparison (values.same).
    def call(args: tuple[Any, ...]) -> str:
        return f"{entry}({', '.join(map(repr, args))})"

    asserts = [f"assert same({namespace[entry](*args)!r}, {call(args)})" for args in cases]
    example = f"For example, {call(cases[0])} returns {namespace[entry](*cases[0])!r}."
    prompt = f"Write a Python function `{signature}` that {statement}. {example}"
    return {"source": "generated", "family": family, "prompt": prompt, "entry_point": entry, "preamble": "",
            "reference": code, "tests": "\n".join(asserts)}
