"""Checking an answer: the schema (its declared dialect, Draft 2020-12 by default) and the requested values."""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
from jsonschema.exceptions import FormatError
from jsonschema.protocols import Validator
from referencing.jsonschema import lookup_recursive_ref

from nodus_env_json_schema.schemas import resolve

MAX_LISTED = 20  # the sandbox cuts details at 4000 chars anyway


def validator_for(schema: dict[str, Any]) -> Validator:
    """A validator of the schema's ``$schema`` dialect; raises jsonschema's SchemaError if the schema is invalid.

    It asserts ``format`` (jsonschema only annotates it unless given a format checker; a data file with a format
    it cannot check is refused at load time, see :func:`unchecked_formats`), and reads ``pattern`` as ECMA-262
    does for ``$``."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    for name in _property_name_patterns(schema):
        try:
            re.compile(ecma_translated(name))
        except (re.error, OverflowError) as error:
            # Draft 4's meta-schema does not check these names, and a bad one raised in every grading instead.
            message = f"{name!r} in patternProperties is not a valid regular expression ({error})"
            raise jsonschema.SchemaError(message) from None
    return _with_ecma_regexes(cls)(schema, format_checker=_format_checker(cls))  # type: ignore[no-any-return]


def _property_name_patterns(schema: Any) -> Iterator[str]:
    # Every subtree: a property may be named "enum" or "default" (so a name cannot tell data from schema), and a
    # "patternProperties" that is only data inside an enum is too rare to leave a crash for.
    if isinstance(schema, list):
        for item in schema:
            yield from _property_name_patterns(item)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            if key == "patternProperties" and isinstance(value, dict):
                yield from value
            yield from _property_name_patterns(value)


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
    checker = _LengthBoundFormatChecker(formats=())
    checks = cls.FORMAT_CHECKER.checkers.items()
    checker.checkers = {name: (_ascii_where_required(name, check), Exception) for name, (check, _) in checks}
    return checker


# rfc3987-syntax checks an iri with an Earley parser: about 1 ms and 15 kB per character (a 5,000-character iri took
# 5 s of the grader's 10 and 128 MB; a 50,000-character one 50 s and 775 MB). Longer ones are refused unchecked: a
# URL is at most 2,048 characters in practice (browsers and the sitemaps protocol).
MAX_IRI_LENGTH = 2048
_SLOW_FORMATS = frozenset({"iri", "iri-reference"})


class _LengthBoundFormatChecker(jsonschema.FormatChecker):
    def check(self, instance: object, format: str) -> None:
        if format in _SLOW_FORMATS and isinstance(instance, str) and len(instance) > MAX_IRI_LENGTH:
            raise FormatError(
                f"{instance[:40]!r}... is not checked as an {format!r}: {len(instance)} characters, over the"
                f" {MAX_IRI_LENGTH} allowed"
            )
        super().check(instance, format)


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


# JSON Schema reads its regexes (pattern, patternProperties, propertyNames' pattern) as ECMA-262 ones. jsonschema
# runs them through Python's re, which reads some of the same syntax differently; each keyword that applies a
# schema regex is replaced below by one that searches with `ecma_search`, so that every one reads it the same way.
@functools.cache
def _with_ecma_regexes(cls: type[Validator]) -> type[Validator]:
    legacy = "$recursiveRef" in cls.VALIDATORS  # draft 2019-09 finds unevaluated properties its own way
    keywords = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "unevaluatedProperties": _unevaluated_properties_legacy if legacy else _unevaluated_properties,
    }
    return jsonschema.validators.extend(  # type: ignore[no-any-return]
        cls, {name: keyword for name, keyword in keywords.items() if name in cls.VALIDATORS}
    )


# Character sets of ECMA-262's class escapes, as (first, last) code points. \d and \w are ASCII there (with or
# without the u flag; Python's take every Unicode digit and letter: "١٢٣" matched ^\d+$); \s is the WhiteSpace and
# LineTerminator code points (Python's \s also takes U+001C-U+001F and U+0085, and not U+FEFF).
Ranges = tuple[tuple[int, int], ...]
_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_LINE_TERMINATOR: Ranges = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
_SPACE: Ranges = (
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
    (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
)  # fmt: skip


def _complement(ranges: Ranges) -> Ranges:
    starts = [0] + [last + 1 for _, last in ranges]
    ends = [first - 1 for first, _ in ranges] + [0x10FFFF]
    return tuple((start, end) for start, end in zip(starts, ends, strict=True) if start <= end)


def _class_body(ranges: Ranges) -> str:
    def char(code: int) -> str:
        if chr(code).isascii() and chr(code).isalnum():
            return chr(code)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"

    return "".join(char(first) if first == last else f"{char(first)}-{char(last)}" for first, last in ranges)


_IN_CLASS = {
    name: _class_body(ranges)
    for letter, ranges in (("d", _DIGIT), ("w", _WORD), ("s", _SPACE))
    for name, ranges in ((letter, ranges), (letter.upper(), _complement(ranges)))
}
_WORD_CLASS = f"[{_IN_CLASS['w']}]"
_OUT_OF_CLASS = {name: f"[{body}]" for name, body in _IN_CLASS.items()} | {
    "b": f"(?:(?<={_WORD_CLASS})(?!{_WORD_CLASS})|(?<!{_WORD_CLASS})(?={_WORD_CLASS}))",
    "B": f"(?:(?<={_WORD_CLASS})(?={_WORD_CLASS})|(?<!{_WORD_CLASS})(?!{_WORD_CLASS}))",
}
_DOT = f"[^{_class_body(_LINE_TERMINATOR)}]"  # Python's "." takes "\r", U+2028 and U+2029; ECMA-262's does not


@functools.lru_cache(maxsize=1024)
def ecma_translated(pattern: str) -> str:
    """``pattern`` (an ECMA-262 regex) as a Python regex that matches what ECMA-262 (with or without the u flag,
    which JSON Schema asks for since 2019-09) matches: ``$`` is ``\\Z`` (Python's ``$`` also matches before a final
    newline: "FDJ-3593\\n" passed "^[A-Z]{3}-[0-9]{4}$"), ``.`` takes no line terminator, and ``\\d \\D \\w \\W \\s
    \\S \\b \\B`` are ECMA-262's sets, spelt out (in a character class too). An escaped ``\\$`` or ``\\.`` and the
    ``$`` or ``.`` in a character class stay literal.

    What is left as Python reads it (a JSON Schema author rarely writes any of it): inline flags such as ``(?i)``
    or ``(?s)``, which ECMA-262 has not, and what they do to the sets above; ``\\A``, ``\\Z``, ``(?P<name>...)``
    and ``(?#...)``, which are Python's; ``{,n}`` (Python: 0 to n repeats; ECMA-262: the literal text) and ``\\a``
    (Python: a bell; ECMA-262: the letter); ``[]`` and ``[^]``, where Python reads the ``]`` as a member; code points,
    not the UTF-16 code units of ECMA-262 without the u flag (which drafts before 2019-09 do not ask for), so ``.``
    takes a whole astral character. ECMA-262 syntax that Python refuses (``(?<name>...)``, ``\\cX``, ``\\p{...}``)
    makes the schema invalid: jsonschema checks ``pattern`` with Python's re (and patternProperties' names from
    draft 6 on)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":  # an escape: a class escape spelt out, any other copied with the character it escapes
            escape = pattern[i : i + 2]
            out.append((_IN_CLASS if in_class else _OUT_OF_CLASS).get(escape[1:], escape))
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif pattern.startswith("(?#", i):  # a Python comment, to the first unescaped ")": copied as it is
            end = i + 3
            while end < len(pattern) and pattern[end] != ")":
                end += 2 if pattern[end] == "\\" else 1
            out.append(pattern[i : end + 1])
            i = end + 1
            continue
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
        elif char == ".":
            char = _DOT
        out.append(char)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def _ecma_compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(ecma_translated(pattern))


