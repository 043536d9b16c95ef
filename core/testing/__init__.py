"""The property-testing kit: checks every environment must pass, for authors and for ``grpo check``.

In an environment's tests::

    from nodus.core.testing import assert_conforms

    def test_conformance():
        assert_conforms(MyEnvironment(), examples=8)

Grading in-process is held to the sandbox's rules, so what passes here passes ``grpo check``: each grade runs
within the environment's wall-time limit, and its result must pass the sandbox worker's own check (a Grade with
a finite score in [0, 1], a bool ``passed`` and str ``details``).

Hypothesis strategies live in :mod:`nodus.core.testing.strategies` (imported separately, so this package
works without test dependencies); the pytest plugin in :mod:`nodus.core.testing.pytest_plugin`.
"""

from __future__ import annotations

from nodus.core.environment import Environment
from nodus.core.testing.outcomes import GradeFn
from nodus.core.testing.report import CheckReport, CheckResult
from nodus.core.testing.runner import GRADING_CHECKS, Mutable, run_checks, wall_time_limit

__all__ = [
    "GRADING_CHECKS",
    "CheckReport",
    "CheckResult",
    "GradeFn",
    "Mutable",
    "assert_conforms",
    "run_checks",
    "wall_time_limit",
]


class ConformanceFailure(AssertionError):
    """Raised by :func:`assert_conforms`; the message is the report's table."""


def assert_conforms(env: Environment, examples: int = 8, grade_fn: GradeFn | None = None) -> CheckReport:
    """Run every check and fail (with the whole table) unless all of them pass."""
    report = run_checks(env, examples=examples, grade_fn=grade_fn)
    if not report.passed:
        raise ConformanceFailure("\n" + report.summary())
    return report
