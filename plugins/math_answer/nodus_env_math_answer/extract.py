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
_TRAILING_WORDS = re.compile(r"(?<=[\d}$])(?:[ \t]+[A-Za-z]{2,})+$")
# Words after a number that change its value, so they are not units: "13 thousand", "13 or more", "3 pi".
NOT_UNITS = frozenset(
    {"or", "and", "to", "than", "more", "less", "fewer", "plus", "minus", "times", "over", "squared", "cubed"}
    | {"percent", "pi", "sqrt", "inf", "infinity", "hundred", "thousand", "million", "billion"}
)
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
    """``13 points`` -> ``13``, ``\\frac{7}{6} pizzas each`` -> ``\\frac{7}{6}``: plain words after a number are its
    unit (math-verify would read "points" as the product p*o*i*n*t*s). Words in NOT_UNITS stay."""
    match = _TRAILING_WORDS.search(text)
    if match is None or any(word.lower() in NOT_UNITS for word in match.group().split()):
        return text
    return text[: match.start()]


def _reads_as_math(text: str) -> bool:
    """Yes for "13", "x = 13" or "13 points"; no for "independent of the order" or a "#### Verification" header."""
    return bool(text) and _WORD.search(without_units(text)) is None


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
