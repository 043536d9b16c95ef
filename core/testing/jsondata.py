"""Task data must survive JSON: the sandbox grades a task rebuilt from JSON, not the object ``generate`` made.

``{3: "x"}`` becomes ``{"3": "x"}`` and a tuple a list on the way, so a grader that passes in-process can raise
a KeyError in the sandbox. This finds the first value that does not come back equal, by its path.
"""

from __future__ import annotations

import json
from typing import Any


def json_problem(value: Any, path: str = "data") -> str | None:
    """Where ``json.loads(json.dumps(value)) != value`` first happens, and why; None when it round-trips."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the {type(key).__name__} key {key!r}, which JSON turns into a string"
            problem = json_problem(item, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(value, tuple):
        return f"{path} is a tuple, which JSON turns into a list"
    if isinstance(value, list):
        for index, item in enumerate(value):
            problem = json_problem(item, f"{path}[{index}]")
            if problem:
                return problem
        return None
    try:  # allow_nan=False as in the sandbox's encoder: NaN and infinities are not JSON
        back = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as error:
        return f"{path} = {_short(value)} is not JSON ({error})"
    if back != value:
        return f"{path} = {_short(value)} comes back from JSON as {_short(back)}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
