"""Finding the final answer in a completion.

Every scan is linear in the text (no regex that can backtrack across the whole input, one pass to match
braces), so hostile 1 MB completions cost milliseconds.
"""

from __future__ import annotations

import re

MAX_ANSWER_CHARS = 200  # longer "answers" are not final answers; parsing them would only cost time

_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS = re.compile(r"the (?:final )?answer is[: \t]*([^\n]*)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\(?:boxed|fbox) ?\{")
# A plain word, not a LaTeX command (the "frac" of \frac) nor a single-letter variable.
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}(?![A-Za-z])")
# One or two words after a number: a unit ("13 points", "7/6 pizzas each"). More is a sentence, not a unit.
_TRAILING_WORDS = re.compile(r"(?<=[\d}$])(?:[ \t]+[A-Za-z]{2,}){1,2}$")
_ALL_TRAILING_WORDS = re.compile(r"(?<=[\d}$])(?:[ \t]+[A-Za-z]{2,})+$")
# Words after a number that change or negate its value, or hedge it: an answer with one after its number is not
# that number, though math-verify drops some of them ("13 trillion", "13 or more" and "13 untrue" read as 13).
CHANGES_THE_VALUE = frozenset(
    {"or", "and", "to", "than", "plus", "minus", "times", "over", "squared", "cubed"}
    | {"hundred", "thousand", "million", "billion", "trillion", "quadrillion", "lakh", "crore", "hundreds"}
    | {"thousands", "millions", "billions", "trillions", "dozen", "dozens", "score", "gross", "factorial"}
    | {"tens", "half", "halves", "third", "thirds", "quarter", "quarters", "fourth", "fifth", "sixth", "seventh"}
    | {"eighth", "ninth", "tenth", "twelfth", "hundredth", "thousandth", "millionth", "root", "reciprocal"}
    | {"inverse", "inverted", "negative", "negated", "twice", "thrice", "doubled", "tripled", "halved", "mod"}
    | {"modulo", "divided", "choose", "below", "under", "off", "short", "shy", "if", "unless", "except"}
    | {"without", "is", "not", "no", "at", "about", "approximately", "approx", "roughly", "nearly", "almost"}
    | {"around", "maybe", "probably", "perhaps", "possibly", "likely", "unlikely", "but", "guess", "wrong"}
    | {"correct", "incorrect", "false", "untrue", "least", "most", "never", "ish"}
)
# ... and so are plural ordinals, which name fractions ("13 hundredths" is 0.13), but for units that end alike.
UNITS_ENDING_IN_THS = frozenset(
    {"months", "lengths", "widths", "depths", "paths", "baths", "moths", "cloths", "booths", "mouths", "births"}
)
# Words after a number that are not its unit: those, and words math-verify reads ("3 pi", "50 percent"; it drops
# "more" and "less" as units: "13 more apples" answers "how many more").
NOT_UNITS = CHANGES_THE_VALUE | {"more", "less", "fewer", "percent", "pi", "sqrt", "inf", "infinity"}
PROSE_MARKERS = ("####", "'the answer is'")


def _closing_braces(text: str) -> dict[int, int]:
    """Position of each ``{`` that is closed -> position of its ``}``, in one pass."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for index, char in enumerate(text):
        if char == "{":
            stack.append(index)
        elif char == "}" and stack:
            pairs[stack.pop()] = index
    return pairs


def _last_boxed_with_position(text: str) -> tuple[int, str] | None:
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    pairs = _closing_braces(text)
    found = None
    for match in _BOXED.finditer(text):
        close = pairs.get(match.end() - 1)
        if close is not None:
            found = (match.start(), text[match.end() : close])
    return found


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, or None."""
    found = _last_boxed_with_position(text)
    return None if found is None else found[1]


def _last_tagged(text: str) -> tuple[int, str] | None:
    lowered = text.lower()
    close = lowered.rfind("</answer>")
    start = lowered.rfind("<answer>", 0, close) if close >= 0 else -1
    return None if start < 0 else (start, text[start + len("<answer>") : close])


