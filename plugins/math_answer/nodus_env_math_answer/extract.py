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


def final_answer(completion: str, last_number_fallback: bool = False) -> tuple[str | None, str]:
    """The last explicitly marked answer and how it was found: ``\\boxed{}``, ``#### x``, ``<answer>x</answer>``
    or "the answer is x", whichever comes last; with the fallback, else the last number."""
    candidates = {
        "boxed": _last_boxed_with_position(completion),
        "####": _last_match(_HASHES, completion),
        "answer tag": _last_tagged(completion),
        "'the answer is'": _last_match(_ANSWER_IS, completion),
    }
    found = [(position, text, how) for how, hit in candidates.items() if hit is not None for position, text in [hit]]
    if found:
        _, text, how = max(found, key=lambda candidate: candidate[0])
        text = text.strip().rstrip(".").strip()
        inner = last_boxed(text)  # "the answer is \boxed{5}." -> 5
        return (inner.strip() if inner is not None else text), how
    if last_number_fallback:
        hit = _last_match(_NUMBER, completion)
        if hit is not None:
            return hit[1], "last number"
    return None, "none"
