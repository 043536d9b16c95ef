"""Checking an answer: the schema (its declared dialect, Draft 2020-12 by default) and the requested values."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from jsonschema.protocols import Validator

from nodus_env_json_schema.schemas import resolve

MAX_LISTED = 20  # the sandbox cuts details at 4000 chars anyway


def validator_for(schema: dict[str, Any]) -> Validator:
    """A validator of the schema's ``$schema`` dialect; raises jsonschema's SchemaError if the schema is invalid."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)  # type: ignore[no-any-return]


def same_json(expected: Any, got: Any) -> bool:
    """JSON equality that keeps true apart from 1 (Python's == does not); 1 and 1.0 are the same JSON number."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, dict):
        return isinstance(got, dict) and expected.keys() == got.keys() and all(
            same_json(value, got[key]) for key, value in expected.items()
        )
    if isinstance(expected, list):
        return isinstance(got, list) and len(expected) == len(got) and all(map(same_json, expected, got))
    return bool(expected == got) and (isinstance(expected, int | float) == isinstance(got, int | float))


def violations(validator: Validator, expected: dict[str, Any], instance: Any) -> list[str]:
    """Every schema violation and every requested value that is missing or different."""
    problems = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path]):
        where = "/" + "/".join(str(part) for part in error.absolute_path)
        problems.append(f"at {where}: {error.message[:160]}")
    for pointer, value in expected.items():
        try:
            got = resolve(instance, pointer)
        except (KeyError, IndexError, TypeError, ValueError):
            problems.append(f"at {pointer}: missing, the request asks for {json.dumps(value)}")
            continue
        if not same_json(value, got):
            problems.append(f"at {pointer}: the request asks for {json.dumps(value)}, got {json.dumps(got)[:80]}")
    return problems


def summary(problems: list[str]) -> str:
    listed = "; ".join(problems[:MAX_LISTED])
    more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    return f"{len(problems)} violation{'s' if len(problems) != 1 else ''}: {listed}{more}"
