"""Finding the JSON in a completion: the last fenced block that parses, else the first complete JSON object
or array in the prose."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

_FENCED = re.compile(r"```[a-zA-Z]*[ \t]*\n(.*?)```", re.DOTALL)
MAX_STARTS = 200  # bounded: a hostile completion of 10^5 brackets must not cost 10^5 parse attempts
_DECODER = json.JSONDecoder()


class NoJson(ValueError):
    pass


def extract_json(completion: str) -> tuple[Any, str]:
    """(value, where it was found); raises :class:`NoJson` with the reason."""
    blocks = [match.group(1) for match in _FENCED.finditer(completion)]
    errors = []
    for block in reversed(blocks):
        try:
            return json.loads(block), "fenced block"
        except (ValueError, RecursionError) as error:
            errors.append(str(error)[:80])
    starts = (index for index, char in enumerate(completion) if char in "{[")
    for start in itertools.islice(starts, MAX_STARTS):
        try:
            value, _ = _DECODER.raw_decode(completion, start)
        except (ValueError, RecursionError):
            continue
        return value, "prose"
    if errors:
        raise NoJson(f"the last fenced block is not valid JSON ({errors[0]})")
    raise NoJson("no JSON found: answer with a ```json block or a JSON object")
