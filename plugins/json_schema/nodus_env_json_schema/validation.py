"""Checking an answer: the schema (its declared dialect, Draft 2020-12 by default) and the requested values."""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
from jsonschema.protocols import Validator

from nodus_env_json_schema.schemas import resolve

MAX_LISTED = 20  # the sandbox cuts details at 4000 chars anyway


def validator_for(schema: dict[str, Any]) -> Validator:
    """A validator of the schema's ``$schema`` dialect; raises jsonschema's SchemaError if the schema is invalid.

    It asserts ``format`` (jsonschema only annotates it unless given a format checker; a data file with a format
    it cannot check is refused at load time, see :func:`unchecked_formats`), and reads ``pattern`` as ECMA-262
    does for ``$``."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return _with_ecma_pattern(cls)(schema, format_checker=_format_checker(cls))  # type: ignore[no-any-return]


# Formats whose grammar is ASCII, whose checkers take other digits too (str.isdigit, int() and UUID() read "١" or
# "①" as digits): "١٢٣٤٥٦٧٨-..." passed as a uuid, "a١.example.com" as a hostname.
_ASCII_FORMATS = frozenset(
    ("date-time", "date", "time", "duration", "ipv4", "ipv6", "ip-address", "hostname", "host-name", "uuid", "uri")
) | {"uri-reference", "utc-millisec"}


@functools.cache
def _format_checker(cls: type[Validator]) -> jsonschema.FormatChecker:
    """The dialect's format checker, for which every exception of a check is a format violation.

    jsonschema turns only the exceptions a checker declares into a FormatError; any other escaped ``grade()`` and
    crashed the grader (its relative-json-pointer checker calls ``int("²")``, since ``"²".isdigit()``, and the
    ValueError went through; ``re.compile`` raises OverflowError on ``a{1,99999999999}``). A string a checker
    cannot read is not of its format. Digits must be ASCII where the format's grammar says so (``"①#"`` passed
    as a relative JSON pointer)."""
    checker = jsonschema.FormatChecker(formats=())
    checks = cls.FORMAT_CHECKER.checkers.items()
    checker.checkers = {name: (_ascii_where_required(name, check), Exception) for name, (check, _) in checks}
    return checker


def _ascii_where_required(name: str, check: Callable[[object], bool]) -> Callable[[object], bool]:
    if name != "relative-json-pointer" and name not in _ASCII_FORMATS:
        return check

    def ascii_check(instance: object) -> bool:
        if isinstance(instance, str):
            # a relative JSON pointer's leading integer; the JSON Pointer after it may be any text
            ascii_part = "".join(itertools.takewhile(str.isdigit, instance)) if name not in _ASCII_FORMATS else instance
            if not ascii_part.isascii():
                return False
        return check(instance)

    return ascii_check


@functools.cache
def _with_ecma_pattern(cls: type[Validator]) -> type[Validator]:
    return jsonschema.validators.extend(cls, {"pattern": _ecma_pattern})  # type: ignore[no-any-return]


def _ecma_pattern(
    validator: Validator, pattern: str, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    # jsonschema searches with Python's re, whose `$` also matches before a final newline: "FDJ-3593\n" passed
    # "^[A-Z]{3}-[0-9]{4}$". JSON Schema patterns are ECMA-262 regexes, where `$` is the very end of the string.
    if validator.is_type(instance, "string") and not re.search(ecma_end_anchors(pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.lru_cache(maxsize=1024)
def ecma_end_anchors(pattern: str) -> str:
    """``pattern`` with every ``$`` anchor made ``\\Z`` (end of string only); an escaped ``\\$`` and a ``$`` in a
    character class are literal dollars and stay as they are."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":  # an escape: copy it with the character it escapes
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            # Python reads a "]" right after "[" or "[^" as a literal, not as the end of the class.
            end = i + 1
            end += pattern.startswith("^", end)
            end += pattern.startswith("]", end)
            out.append(pattern[i:end])
            i, in_class = end, True
            continue
        elif char == "$":
            char = "\\Z"
        out.append(char)
        i += 1
    return "".join(out)


# Formats jsonschema checks only with an extra package installed (see jsonschema/_format.py; draft 3 left out):
# the packages of jsonschema's format-nongpl extra, which this plugin depends on. jsonschema also checks uri and
# iri with rfc3987, but that one is GPL-licensed: never name it.
FORMAT_EXTRA = "jsonschema[format-nongpl]"
FORMAT_PACKAGES = {
    "date-time": "rfc3339-validator",
    "time": "rfc3339-validator",
    "hostname": "fqdn",
    "idn-hostname": "idna",
    "uri": "rfc3986-validator",
    "uri-reference": "rfc3986-validator",
    "iri": "rfc3987-syntax",
    "iri-reference": "rfc3987-syntax",
    "json-pointer": "jsonpointer",
    "relative-json-pointer": "jsonpointer",
    "uri-template": "uri-template",
    "duration": "isoduration",
}
# Keywords whose values are data, not schemas (a "format" key in them is not the format keyword) ...
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
# ... and keywords whose values map names to schemas (a property may be called "format" or "enum").
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)


def unchecked_formats(schema: Any) -> list[str]:
    """The ``format`` values in the schema that its dialect's format checker cannot check here."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return sorted(_formats_in(schema) - set(cls.FORMAT_CHECKER.checkers))


def _formats_in(schema: Any) -> set[str]:
    if isinstance(schema, list):
        return set().union(*map(_formats_in, schema))
    if not isinstance(schema, dict):
        return set()
    found = {schema["format"]} if isinstance(schema.get("format"), str) else set()
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            found |= _formats_in(list(value.values()))
        elif key not in _DATA_KEYWORDS:
            found |= _formats_in(value)
    return found


def same_json(expected: Any, got: Any) -> bool:
    """JSON equality that keeps true apart from 1 (Python's == does not); 1 and 1.0 are the same JSON number."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and expected.keys() == got.keys()
            and all(same_json(value, got[key]) for key, value in expected.items())
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
