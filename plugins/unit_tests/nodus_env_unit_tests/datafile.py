"""User problem files: JSONL in HumanEval form (``task_id``, ``prompt``, ``canonical_solution``, ``test``,
``entry_point``; the program is prompt + completion) or MBPP form (``text``, ``code``, ``test_list``[,
``test_setup_code``]).

Every record's tests are planned for the two-step harness when the file is loaded (see checks.py): a test
that calls the function with computed arguments is a one-line error naming the record, unless
``skip_unsupported`` is set. Records are kept in content-hash order (reordering a file changes nothing).
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodus.core.errors import NodusError

from nodus_env_unit_tests.checks import UnsupportedTests, plan

FORMAT_HINT = (
    "each line must be a HumanEval record (task_id, prompt, canonical_solution, test, entry_point) or an "
    "MBPP record (text, code, test_list)"
)


class DataFileError(NodusError):
    """A problem file that cannot be used; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class ProblemSet:
    records: tuple[dict[str, Any], ...]
    digest: str
    skipped: int


def load_problem_file(path: str, skip_unsupported: bool) -> ProblemSet:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: cannot read the problem file ({error.__class__.__name__}: {error}); "
                            "pass an existing UTF-8 JSONL file with --param data=path.jsonl") from None
    records: dict[str, dict[str, Any]] = {}
    skipped = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_record(f"{path}:{number}", line)
        except UnsupportedTests as error:
            if skip_unsupported:
                skipped += 1
                continue
            raise DataFileError(f"{path}:{number}: {error}; the harness needs every call of the function in "
                                "the tests to have literal arguments (or pass --param skip_unsupported=true)") from None
        records.setdefault(hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest(), record)
    if not records:
        raise DataFileError(f"{path}: the problem file has no usable records; {FORMAT_HINT}")
    digest = hashlib.sha256("".join(sorted(records)).encode()).hexdigest()
    return ProblemSet(tuple(records[key] for key in sorted(records)), digest, skipped)


def parse_record(where: str, line: str) -> dict[str, Any]:
    try:
        raw = json.loads(line)
    except ValueError as error:
        raise DataFileError(f"{where}: not valid JSON ({error}); {FORMAT_HINT}") from None
    if not isinstance(raw, dict):
        raise DataFileError(f"{where}: a JSON {type(raw).__name__}, not an object; {FORMAT_HINT}")
    if all(isinstance(raw.get(key), str) for key in ("prompt", "canonical_solution", "test", "entry_point")):
        return humaneval_record(raw)
    if isinstance(raw.get("text"), str) and isinstance(raw.get("code"), str) and isinstance(raw.get("test_list"), list):
        return mbpp_record(where, raw)
    keys = ", ".join(sorted(map(str, raw))) or "none"
    raise DataFileError(f"{where}: unknown record form (keys: {keys}); {FORMAT_HINT}")


def humaneval_record(raw: dict[str, Any]) -> dict[str, Any]:
    plan(raw["test"], "candidate")  # raises UnsupportedTests
    return {
        "source": "humaneval", "task_id": str(raw.get("task_id", "")), "entry_point": raw["entry_point"],
        "prompt": f"Complete this Python function:\n```python\n{raw['prompt']}```",
        "preamble": raw["prompt"], "reference": raw["canonical_solution"],
        "tests": raw["test"], "call_name": "candidate", "then_call": "check",
    }


def mbpp_record(where: str, raw: dict[str, Any]) -> dict[str, Any]:
    tests = [test for test in raw["test_list"] if isinstance(test, str)]
    if not tests:
        raise DataFileError(f"{where}: the MBPP 'test_list' has no tests; {FORMAT_HINT}")
    try:
        defined = {node.name for node in ast.walk(ast.parse(raw["code"])) if isinstance(node, ast.FunctionDef)}
        called = [node.func.id for test in tests for node in ast.walk(ast.parse(test))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    except SyntaxError as error:
        raise DataFileError(f"{where}: the MBPP code or tests are not valid Python ({error.msg})") from None
    entry = next((name for name in called if name in defined), None)
    if entry is None:
        raise DataFileError(f"{where}: the MBPP tests call no function that 'code' defines; {FORMAT_HINT}")
    test_code = "\n".join([str(raw.get("test_setup_code") or ""), *tests])
    plan(test_code, entry)  # raises UnsupportedTests
    return {
        "source": "mbpp", "task_id": str(raw.get("task_id", "")), "entry_point": entry,
        "prompt": f"{raw['text'].strip()} Your function must pass tests like: {tests[0]}",
        "preamble": "", "reference": raw["code"], "tests": test_code, "call_name": entry,
    }
