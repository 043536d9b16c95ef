"""Finding the model's answer in a completion: ``<answer>...</answer>`` or a fenced json block, last wins."""

from __future__ import annotations

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_FENCED_JSON = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def last_answer(completion: str) -> str | None:
    """The text of the last answer block, or the whole completion when it is nothing but a JSON object."""
    candidates = [(m.start(), m.group(1)) for m in _ANSWER_TAG.finditer(completion)]
    candidates += [(m.start(), m.group(1)) for m in _FENCED_JSON.finditer(completion)]
    if candidates:
        return max(candidates, key=lambda c: c[0])[1].strip()
    stripped = completion.strip()
    return stripped if stripped.startswith("{") and stripped.endswith("}") else None
