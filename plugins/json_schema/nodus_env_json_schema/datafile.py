"""User task files: JSONL of ``{"prompt", "schema"[, "expected": {pointer: value}][, "reference": value]}``.

Everything is checked when the file is loaded, so a broken task is the author's one-line error, never a 0
for the model: the schema must be valid in its dialect, the expected values must be JSON Pointers, and the
reference (given, or synthesised for simple schemas) must satisfy both.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from nodus.core.errors import NodusError

from nodus_env_json_schema.synthesis import CannotSynthesise, synthesise
from nodus_env_json_schema.validation import (
    FORMAT_EXTRA,
    FORMAT_PACKAGES,
    unchecked_formats,
    validator_for,
    violations,
)

FORMAT_HINT = (
    'each line must be {"prompt": "...", "schema": {...}, "expected": {"/json/pointer": value, ...}} '
    '(expected and "reference", a valid answer, are optional)'
)


class DataFileError(NodusError):
    """A task file that cannot be used; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class TaskSet:
    records: tuple[dict[str, Any], ...]
    digest: str


def load_task_file(path: str) -> TaskSet:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(
            f"{path}: cannot read the task file ({error.__class__.__name__}: {error}); "
            "pass an existing UTF-8 JSONL file with --param data=path.jsonl"
        ) from None
    records: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(lines, start=1):
        if line.strip():
            record = parse_record(f"{path}:{number}", line)
            records.setdefault(hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest(), record)
    if not records:
        raise DataFileError(f"{path}: the task file has no records; {FORMAT_HINT}")
    # Content-hash order and a digest of the set: reordering the file changes nothing, editing it does.
    digest = hashlib.sha256("".join(sorted(records)).encode()).hexdigest()
    return TaskSet(tuple(records[key] for key in sorted(records)), digest)


def parse_record(where: str, line: str) -> dict[str, Any]:
    try:
        raw = json.loads(line)
    except ValueError as error:
        raise DataFileError(f"{where}: not valid JSON ({error}); {FORMAT_HINT}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("prompt"), str) or not isinstance(raw.get("schema"), dict):
        raise DataFileError(f"{where}: needs a string 'prompt' and an object 'schema'; {FORMAT_HINT}")
    unknown = sorted(set(raw) - {"prompt", "schema", "expected", "reference"})
    if unknown:
        raise DataFileError(f"{where}: unknown field {unknown[0]!r}; {FORMAT_HINT}")
    try:
        validator = validator_for(raw["schema"])
    except jsonschema.SchemaError as error:
        raise DataFileError(f"{where}: the schema is invalid ({error.message[:160]}); fix the schema") from None
    for name in unchecked_formats(raw["schema"]):  # an unchecked format would accept anything: refuse the file
        package = FORMAT_PACKAGES.get(name)
        if package:
            raise DataFileError(
                f"{where}: format {name!r} cannot be checked without the {package} package; "
                f"pip install '{FORMAT_EXTRA}' (it brings {package}), or remove the format"
            )
        raise DataFileError(
            f"{where}: format {name!r} is not one jsonschema can check in this schema's dialect; "
            "remove it (a 'pattern' can say the same)"
        )
    expected = raw.get("expected", {})
    if not isinstance(expected, dict) or not all(key.startswith("/") for key in expected):
        raise DataFileError(f"{where}: 'expected' must map JSON Pointers like \"/name\" to values; {FORMAT_HINT}")
    if "reference" in raw:
        reference = raw["reference"]
    else:
        try:
            reference = synthesise(raw["schema"], expected)
        except CannotSynthesise as error:
            raise DataFileError(
                f"{where}: cannot build a valid answer for this schema ({error}); add a 'reference' field holding one"
            ) from None
    problems = violations(validator, expected, reference)
    if problems and "reference" not in raw:
        raise DataFileError(
            f"{where}: cannot build a valid answer for this schema ({problems[0]}); add a 'reference' field holding one"
        )
    if problems:
        raise DataFileError(f"{where}: the reference answer is not valid ({problems[0]}); fix it or the schema")
    return {
        "request": raw["prompt"],
        "schema": raw["schema"],
        "expected": expected,
        "reference": reference,
        "source": "file",
    }
