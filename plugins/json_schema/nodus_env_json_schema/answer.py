"""Finding the JSON in a completion: the last fenced block that parses, else the first complete JSON object
or array in the prose."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

_FENCED = re.compile(r"```([a-zA-Z]*)[ \t]*\n(.*?)```", re.DOTALL)
MAX_STARTS = 200  # bounded: a hostile completion of 10^5 brackets must not cost 10^5 parse attempts


class NoJson(ValueError):
    pass


class _NotJson(ValueError):
    """Text that parses as JSON only by Python's lenient reading. Not a syntax error to skip past: the answer
    is refused, so that a nested value or another candidate cannot stand in for it."""


def _no_constant(name: str) -> Any:
    # Python reads NaN, Infinity and -Infinity; JSON has none of them (and NaN passes every numeric bound).
    raise _NotJson(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python keeps the last of duplicate keys; which one counts is not defined, so an answer may not have them.
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _NotJson(f"duplicate key {json.dumps(key)[:40]}")
        seen.add(key)
    return dict(pairs)


_DECODER = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_unique_keys)


def _starts_a_value(text: str, start: int) -> bool:
    try:
        _DECODER.raw_decode(text, start)
    except _NotJson:
        return True  # NaN or a duplicate key: a value all the same
    except (ValueError, RecursionError):
        return False
    return True


def extract_json(completion: str) -> tuple[Any, str]:
    """(value, where it was found); raises :class:`NoJson` with the reason."""
    blocks = [(match.group(1), match.group(2)) for match in _FENCED.finditer(completion)]
    errors = []
    for tag, block in reversed(blocks):
        try:
            return _DECODER.decode(block), "fenced block"
        except _NotJson as error:
            raise NoJson(f"the fenced block is not valid JSON ({error})") from None
        except json.JSONDecodeError as error:
            # A value and more. When the more is a second value, which one is the answer is not ours to guess;
            # a json block must hold its value alone. Any other block may be text that starts like a number or
            # a string (200 OK, 1. validate, "python" script.py): not JSON, skipped as any other.
            if error.msg == "Extra data" and _starts_a_value(block, error.pos):
                raise NoJson(
                    f"the fenced block holds more than one JSON value (the second at line {error.lineno}"
                    f" column {error.colno})"
                ) from None
            if error.msg == "Extra data" and tag.lower() == "json":
                raise NoJson(
                    f"the json block holds more than a JSON value (text after it at line {error.lineno}"
                    f" column {error.colno})"
                ) from None
            errors.append(str(error)[:80])
        except (ValueError, RecursionError) as error:
            errors.append(str(error)[:80])
    starts = (index for index, char in enumerate(completion) if char in "{[")
    for start in itertools.islice(starts, MAX_STARTS):
        try:
            value, _ = _DECODER.raw_decode(completion, start)
        except _NotJson as error:
            raise NoJson(f"the JSON in the prose is not valid JSON ({error})") from None
        except (ValueError, RecursionError):
            continue
        return value, "prose"
    if errors:
        raise NoJson(f"the last fenced block is not valid JSON ({errors[0]})")
    raise NoJson("no JSON found: answer with a ```json block or a JSON object")