def ecma_search(pattern: str, text: str) -> bool:
    """Whether the ECMA-262 regex ``pattern`` matches somewhere in ``text``: what every keyword here matches with."""
    return _ecma_compiled(pattern).search(text) is not None


# The keywords below are jsonschema's own (jsonschema/_keywords.py, _utils.py and _legacy_keywords.py, 4.26), but
# for ecma_search where those call re.search (and an unevaluated property is listed once, not once per error).
def _pattern(validator: Validator, pattern: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if validator.is_type(instance, "string") and not ecma_search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Validator, pattern_properties: dict[str, Any], instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for key, value in instance.items():
            if ecma_search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Validator, additional: Any, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = {
        key for key in instance if key not in properties and not any(ecma_search(pattern, key) for pattern in patterns)
    }
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield jsonschema.ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            yield jsonschema.ValidationError(f"Additional properties are not allowed ({_extras(sorted(extras))})")


def _extras(extras: list[Any], what: str = "unexpected") -> str:
    return f"{', '.join(repr(extra) for extra in extras)} {'was' if len(extras) == 1 else 'were'} {what}"


def _unevaluated_properties(
    validator: Validator, unevaluated: Any, instance: Any, schema: Any, legacy: bool = False
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema, legacy)
    invalid = [
        key
        for key in instance
        if key not in evaluated and next(validator.descend(instance[key], unevaluated, path=key, schema_path=key), None)
    ]
    if invalid and unevaluated is False:
        yield jsonschema.ValidationError(f"Unevaluated properties are not allowed ({_extras(sorted(invalid))})")
    elif invalid:
        listed = _extras(invalid, "unevaluated and invalid")
        yield jsonschema.ValidationError(f"Unevaluated properties are not valid under the given schema ({listed})")


def _unevaluated_properties_legacy(
    validator: Validator, unevaluated: Any, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    return _unevaluated_properties(validator, unevaluated, instance, schema, legacy=True)


def _evaluated_keys(validator: Validator, instance: dict[str, Any], schema: Any, legacy: bool) -> set[str]:
    """The properties of ``instance`` that ``schema`` evaluates: jsonschema's find_evaluated_property_keys_by_schema
    (with ``legacy``, its draft 2019-09 one), matching patternProperties with ecma_search."""
    if validator.is_type(schema, "boolean"):
        return set()
    keys: set[str] = set()
    resolved = []
    if "$ref" in schema:
        resolved.append(validator._resolver.lookup(schema["$ref"]))  # type: ignore[attr-defined]
    if legacy and "$recursiveRef" in schema:
        resolved.append(lookup_recursive_ref(validator._resolver))  # type: ignore[attr-defined]
    if not legacy and "$dynamicRef" in schema:
        resolved.append(validator._resolver.lookup(schema["$dynamicRef"]))  # type: ignore[attr-defined]
    for target in resolved:
        evolved = validator.evolve(schema=target.contents, _resolver=target.resolver)
        keys |= _evaluated_keys(evolved, instance, target.contents, legacy)

    if legacy:
        for keyword in ("properties", "additionalProperties", "unevaluatedProperties"):
            value = schema.get(keyword)
            if validator.is_type(value, "boolean") and value:
                keys |= instance.keys()
            elif validator.is_type(value, "object"):
                keys |= value.keys() & instance.keys()
    else:
        if validator.is_type(schema.get("properties"), "object"):
            keys |= schema["properties"].keys() & instance.keys()
        for keyword in ("additionalProperties", "unevaluatedProperties"):
            if schema.get(keyword) is not None:
                keys |= {key for key, value in instance.items() if _valid(validator.descend(value, schema[keyword]))}

    for pattern in schema.get("patternProperties", {}):
        keys |= {key for key in instance if ecma_search(pattern, key)}
    for key, subschema in schema.get("dependentSchemas", {}).items():
        if key in instance:
            keys |= _evaluated_keys(validator, instance, subschema, legacy)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if _valid(validator.descend(instance, subschema)):
                keys |= _evaluated_keys(validator, instance, subschema, legacy)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"], legacy)
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"], legacy)
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"], legacy)
    return keys


def _valid(errors: Iterator[jsonschema.ValidationError]) -> bool:
    return next(errors, None) is None


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
