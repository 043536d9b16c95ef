"""Completions a grader must survive: hostile text, and near-misses of the reference answer.

Plain ``random.Random`` rather than hypothesis, so ``grpo check`` runs without test dependencies; the
hypothesis strategies in :mod:`nodus.core.testing.strategies` reuse these.
"""

from __future__ import annotations

import random

HUGE_BYTES = 1_000_000

# Fixed hostile inputs, each aimed at a usual way graders break.
HOSTILE: tuple[tuple[str, str], ...] = (
    ("empty", ""),
    ("whitespace", " \n\t\r\n "),
    ("unicode", "Ünïcödé ✓ 答案是 四十二 🙂 \u202edesrever\u202c \ufeff\u200b ½ ⅔ −7 ٣"),
    ("nul_bytes", "\x00" * 64),
    ("control_chars", "\x1b[31mred\x1b[0m\r\x08\x7f\x0c\x0b"),
    ("deep_brackets", "[" * 20_000 + "]" * 20_000),
    ("deep_braces", "{" * 20_000),
    ("deep_parens", "(" * 20_000 + "1" + ")" * 20_000),
    ("many_numbers", " ".join(str(n) for n in range(20_000))),
    ("fences_only", "```\n```\n```python\n```json\n"),
    ("tags_only", "<answer></answer> \\boxed{} #### the answer is"),
)


def huge_completions(reference: str) -> list[tuple[str, str]]:
    """About a megabyte each: filler alone, and filler followed by the right answer."""
    filler = ("lorem 12 ipsum 3.5 { [ ( " * (HUGE_BYTES // 25 + 1))[:HUGE_BYTES]
    return [("huge_filler", filler), ("huge_then_reference", filler + "\n" + reference)]


def near_misses(reference: str, rng: random.Random) -> list[tuple[str, str]]:
    """The reference slightly broken: almost-right answers that must still grade without error."""
    misses: list[tuple[str, str]] = []
    if reference:
        cut = rng.randrange(len(reference))
        misses.append(("reference_truncated", reference[:cut]))
        misses.append(("reference_without_last_char", reference[:-1]))
        position = rng.randrange(len(reference))
        misses.append(("reference_with_nul", reference[:position] + "\x00" + reference[position:]))
        misses.append(("reference_char_changed", change_one_char(reference, rng)))
        misses.append(("reference_uppercased", reference.upper()))
    misses.append(("reference_twice", reference + "\n" + reference))
    misses.append(("reference_in_prose", f"I think so.\n{reference}\nBut I am not sure; maybe not."))
    return misses


def change_one_char(text: str, rng: random.Random) -> str:
    """Change one digit if there is one (the likeliest almost-right answer), else one character."""
    digits = [i for i, ch in enumerate(text) if ch.isdigit()]
    if digits:
        i = rng.choice(digits)
        return text[:i] + str((int(text[i]) + rng.randrange(1, 10)) % 10) + text[i + 1 :]
    i = rng.randrange(len(text))
    return text[:i] + ("y" if text[i] == "x" else "x") + text[i + 1 :]


def random_text(rng: random.Random, max_length: int = 200) -> str:
    """Random text across scripts, symbols and control characters (no lone surrogates: no tokenizer emits them)."""
    alphabet = "abcXYZ019 \n\t{}[]()<>\"'\\#$%^&*-+=/.,:;!?`~|_\x00\x01é中🙂ß∑√π½"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(max_length + 1)))
