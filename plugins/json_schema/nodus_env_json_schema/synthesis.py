"""A valid instance for simple schemas, so user tasks without a ``reference`` still have one.

Handles const, enum, type, properties/required, items/minItems, numeric bounds and string lengths; anything
else (patterns, combinators, $ref) raises :class:`CannotSynthesise` and the author adds a reference.
"""

from __future__ import annotations

import math
from typing import Any

UNSUPPORTED = ("pattern", "allOf", "anyOf", "oneOf", "not", "$ref", "if", "format", "prefixItems", "contains")


class CannotSynthesise(ValueError):
    pass


def synthesise(schema: Any, expected: dict[str, Any]) -> Any:
    instance = _instance(schema)
    for pointer, value in expected.items():
        instance = _set(instance, pointer.split("/")[1:], value)
    return instance


def _instance(schema: Any) -> Any:
    if schema is True or schema == {}:
        return None
    if not isinstance(schema, dict):
        raise CannotSynthesise("the schema is false")
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    used = [key for key in UNSUPPORTED if key in schema]
    if used:
        raise CannotSynthesise(f"'{used[0]}' is not supported")
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object":
        properties = schema.get("properties", {})
        return {key: _instance(properties.get(key, {})) for key in schema.get("required", [])}
    if kind == "array":
        return [_instance(schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0 if "maximum" not in schema else None))
        value = schema.get("maximum", 0) if low is None else low + (1 if "exclusiveMinimum" in schema else 0)
        return math.ceil(value) if kind == "integer" else value
    if kind == "string":
        return "a" * schema.get("minLength", 0)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    raise CannotSynthesise(f"type {kind!r} is not supported")


def _set(document: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    if not isinstance(document, dict):
        document = {}
    head = tokens[0].replace("~1", "/").replace("~0", "~")
    return {**document, head: _set(document.get(head), tokens[1:], value)}
