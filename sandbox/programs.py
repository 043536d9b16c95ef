"""Grading targets that run a completion as a Python program, the way code environments do.

``nodus.sandbox.programs:run_python`` with payload
``{"code": str, "stdin": str = "", "expected_stdout": str | None, "tests": str | None}``:
the completion runs as its own process (see spawner.py), fed ``stdin``.  It passes when it exits 0,
its stdout matches ``expected_stdout`` (if given; trailing whitespace per line ignored), and, if
``tests`` is given, the tests -- run after the code, in the same namespace -- reach their end.

"Reached the end" is proven by a random marker printed after the tests, not by the exit status:
a completion that calls ``os._exit(0)`` or ``sys.exit(0)`` before the tests run gets 0, not a pass.
(A completion determined to find the marker in its own process memory could forge it; the tests
run in the completion's process by design, like ``python solution.py && python tests.py`` would.)
"""

from __future__ import annotations

import secrets
from typing import Any

from .spawner import ProgramResult, run_program


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _summary(result: ProgramResult, reason: str) -> str:
    status = f"signal {result.signal}" if result.signal is not None else f"exit {result.exit_code}"
    return f"{reason}: {status}, {result.wall_s:.2f}s; stderr tail: {result.stderr[-600:]!r}"


def run_python(payload: dict[str, Any]) -> dict[str, Any]:
    code = payload["code"]
    if not isinstance(code, str):
        raise TypeError("payload['code'] must be a str")
    stdin = str(payload.get("stdin", ""))
    expected = payload.get("expected_stdout")
    tests = payload.get("tests")
    marker = epilogue = None
    if tests is not None:
        marker = f"nodus-checks-completed-{secrets.token_hex(16)}"
        epilogue = f"{tests}\nimport sys as _nodus_sys\n_nodus_sys.stdout.write('\\n{marker}\\n')\n"
    result = run_program(code, stdin=stdin, epilogue=epilogue)
    reason = result.failure_reason
    if reason is not None:
        return {"score": 0.0, "passed": False, "reason": reason, "details": _summary(result, reason)}
    stdout = result.stdout
    if marker is not None:
        lines = stdout.rstrip("\n").split("\n")
        if lines[-1] != marker:
            return {"score": 0.0, "passed": False, "reason": "exited_early",
                    "details": "the program exited before its checks ran to the end"}
        stdout = "\n".join(lines[:-1])
    if expected is not None and _normalise(stdout) != _normalise(str(expected)):
        return {"score": 0.0, "passed": False, "reason": "wrong",
                "details": f"expected {str(expected)[:200]!r}, got {stdout[:200]!r}"}
    return {"score": 1.0, "passed": True, "reason": "passed", "details": f"ok in {result.wall_s:.3f}s"}
