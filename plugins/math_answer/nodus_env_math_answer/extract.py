"""Finding the final answer in a completion.

Every scan is linear in the text (no regex that can backtrack across the whole input, one pass to match
braces), so hostile 1 MB completions cost milliseconds.
"""

from __future__ import annotations

import itertools
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
# Words after a number that scale it into another value ("13 dozen" is 156, "13 thirds" is 13/3) unless the question
# counts in them ("How many dozen ..."): see counted_words. "quarters" is one: 13/4, or 13 coins when the question
# asks "how many quarters".
SCALES = frozenset(
    {"hundred", "thousand", "million", "billion", "trillion", "quadrillion", "lakh", "crore", "hundreds", "thousands"}
    | {"millions", "billions", "trillions", "dozen", "dozens", "score", "gross", "tens", "half", "halves", "third"}
    | {"thirds", "quarter", "quarters", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "twelfth"}
    | {"hundredth", "thousandth", "millionth", "lakhs", "crores", "scores", "grand", "quintillion", "sextillion"}
    | {"myriad", "bn", "mn", "mil", "doz", "pair", "pairs"}
)
# Words after a number that change or negate its value, or hedge it: an answer with one after its number is not
# that number, though math-verify drops some of them ("13 trillion", "13 or more" and "13 untrue" read as 13).
CHANGES_THE_VALUE = SCALES | frozenset(
    {"or", "and", "to", "than", "plus", "minus", "times", "over", "squared", "cubed", "factorial", "root"}
    | {"reciprocal", "inverse", "inverted", "negative", "negated", "twice", "thrice", "doubled", "tripled", "halved"}
    | {"mod", "modulo", "divided", "choose", "below", "under", "off", "short", "shy", "if", "unless", "except"}
    | {"without", "is", "not", "no", "at", "about", "approximately", "approx", "roughly", "nearly", "almost"}
    | {"around", "maybe", "probably", "perhaps", "possibly", "likely", "unlikely", "but", "guess", "wrong"}
    | {"incorrect", "false", "untrue", "least", "most", "never", "ish", "max", "maximum", "minimum", "tops"}
    | {"rounded", "estimated", "estimate"}
)
# ... and so are plural ordinals, which name fractions ("13 hundredths" is 0.13): a number word and "ths". Other
# words ending in "ths" are units ("13 months", "13 youths", "13 truths").
PLURAL_ORDINAL_ENDINGS = (
    "fourths", "fifths", "sixths", "sevenths", "eighths", "ninths", "tenths", "elevenths", "twelfths", "teenths",
    "ieths", "hundredths", "thousandths", "illionths",
)  # fmt: skip
# Not "correct": "13 correct" is 13 (correct answers, or a correct 13); it is only reported with a word that negates
# it ("13 is not correct").
VERDICTS = frozenset({"correct"})
# Words after a number that are not its unit: those, and words math-verify reads ("3 pi", "50 percent"; it drops
# "more" and "less" as units: "13 more apples" answers "how many more").
NOT_UNITS = CHANGES_THE_VALUE | {"more", "less", "fewer", "percent", "pi", "sqrt", "inf", "infinity"}
NOT_UNITS |= {"per", "pct", "percents", "percentage"}  # "13 per cent" is 13%, not 13 of a unit "per cent"
_PERCENT_SPELLINGS = re.compile(r"\bper ?cents?\b|\bpcts?\b", re.IGNORECASE)


def normalized_percent(text: str) -> str:
    """Percent as math-verify reads it: "13 per cent", "13 pct" and "13 percents" -> "13 percent" (the grader then
    values it by the question); as written, "per cent" read as a unit and was dropped."""
    return _PERCENT_SPELLINGS.sub("percent", text)


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


