"""Grading a batch of completions, in-process or through a caller's grade function, into uniform outcomes.

A caller's function (the CLI's sandbox pool) returns "Grade-like" values: a :class:`Grade`, or the sandbox's
result dict (``{"status": "graded", "score", "passed", "details", "reason"}`` or
``{"status": "infrastructure_failure", ...}``). Both become an :class:`Outcome`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nodus.core.environment import Environment, Grade, Task

GradeFn = Callable[[Environment, list[tuple[Task, str]]], Sequence[Any]]


@dataclass(frozen=True)
class Outcome:
    score: float | None
    passed: bool | None
    details: str
    error: str | None = None  # the grader raised or returned something that is not a grade
    infrastructure: bool = False  # an explicit infrastructure failure (allowed, but never a pass)
    timed_out: bool = False
    seconds: float | None = None

    @property
    def verdict(self) -> tuple[float | None, bool | None, str, str | None, bool]:
        """What must be identical when the same completion is graded twice."""
        return (self.score, self.passed, self.details, self.error, self.infrastructure)


def outcome_of(value: Any, seconds: float | None) -> Outcome:
    if isinstance(value, Grade):
        return Outcome(value.score, value.passed, value.details, seconds=seconds)
    if isinstance(value, dict):
        if value.get("status") == "infrastructure_failure":
            return Outcome(None, None, str(value.get("details", ""))[-300:], infrastructure=True, seconds=seconds)
        fields = (value.get("score"), value.get("passed"), value.get("details"))
        timed_out = value.get("reason") == "timeout"
    else:
        fields = (getattr(value, "score", None), getattr(value, "passed", None), getattr(value, "details", None))
        timed_out = False
    score, passed, details = fields
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        return Outcome(None, None, "", error=f"returned score {score!r}, not a finite number", seconds=seconds)
    if not isinstance(passed, bool) or not isinstance(details, str):
        return Outcome(None, None, "", error=f"returned {type(value).__name__} {str(value)[:80]!r}", seconds=seconds)
    if not 0.0 <= score <= 1.0:
        return Outcome(float(score), passed, details, error=f"score {score} outside [0, 1]", seconds=seconds)
    return Outcome(float(score), passed, details, timed_out=timed_out, seconds=seconds)


def grade_in_process(env: Environment, task: Task, completion: str) -> Outcome:
    started = time.perf_counter()
    try:
        grade = env.grade(task, completion)
    except Exception as error:  # the check exists to find this: report it, never propagate it
        return Outcome(
            None,
            None,
            "",
            error=f"raised {type(error).__name__}: {str(error)[:200]}",
            seconds=time.perf_counter() - started,
        )
    return outcome_of(grade, time.perf_counter() - started)


def grade_batch(env: Environment, pairs: list[tuple[Task, str]], grade_fn: GradeFn | None) -> list[Outcome]:
    """Grade every pair. A caller's function that raises fails every pair of the batch (with the reason)."""
    if grade_fn is None:
        return [grade_in_process(env, task, completion) for task, completion in pairs]
    if not pairs:
        return []
    started = time.perf_counter()
    try:
        values = list(grade_fn(env, pairs))
    except Exception as error:
        failure = Outcome(None, None, "", error=f"grade_fn raised {type(error).__name__}: {str(error)[:200]}")
        return [failure] * len(pairs)
    if len(values) != len(pairs):
        failure = Outcome(None, None, "", error=f"grade_fn returned {len(values)} results for {len(pairs)} pairs")
        return [failure] * len(pairs)
    # A batch may be graded in parallel: its per-completion time is unknown, so bound it by the average.
    average = (time.perf_counter() - started) / len(pairs)
    return [outcome_of(value, average) for value in values]
