"""Mathematical equivalence with math-verify, under a time limit that respects the sandbox's own.

math-verify's built-in timeouts call ``signal.alarm`` and then ``signal.alarm(0)``: that would cancel the
sandbox worker's ``ITIMER_REAL`` wall-time guard of the whole job (setitimer and alarm share one timer). So we
turn them off and use :func:`time_limit`, which runs a shorter timer and then restores what is left of the
outer one (firing it at once if it would have expired meanwhile).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nodus_env_math_answer.extract import (
    asks_for_percent,
    counted_words,
    math_pieces,
    normalized_percent,
    value_changing_words,
    without_units,
)

# Our own guard replaces math-verify's; silence its one-time "timeout is disabled" warning.
logging.getLogger("math_verify").setLevel(logging.ERROR)

PARSE_TIME_LIMIT_S = 3.0


class ParseTimeout(BaseException):
    """Raised by the timer; a BaseException so no ``except Exception`` inside sympy swallows it."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread; the sandbox's wall-time limit still bounds the job
        return

    def on_alarm(_signum: int, _frame: object) -> None:
        raise ParseTimeout()

    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds if not outer_left else min(seconds, outer_left))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - started), 1e-6), outer_interval)


def _parse(text: str) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    normalized = text.replace("\u2212", "-").replace("\\$", "").strip()
    if normalized.startswith("$") and normalized.count("$") == 1:
        normalized = normalized[1:]  # "$12.50": a currency sign, not LaTeX math
    # Bare LaTeX (\frac{\pi}{2}+1, (1,2), 50\%) is only found inside math delimiters; numbers either way.
    for candidate in (f"${normalized}$", normalized):
        parsed: list[Any] = parse(candidate, extraction_config=configs, parsing_timeout=None)
        if parsed:
            return parsed
    return []


def _verify(gold: list[Any], answer: list[Any]) -> bool:
    from math_verify import verify

    return bool(verify(gold, answer, timeout_seconds=None))


def equivalent(
    gold: str, answer: str, seconds: float = PARSE_TIME_LIMIT_S, *, question: str = ""
) -> tuple[bool | None, str]:
    """(True/False, why) when decided; (None, why) when ``answer`` cannot be read as math or time ran out. The
    ``question`` says what a percent is worth (:func:`asks_for_percent`) and which scale words count things
    (:func:`counted_words`)."""
    return _bounded(lambda: _decide(gold, answer, question), seconds)


def _decide(gold: str, answer: str, question: str = "") -> tuple[bool | None, str]:
    answer = normalized_percent(answer)
    parsed_gold = _parse(gold)
    if not parsed_gold:  # e.g. \text{Monday} in a MATH file: compare the written answers
        same = _plain(gold) == _plain(answer)
        return same, f"{answer[:60]!r} {'matches' if same else 'does not match'} the expected answer as text"
    percent = asks_for_percent(question) or _has_percent(parsed_gold)
    parsed_gold = _percent_value(parsed_gold, percent)
    number = _is_number(parsed_gold[0])
    counted = counted_words(question) if number else frozenset()
    changing = value_changing_words(answer, counted) if number else []
    if changing:  # "13 dozen", "13 is wrong", "13 at most": math-verify would read some of them as plain 13
        return False, f"{answer[:60]!r} is not a number alone: {' '.join(changing)!r} changes or qualifies it"
    if number and len(values := _different_values(answer, percent)) > 1:
        return False, f"{answer[:60]!r} gives several answers ({', '.join(map(str, values))}): commit to one"
    parsed_answer = _parse(without_units(answer, counted) if number else answer)  # "13 points" is 13 if 13 is expected
    if not parsed_answer:
        return None, f"the answer {answer[:60]!r} cannot be read as a number or expression"
    percent_answer = _has_percent(parsed_answer)
    parsed_answer = _percent_value(parsed_answer, percent)
    # The problems ask for exact values: 1.166667 is not 7/6, nor 1.41421356 the square root of 2.
    exact_gold, exact_answer = (_exact(parsed_gold), _exact(parsed_answer)) if number else (parsed_gold, parsed_answer)
    if _false_equation(exact_answer):
        return False, f"{answer[:60]!r} is a false equation"
    if _verify(exact_gold, exact_answer):
        return True, f"{answer[:60]!r} is equivalent to {gold!r}"
    why = ""
    if percent_answer and not percent:
        why = " (the question does not ask for a percentage, so a percent is its number over 100)"
    elif exact_answer != parsed_answer and _verify(parsed_gold, parsed_answer):
        why = " (only close to it: a decimal is the exact number it writes, and the exact value is asked)"
    return False, f"{answer[:60]!r} is not equivalent to the expected answer{why}"


