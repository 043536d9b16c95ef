"""pytest plugin of the kit: the ``check_environment`` fixture.

Enabled by the ``pytest11`` entry point of nodus (or ``-p nodus.core.testing.pytest_plugin``)::

    def test_conformance(check_environment):
        check_environment(MyEnvironment(), examples=8)
"""

from __future__ import annotations

from typing import Protocol

import pytest
from nodus.core.environment import Environment
from nodus.core.testing import CheckReport, GradeFn, assert_conforms


class CheckEnvironment(Protocol):
    def __call__(self, env: Environment, examples: int = 8, grade_fn: GradeFn | None = None) -> CheckReport: ...


@pytest.fixture
def check_environment() -> CheckEnvironment:
    """Run the conformance checks on an environment; fails the test with the report's table."""
    return assert_conforms