def _last_match(pattern: re.Pattern[str], text: str) -> tuple[int, str] | None:
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - we want the last match
        pass
    return None if last is None else (last.start(), last.group(1) if pattern.groups else last.group(0))


def without_units(text: str) -> str:
    """``13 points`` -> ``13``, ``\\frac{7}{6} pizzas each`` -> ``\\frac{7}{6}``: one or two plain words after a
    number are its unit (math-verify would read "points" as the product p*o*i*n*t*s). Not when one of them can
    change or negate the value: a word in NOT_UNITS ("13 dozen", "13 is wrong", "13 at most") or a plural ordinal
    ("13 hundredths"); the text then stays as it is, and is not read as the number."""
    match = _TRAILING_WORDS.search(text)
    if match is None or not all(map(_can_be_a_unit, match.group().lower().split())):
        return text
    return text[: match.start()]


def _can_be_a_unit(word: str) -> bool:
    return word not in NOT_UNITS and not _is_plural_ordinal(word)


def _is_plural_ordinal(word: str) -> bool:
    return word.endswith("ths") and word not in UNITS_ENDING_IN_THS


def value_changing_words(text: str) -> list[str]:
    """The words after the number at the end of ``text`` that change, negate or hedge it: ``13 is wrong`` ->
    ["is", "wrong"], ``13 hundredths`` -> ["hundredths"], ``13 points`` -> []."""
    match = _ALL_TRAILING_WORDS.search(text)
    words = match.group().lower().split() if match else []
    return [word for word in words if word in CHANGES_THE_VALUE or _is_plural_ordinal(word)]


# Math in $...$ first, then a space, punctuation or the end: "$x = 13$ where x is the count".
_LEADING_MATH = re.compile(r"\$[^$]+\$(?=[\s.,;:!?)]|\Z)")


def _reads_as_math(text: str) -> bool:
    """Yes for "13", "x = 13", "13 points" or "$x = 13$ where x is the count" (math-verify reads the math span),
    and for an answer its words change or hedge ("14 if we count twice": it is graded, and fails); no for
    "independent of the order", a "#### Verification" header or "$12$ or $13$" (two spans, a hedge)."""
    span = _LEADING_MATH.match(text)
    if span is not None:
        return "$" not in text[span.end() :]
    return bool(text) and (_WORD.search(without_units(text)) is None or bool(value_changing_words(text)))


def _clean(text: str, how: str) -> str:
    text = text.strip().rstrip(".").strip()
    if how != "boxed":  # markdown emphasis around a written answer: "The answer is **13**."
        text = text.strip("*_ \t").rstrip(".").rstrip("*_ \t")
    inner = last_boxed(text)  # "the answer is \boxed{5}." -> 5
    return inner.strip() if inner is not None else text


def final_answer(completion: str, last_number_fallback: bool = False) -> tuple[str | None, str]:
    """The last explicitly marked answer and how it was found: ``\\boxed{}``, ``#### x``, ``<answer>x</answer>``
    or "the answer is x", whichever comes last; with the fallback, else the last number.

    A prose marker (``####``, "the answer is") whose text is words, not math, does not replace an earlier answer:
    "\\boxed{13} ... Note: the answer is independent of the order" or a "#### Verification" header after the answer.
    """
    found = [
        (match.start(), match.group(1), how)
        for how, pattern in (("####", _HASHES), ("'the answer is'", _ANSWER_IS))
        for match in pattern.finditer(completion)
    ]
    for how, hit in (("boxed", _last_boxed_with_position(completion)), ("answer tag", _last_tagged(completion))):
        if hit is not None:
            found.append((hit[0], hit[1], how))
    chosen = None
    for _, text, how in sorted(found, key=lambda candidate: candidate[0]):
        text = _clean(text, how)
        if chosen is None or how not in PROSE_MARKERS or _reads_as_math(text):
            chosen = (text, how)
    if chosen is not None:
        return chosen
    if last_number_fallback:
        hit = _last_match(_NUMBER, completion)
        if hit is not None:
            return hit[1], "last number"
    return None, "none"