def _is_number(parsed: Any) -> bool:
    """A constant (13, 7/6, 2.5, 2*sqrt(3), pi), not an expression in a variable, an equation, a set or a tuple."""
    from sympy import Expr
    from sympy.matrices import MatrixBase, MatrixExpr

    return isinstance(parsed, Expr) and not isinstance(parsed, (MatrixBase, MatrixExpr)) and bool(parsed.is_number)


# math-verify reads "13%", "13\\%" and "13 percent" as 13 * UnevaluatedExpr(1/100), and then credits it both for 13 and
# for 0.13. It is one of them, by the question: the number of percent (13) when the question asks for a percentage
# (or the expected answer is written as one, "13\\%"), else its value (13/100: "50\\%" is 0.5). So an answer of 0.13
# fails where 13 percent is asked, and 13% where 13 things are.
def _percent_sign() -> Any:
    from sympy import Rational, UnevaluatedExpr

    return UnevaluatedExpr(Rational(1, 100))


def _has_percent(parsed: list[Any]) -> bool:
    from sympy import Basic

    return any(isinstance(item, Basic) and item.has(_percent_sign()) for item in parsed)


def _percent_value(parsed: list[Any], asked: bool) -> list[Any]:
    from sympy import Basic, Integer, Rational

    worth = Integer(1) if asked else Rational(1, 100)
    return [item.xreplace({_percent_sign(): worth}) if isinstance(item, Basic) else item for item in parsed]


def _different_values(answer: str, percent: bool) -> list[Any]:
    """Two different values that the pieces of math of ``answer`` state, if it states several: math-verify grades
    only the last piece, so "$x = 12$ if even else $x = 13$" or "12 \\lor 13" passed for 13 (and, written the other
    way round, for 12). An answer must commit to one value; restating it is fine ("$13$, i.e. $x = 65/5 = 13$")."""
    pieces = math_pieces(answer.replace("\\$", ""))
    if len(pieces) < 2:
        return []
    values: list[Any] = []
    for piece in pieces:
        parsed = _parse(without_units(piece.strip()))[:1]
        for value in _exact(_percent_value([v for item in parsed for v in _stated_values(item)], percent)):
            if not any(_verify([known], [value]) for known in values):
                values.append(value)
                if len(values) > 1:
                    return values
    return values


def _stated_values(item: Any) -> list[Any]:
    """The constants a piece states: 13 in "13" or "x = 13", both sides of "65/5 = 13"; none in "x" or "x > 0"."""
    from sympy import And, Eq

    if isinstance(item, And):
        return [value for arg in item.args for value in _stated_values(arg)]
    if isinstance(item, Eq):
        return [side for side in item.args if _is_number(side)]
    return [item] if _is_number(item) else []


def _exact(parsed: list[Any]) -> list[Any]:
    """Each decimal as the exact number it writes (its digits, not its binary float): 1.166667 -> 1166667/1000000."""
    from sympy import Basic, Float, Rational

    return [
        item.xreplace({f: Rational(str(f)) for f in item.atoms(Float) if f.is_finite})
        if isinstance(item, Basic)
        else item
        for item in parsed
    ]


def _false_equation(parsed: list[Any]) -> bool:
    """``12 = 13``: math-verify grades an equation by its right side, so a false one would pass for 13 (``x = 13``,
    ``65/5 = 13`` are fine)."""
    from sympy import Basic, Eq

    equations = [eq for item in parsed if isinstance(item, Basic) for eq in item.atoms(Eq)]
    return any(eq.lhs.is_number and eq.rhs.is_number and not _verify([eq.lhs], [eq.rhs]) for eq in equations)


def _plain(text: str) -> str:
    return "".join(text.replace("\\text", "").replace("$", "").replace("{", "").replace("}", "").split()).lower()


def _bounded(work: Callable[[], tuple[bool | None, str]], seconds: float) -> tuple[bool | None, str]:
    try:
        with time_limit(seconds):
            return work()
    except ParseTimeout:
        return None, f"reading the answer took more than {seconds:g} s"
    except (Exception, RecursionError) as error:  # math-verify on adversarial text: a failure to read, never a crash
        return None, f"the answer cannot be read ({type(error).__name__})"
