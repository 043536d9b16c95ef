"""nodus plugin providing math-answer@1."""

from nodus.core import hookimpl

from nodus_env_math_answer.environment import MathAnswer

__all__ = ["MathAnswer", "nodus_register_environments"]


@hookimpl
def nodus_register_environments(register):  # type: ignore[no-untyped-def]
    register(MathAnswer)
