"""Step 1 of grading (see checks.py): run the completion and record what its function returns.

The completion is the program; the harness runs after it in the same process (the sandbox's epilogue)
and reads its instructions from stdin: the function's name and the argument tuples, never the expected
values. Results come back as one line of tagged JSON after a random nonce. Nothing the completion prints
can pass for a result, except by knowing the nonce and computing right answers, which is solving the task.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from nodus_env_unit_tests.values import ENCODER_SOURCE, decode

HARNESS = (
    ENCODER_SOURCE
    + """
def _nodus_harness():
    import ast as _ast, json as _json, sys as _sys
    request = _json.loads(_sys.stdin.readline())
    function = globals().get(request["entry"])
    results = []
    for source in request["calls"]:
        try:
            results.append({"ok": _nodus_encode(function(*_ast.literal_eval(source)))})
        except BaseException as error:  # SystemExit from inside the function is a failed call, too
            results.append({"error": type(error).__name__})
    _sys.stdout.write("\\n" + request["nonce"] + _json.dumps(results) + "\\n")
    _sys.stdout.flush()


_nodus_harness()
"""
)


class NoResults(ValueError):
    pass


@dataclass(frozen=True)
class CallResult:
    value: Any = None
    error: str | None = None  # the exception the call raised


def request(entry: str, calls: list[str]) -> tuple[str, str]:
    """(stdin for the harness, the nonce its result line starts with)."""
    nonce = f"nodus-results-{secrets.token_hex(16)}:"
    return json.dumps({"entry": entry, "calls": calls, "nonce": nonce}) + "\n", nonce


def parse_results(stdout: str, nonce: str, expected_count: int) -> list[CallResult]:
    lines = [line for line in stdout.splitlines() if line.startswith(nonce)]
    if not lines:
        raise NoResults("the program stopped before the tests could call its function")
    try:
        raw = json.loads(lines[-1][len(nonce) :])
        results = [
            CallResult(value=decode(item["ok"])) if "ok" in item else CallResult(error=str(item["error"]))
            for item in raw
        ]
    # The line is the completion's to write (it can read the nonce), so whatever fails in decoding it, deep
    # nesting included, is a malformed result and scores 0; it must never crash the grader.
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as error:
        raise NoResults(f"the results are malformed ({type(error).__name__})") from None
    if len(results) != expected_count:
        raise NoResults(f"{len(results)} results for {expected_count} calls")
    return results
