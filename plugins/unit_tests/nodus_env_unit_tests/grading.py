"""Step 2 of grading (see checks.py): run the task's tests in the grader on the recorded results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodus_env_unit_tests.checks import FAILED, RECORD, RESULT, Plan
from nodus_env_unit_tests.harness import CallResult
from nodus_env_unit_tests.values import same


class CallRaised(Exception):
    """Replays an exception the completion's function raised for one call."""


@dataclass(frozen=True)
class Verdict:
    passed: int
    failed: int
    problem: str  # the first failure, '' if none

    @property
    def total(self) -> int:
        return self.passed + self.failed


def run_tests(plan: Plan, results: list[CallResult], then_call: str | None) -> Verdict:
    outcomes: list[bool] = []

    def result(index: int) -> Any:
        call = results[index]
        if call.error is not None:
            raise CallRaised(f"{call.error} for arguments {plan.calls[index][:80]}")
        return call.value

    def record(ok: bool, counts: bool) -> None:
        if counts or not ok:  # an assertion that involves no result earns nothing, but can fail (checks.py)
            outcomes.append(ok)

    errors: list[str] = []

    def failed(error: Exception) -> bool:
        errors.append(f"{type(error).__name__}: {str(error)[:120]}")
        return False

    namespace: dict[str, Any] = {
        RESULT: result,
        RECORD: record,
        FAILED: failed,
        "same": same,
        "__name__": "__nodus_tests__",
    }
    problem = ""
    try:
        exec(compile(plan.code, "<tests>", "exec"), namespace)
        if then_call:
            namespace[then_call](None)
    except Exception as error:  # a test that errors outside an assert stops the tests: one more failure
        outcomes.append(False)
        problem = f"the tests stopped: {type(error).__name__}: {str(error)[:120]}"
    passed = sum(outcomes)
    if not problem and passed < len(outcomes):
        problem = f"assertion {outcomes.index(False) + 1} of {len(outcomes)} failed"
        if errors:
            problem += f" ({errors[0]})"
    return Verdict(passed, len(outcomes) - passed, problem)
