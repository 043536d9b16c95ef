"""User problem files: JSONL in GSM8K form (``question``, ``answer`` ending ``#### N``) or MATH form
(``problem``, ``solution`` containing ``\\boxed{...}``).

Records are put in the order of their content hashes and the file's digest is a hash of that ordered set,
so reordering a file changes nothing, while changing any record changes every draw.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodus.core.errors import NodusError

from nodus_env_math_answer.extract import last_boxed

FORMAT_HINT = (
    "each line must be a JSON object with 'question' and an 'answer' ending in '#### <answer>' (GSM8K) or "
    "'problem' and a 'solution' containing \\boxed{<answer>} (MATH)"
)


class DataFileError(NodusError):
    """A problem file that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class ProblemSet:
    records: tuple[dict[str, str], ...]
    digest: str


def load_problem_file(path: str) -> ProblemSet:
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: cannot read the problem file ({error.__class__.__name__}: {error}); "
                            "pass an existing UTF-8 JSONL file with --param data=path.jsonl") from None
    records: dict[str, dict[str, str]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = parse_record(path, number, line)
        key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
        records.setdefault(key, record)  # an exact duplicate line is the same problem
    if not records:
        raise DataFileError(f"{path}: the problem file has no records; {FORMAT_HINT}")
    ordered = tuple(records[key] for key in sorted(records))
    digest = hashlib.sha256("".join(sorted(records)).encode()).hexdigest()
    return ProblemSet(ordered, digest)


def parse_record(path: str, number: int, line: str) -> dict[str, str]:
    where = f"{path}:{number}"
    try:
        raw: Any = json.loads(line)
    except ValueError as error:
        raise DataFileError(f"{where}: not valid JSON ({error}); {FORMAT_HINT}") from None
    if not isinstance(raw, dict):
        raise DataFileError(f"{where}: a JSON {type(raw).__name__}, not an object; {FORMAT_HINT}")
    if isinstance(raw.get("question"), str) and isinstance(raw.get("answer"), str):
        _, sep, final = raw["answer"].rpartition("####")
        answer = final.strip().replace(",", "")
        if not sep or not answer:
            raise DataFileError(f"{where}: the GSM8K 'answer' does not end in '#### <answer>'; {FORMAT_HINT}")
        return {"question": raw["question"].strip(), "answer": answer, "source": "gsm8k"}
    if isinstance(raw.get("problem"), str) and isinstance(raw.get("solution"), str):
        answer = last_boxed(raw["solution"])
        if not answer or not answer.strip():
            raise DataFileError(f"{where}: the MATH 'solution' has no \\boxed{{...}} answer; {FORMAT_HINT}")
        return {"question": raw["problem"].strip(), "answer": answer.strip(), "source": "math"}
    keys = ", ".join(sorted(map(str, raw))) or "none"
    raise DataFileError(f"{where}: unknown record form (keys: {keys}); {FORMAT_HINT}")
