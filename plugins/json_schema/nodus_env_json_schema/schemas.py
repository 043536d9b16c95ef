"""Random JSON Schemas, each with a witness instance that satisfies it.

Every property is drawn together with a value that meets its constraints, so the witness is valid by
construction (and the tests check it against ``jsonschema``). The request fixes some witness values.
"""

from __future__ import annotations

import json
import random
import string
from typing import Any

DIALECT = "https://json-schema.org/draft/2020-12/schema"
ENTITIES = ("customer order", "library book", "sensor reading", "employee record", "concert ticket", "recipe")
NAMES = {
    "string": ("name", "title", "city", "status", "code", "email", "slug", "date", "label", "color"),
    "integer": ("age", "count", "quantity", "year", "rank", "floor", "seats", "pages"),
    "number": ("price", "weight", "score", "latitude", "temperature", "ratio"),
    "boolean": ("active", "verified", "archived", "public"),
    "array": ("tags", "items", "scores", "members", "parts", "readings"),
    "object": ("address", "details", "location", "meta", "author", "venue"),
}
WORDS = ("alpha", "delta", "lyon", "oslo", "ruby", "amber", "north", "maple", "cedar", "orbit", "pixel", "tango")
# Strings whose name says what they hold get a pattern and a way to make a matching value.
PATTERNS: dict[str, tuple[str, Any]] = {
    "code": ("^[A-Z]{3}-[0-9]{4}$", lambda r: "".join(r.choices(UPPER, k=3)) + f"-{r.randrange(10**4):04d}"),
    "slug": ("^[a-z]+(-[a-z]+)*$", lambda r: "-".join(r.sample(WORDS, r.randint(1, 3)))),
    "date": (
        "^[0-9]{4}-[0-9]{2}-[0-9]{2}$",
        lambda r: f"{r.randint(1990, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    ),
    "email": (
        "^[a-z]+@[a-z]+\\.(com|org)$",
        lambda r: f"{r.choice(WORDS)}@{r.choice(WORDS)}.{r.choice(['com', 'org'])}",
    ),
}
UPPER = string.ascii_uppercase
ENUM_NAMES = ("city", "status", "color")


def _string(rng: random.Random, name: str) -> tuple[dict[str, Any], Any]:
    if name in PATTERNS:
        pattern, make = PATTERNS[name]
        return {"type": "string", "pattern": pattern}, make(rng)
    if name in ENUM_NAMES:
        options = sorted(rng.sample(WORDS, rng.randint(2, 4)))
        return {"type": "string", "enum": options}, rng.choice(options)
    low = rng.randint(1, 4)
    high = low + rng.randint(2, 8)
    value = rng.choice(WORDS)[: rng.randint(low, high)].ljust(low, "x")
    return {"type": "string", "minLength": low, "maxLength": high}, value


def _integer(rng: random.Random, name: str = "") -> tuple[dict[str, Any], Any]:
    low = rng.randint(-100, 100)
    high = low + rng.randint(0, 500)
    return {"type": "integer", "minimum": low, "maximum": high}, rng.randint(low, high)


def _number(rng: random.Random, name: str = "") -> tuple[dict[str, Any], Any]:
    low = rng.randint(-50, 50)
    high = low + rng.randint(1, 100)
    value = round(rng.uniform(low, high), 2)
    return {"type": "number", "minimum": low, "exclusiveMaximum": high + 0.5}, min(max(value, low), high)


def _boolean(rng: random.Random, name: str = "") -> tuple[dict[str, Any], Any]:
    return {"type": "boolean"}, rng.random() < 0.5


def _array(rng: random.Random, depth: int) -> tuple[dict[str, Any], Any]:
    low = rng.randint(0, 2)
    high = low + rng.randint(1, 3)
    if depth > 1 and rng.random() < 0.4:
        items = _object(rng, depth - 1, max_properties=3)[0]
    else:
        items = _string(rng, "label")[0] if rng.random() < 0.5 else _integer(rng)[0]
    values = [_value_for(items, rng) for _ in range(rng.randint(low, high))]
    return {"type": "array", "items": items, "minItems": low, "maxItems": high}, values


def _value_for(schema: dict[str, Any], rng: random.Random) -> Any:
    """Another valid value for a schema this module generated (for array items)."""
    kind = schema["type"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "pattern" in schema:
        return next(make for pattern, make in PATTERNS.values() if pattern == schema["pattern"])(rng)
    if kind == "string":
        return "".join(rng.choices(string.ascii_lowercase, k=schema["minLength"]))
    if kind == "integer":
        return rng.randint(schema["minimum"], schema["maximum"])
    if kind == "number":
        return schema["minimum"]
    if kind == "boolean":
        return False
    if kind == "array":
        return [_value_for(schema["items"], rng) for _ in range(schema["minItems"])]
    return {key: _value_for(sub, rng) for key, sub in schema["properties"].items() if key in schema["required"]}


SCALARS = {"string": _string, "integer": _integer, "number": _number, "boolean": _boolean}


def _object(rng: random.Random, depth: int, max_properties: int = 5) -> tuple[dict[str, Any], dict[str, Any]]:
    kinds = ["string", "integer", "number", "boolean"] + (["array", "object"] if depth > 1 else ["array"])
    properties: dict[str, Any] = {}
    witness: dict[str, Any] = {}
    for _ in range(rng.randint(2, max_properties)):
        kind = rng.choice(kinds)
        name = rng.choice([n for n in NAMES[kind] if n not in properties] or [f"{kind}_{len(properties)}"])
        if kind == "object":
            schema, value = _object(rng, depth - 1, max_properties=3)
        elif kind == "array":
            schema, value = _array(rng, depth)
        else:
            schema, value = SCALARS[kind](rng, name)
        properties[name], witness[name] = schema, value
    required = sorted(name for name in properties if rng.random() < 0.7) or [next(iter(properties))]
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    # Optional properties stay in the witness only sometimes: the reference shows both cases.
    witness = {key: value for key, value in witness.items() if key in required or rng.random() < 0.5}
    return schema, witness


def leaf_pointers(value: Any, schema: dict[str, Any], prefix: str = "") -> list[str]:
    """JSON Pointers of the scalar values of ``value`` under required properties (what a request may fix)."""
    if isinstance(value, dict):
        pointers = []
        for key in schema.get("required", []):
            if key in value:
                pointers += leaf_pointers(value[key], schema["properties"][key], f"{prefix}/{key}")
        return pointers
    return [] if isinstance(value, list) else [prefix]


def generate_schema_task(rng: random.Random, depth: int, fixed_values: int) -> dict[str, Any]:
    schema, witness = _object(rng, depth)
    schema = {"$schema": DIALECT, "title": rng.choice(ENTITIES), **schema}
    pointers = leaf_pointers(witness, schema)
    chosen = sorted(rng.sample(pointers, min(fixed_values, len(pointers))))
    expected = {pointer: resolve(witness, pointer) for pointer in chosen}
    return {"schema": schema, "expected": expected, "reference": witness, "request": request_text(schema, expected),
            "source": "generated"}


def request_text(schema: dict[str, Any], expected: dict[str, Any]) -> str:
    wanted = "; ".join(
        f"{pointer[1:].replace('/', '.')} must be {json.dumps(value)}" for pointer, value in expected.items()
    )
    return f"Create a JSON record for a {schema['title']}." + (f" In it, {wanted}." if wanted else "")


def resolve(document: Any, pointer: str) -> Any:
    """The value at a JSON Pointer (RFC 6901); KeyError/IndexError/TypeError when absent."""
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        document = document[int(token)] if isinstance(document, list) else document[token]
    return document
