"""nodus plugin providing unit-tests@1."""

from nodus.core import hookimpl

from nodus_env_unit_tests.environment import UnitTests

__all__ = ["UnitTests", "nodus_register_environments"]


@hookimpl
def nodus_register_environments(register):  # type: ignore[no-untyped-def]
    register(UnitTests)