def _boxes(text: str) -> list[tuple[int, int, int]]:
    """(start of ``\\boxed{``, start of its content, its closing brace) of each box with balanced braces."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return []
    pairs = _closing_braces(text)
    return [(m.start(), m.end(), pairs[m.end() - 1]) for m in _BOXED.finditer(text) if m.end() - 1 in pairs]


def _last_boxed_with_position(text: str) -> tuple[int, str] | None:
    boxes = _boxes(text)
    return (boxes[-1][0], text[boxes[-1][1] : boxes[-1][2]]) if boxes else None


# Words that make boxes on one line alternatives ("\\boxed{12} or \\boxed{13}") rather than steps to the last one
# ("\\boxed{5} apples, so the total is \\boxed{13}").
HEDGE_WORDS = frozenset({"or", "either", "maybe", "perhaps", "possibly", "otherwise", "alternatively", "else", "if"})
HEDGE_WORDS |= {"unless", "nor"}


def _final_boxed(text: str) -> tuple[int, str] | None:
    """The last box; with the boxes before it on its line when words between them make them alternatives:
    "\\boxed{12} or \\boxed{13}" -> "$12$ or $13$", two final answers, which the grader rejects unless they agree
    (math-verify would grade only the last). Otherwise earlier boxes are steps ("\\boxed{5} apples, so the total is
    \\boxed{13}") or earlier answers on earlier lines, which the last one replaces."""
    boxes = _boxes(text)
    if not boxes:
        return None
    line = [boxes[-1]]  # from the last box back
    for box in reversed(boxes[:-1]):
        if box[2] > line[-1][0] or text.find("\n", box[2], line[-1][0]) >= 0:
            break  # a box around the last one, or on an earlier line
        line.append(box)
    last = line[0]
    between = " ".join(text[earlier[2] + 1 : later[0]] for later, earlier in itertools.pairwise(line))
    if len(line) == 1 or not HEDGE_WORDS & {word.lower() for word in re.findall(r"[A-Za-z]+", between)}:
        return last[0], text[last[1] : last[2]]
    pieces: list[str] = []
    cursor = line[-1][0]
    for start, content, close in reversed(line):
        pieces += [text[cursor:start], "$", text[content:close], "$"]
        cursor = close + 1
    return last[0], "".join(pieces)


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


def without_units(text: str, counted: frozenset[str] = frozenset()) -> str:
    """``13 points`` -> ``13``, ``\\frac{7}{6} pizzas each`` -> ``\\frac{7}{6}``: one or two plain words after a
    number are its unit (math-verify would read "points" as the product p*o*i*n*t*s). Not when one of them can
    change or negate the value: a word in NOT_UNITS ("13 dozen", "13 is wrong", "13 at most") or a plural ordinal
    ("13 hundredths"), unless the question counts in it (``counted``); the text then stays as it is, and is not
    read as the number."""
    match = _TRAILING_WORDS.search(text)
    if match is None or not all(_can_be_a_unit(word, counted) for word in match.group().lower().split()):
        return text
    return text[: match.start()]


def _can_be_a_unit(word: str, counted: frozenset[str]) -> bool:
    return word in counted or (word not in NOT_UNITS and not _is_plural_ordinal(word))


def _is_plural_ordinal(word: str) -> bool:
    return word.endswith(PLURAL_ORDINAL_ENDINGS)


def value_changing_words(text: str, counted: frozenset[str] = frozenset()) -> list[str]:
    """The words after the number at the end of ``text`` that change, negate or hedge it: ``13 is wrong`` ->
    ["is", "wrong"], ``13 hundredths`` -> ["hundredths"], ``13 is not correct`` -> ["is", "not", "correct"],
    ``13 points`` and ``13 correct`` -> []; none of ``counted`` (``13 dozen`` when the question asks "how many
    dozen")."""
    match = _ALL_TRAILING_WORDS.search(text)
    words = [word for word in (match.group().lower().split() if match else []) if word not in counted]
    changing = [word for word in words if word in CHANGES_THE_VALUE or _is_plural_ordinal(word)]
    return [word for word in words if word in changing or word in VERDICTS] if changing else []


_HOW_MANY = re.compile(r"\bhow many ([A-Za-z]+)", re.IGNORECASE)


def counted_words(question: str) -> frozenset[str]:
    """The scale words a question counts in, singular and plural: "How many quarters does Bo have?" -> quarter,
    quarters. After the number, such a word is the unit the question asks for (13 coins), not a scale of the number
    (13/4); elsewhere it still is one, so "13 quarters" fails for a mean score of 13, and "24 dozen" for 24 eggs."""
    words = {match.group(1).lower() for match in _HOW_MANY.finditer(question)}
    forms = words | {word + "s" for word in words} | {word[:-1] for word in words if word.endswith("s")}
    return frozenset(word for word in forms if word in SCALES or _is_plural_ordinal(word))


# A percent that is the quantity asked ("what percent", "the percentage of", "in %"), not a rate the question gives
# ("a 25% discount", "25 percent of them"): a number just before it is a given rate.
_PERCENT_ASKED = re.compile(r"(?<![\d}\\])(?<![\d}][ \t])(?:\\?%|\bper ?cent(?:age)?s?\b)", re.IGNORECASE)


def asks_for_percent(question: str) -> bool:
    """Whether the question asks for a percentage, whose answer is the number of percent: 13 for "what percent of
    the marbles are red?" (13%, 13 percent or 13), where the same answer to any other question is 13/100."""
    return _PERCENT_ASKED.search(question) is not None


# Prose between the math of a final answer: "$x = 12$ if even else $x = 13$", "x = 12 \text{ if odd, } 13", and the
# logical "or" of "12 \lor 13". math-verify reads only the last piece.
_PROSE_BETWEEN_MATH = re.compile(r"\\\$|\$|\\[()\[\]]|\\(?:text[a-z]*|mbox) ?\{[^{}]*\}|\\(?:lor|vee)(?![A-Za-z])")
_VALUE_LIKE = re.compile(r"[\d\\]")


def math_pieces(answer: str) -> list[str]:
    """The pieces of math in a final answer between prose, each with a digit or a LaTeX command: "$x = 12$ if even
    else $x = 13$" -> ["x = 12", "x = 13"]; "$x = 13$ where $x$ is the count" -> ["x = 13"]."""
    return [piece for piece in _PROSE_BETWEEN_MATH.split(answer) if _VALUE_LIKE.search(piece)]


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


# An explanatory clause after a written answer: "The answer is 13, which is the mean", "$x = 13$ where $x$ is the
# count". It is not part of the answer, and left in, its words failed a right one ("is" can negate: "13 is wrong").
# (A comma or semicolon, or the first of a run of spaces: linear time on a line of 10^5 spaces, where "\s*[,;]\s*|\s+"
# backtracked quadratically, 13 s for 10,000.)
_EXPLANATION = re.compile(
    r"(?:[,;]\s*|(?<!\s)\s+)(?:which|where|since|because|as|so|that|i\.e\.|meaning|for|when|given)(?![A-Za-z])",
    re.IGNORECASE,
)
# ... but only a clause that can neither state another value (a digit) nor change, hedge, negate or retract this
# one: "13, which could also be 12", "13, which is wrong", "13, which can't be right", "13, which is a typo for
# twelve" and "13, which is about a dozen" stay whole, and fail. (Number words may explain: "the mean of the five
# scores".)
RETRACTIONS = frozenset({"can", "cannot", "couldn", "doesn", "don", "didn", "won", "wouldn", "shouldn", "aren"})
RETRACTIONS |= {"weren", "typo", "mistake", "error", "otherwise", "instead", "actually", "alternatively", "either"}
CLAUSE_KEEPS = (CHANGES_THE_VALUE - SCALES) | RETRACTIONS | {"more", "less", "fewer", "isn", "wasn", "nor"}
CLAUSE_KEEPS -= {"is", "and", "to", "at"}  # "which is equal to the mean", "the mean of the five scores"


def _without_explanation(text: str) -> str:
    match = _EXPLANATION.search(text)
    if match is None or match.start() == 0:
        return text
    clause = text[match.start() :]
    if re.search(r"\d", clause) or any(word.lower() in CLAUSE_KEEPS for word in re.findall(r"[A-Za-z]+", clause)):
        return text
    return text[: match.start()]


def _clean(text: str, how: str) -> str:
    text = text.strip().rstrip(".").strip()
    if how != "boxed":  # markdown emphasis around a written answer: "The answer is **13**."
        text = text.strip("*_ \t").rstrip(".").rstrip("*_ \t")
    if how in PROSE_MARKERS:
        text = _without_explanation(text)
    inner = last_boxed(text)  # "the answer is \boxed{5}." -> 5
    return inner.strip() if inner is not None else text


def final_answer(completion: str, last_number_fallback: bool = False) -> tuple[str | None, str]:
    """The last explicitly marked answer and how it was found: ``\\boxed{}``, ``#### x``, ``<answer>x</answer>``
    or "the answer is x", whichever comes last; with the fallback, else the last number.

    A prose marker (``####``, "the answer is") whose text is words, not math, does not replace an earlier answer:
    "\\boxed{13} ... Note: the answer is independent of the order" or a "#### Verification" header after the answer.
    Boxes on the line of the last one are part of the final answer (``\\boxed{12} or \\boxed{13}``: two answers).
    """
    found = [
        (match.start(), match.group(1), how)
        for how, pattern in (("####", _HASHES), ("'the answer is'", _ANSWER_IS))
        for match in pattern.finditer(completion)
    ]
    for how, hit in (("boxed", _final_boxed(completion)), ("answer tag", _last_tagged(completion))):
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
