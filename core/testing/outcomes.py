"""Grading a batch of completions, in-process or through a caller's grade function, into uniform outcomes.

A caller's function (the CLI's sandbox pool) returns "Grade-like" values: a :class:`Grade`, or the sandbox's
result dict (``{"status": "graded", "score", "passed", "details", "reason"}`` or
``{"status": "infrastructure_failure", ...}``). Both become an :class:`Outcome`. Every result, in-process or
not, is held to the sandbox worker's own check (``validate_grader_result``), so what passes here passes there.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nodus.core.environment import Environment, Grade, Task
from nodus.core.testing.timelimit import GradeTimeout, call_with_time_limit
from nodus.sandbox.outcome import summary_line
from nodus.sandbox.protocol import InvalidGraderResult, validate_grader_result
from nodus.sandbox.worker import PREPARE_LIMIT_S, PREPARE_TOO_SLOW
from pydantic import ValidationError

GradeFn = Callable[[Environment, list[tuple[Task, str]]], Sequence[Any]]

# Infrastructure reasons of the sandbox (nodus.sandbox.worker and pool) that are the grader's doing, not the
# machine's. "grader_error": the grader raised (sys.exit and MemoryError included) or returned an invalid
# result. A worker the pool gave up on after MAX_ATTEMPTS, each a fresh worker running this very job (the pool
# charges an attempt only to the job that was running), was brought down by the job: with a memory cgroup this
# is how a grader over its memory_mb is killed (without one it gets a MemoryError, a grader_error), and how a
# grader that crashes the interpreter ends. "worker_timeout": it hung where the sandbox's alarm cannot reach
# (C code), so it is a timeout. Every other reason (sandbox_start_failed, pool_error, pool_closed, lost...) is
# the machine's and is excused, as it is in training: never a score, never a grader's failure.
GRADER_FAULTS = frozenset({"grader_error"})
WORKER_KILLED = frozenset({"worker_died", "garbled_reply"})
WORKER_HUNG = frozenset({"worker_timeout"})


@dataclass(frozen=True)
class Outcome:
    score: float | None
    passed: bool | None
    details: str
    error: str | None = None  # the grader raised, exited or returned something that is not a valid grade
    infrastructure: bool = False  # the machine failed, not the grader: excused, but never a pass
    timed_out: bool = False
    seconds: float | None = None
    reason: str = ""  # the sandbox's reason for an infrastructure failure
    killed_worker: bool = False  # brought down a fresh sandbox worker on every attempt

    @property
    def verdict(self) -> tuple[float | None, bool | None, str, str | None, bool]:
        """What must be identical when the same completion is graded twice."""
        return (self.score, self.passed, self.details, self.error, self.infrastructure)


def error_text(error: BaseException) -> str:
    """``KeyError: 'x'`` on one line, as a traceback's last line reads."""
    if isinstance(error, ValidationError) and error.errors():
        # Its first line is only "1 validation error for Grade": say which field broke which rule, with what.
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        got = summary_line(repr(first.get("input")), 60)
        return f"ValidationError: {error.title}: {field + ': ' if field else ''}{first['msg']} (got {got}){more}"
    message = summary_line(str(error), 200) if str(error).strip() else ""
    return type(error).__name__ + (f": {message}" if message else "")


def outcome_of(value: Any, seconds: float | None) -> Outcome:
    """The outcome of a Grade or a sandbox result dict, checked as the sandbox worker checks a result."""
    if isinstance(value, dict) and value.get("status") == "infrastructure_failure":
        return _infrastructure_outcome(value, seconds)
    try:
        result = value.model_dump(warnings=False) if isinstance(value, Grade) else value
        checked = validate_grader_result(result, sys.maxsize)
    except InvalidGraderResult as problem:
        return Outcome(None, None, "", error=f"invalid grader result: {problem}", seconds=seconds)
    except Exception as problem:  # a Grade built with model_construct may not even dump
        return Outcome(None, None, "", error=f"invalid grader result: {type(problem).__name__}", seconds=seconds)
    timed_out = isinstance(value, dict) and value.get("reason") == "timeout"
    return Outcome(checked["score"], checked["passed"], checked["details"], timed_out=timed_out, seconds=seconds)


def _infrastructure_outcome(value: dict[str, Any], seconds: float | None) -> Outcome:
    reason = str(value.get("reason", ""))
    details = str(value.get("details", ""))
    if reason in GRADER_FAULTS:
        message = summary_line(details, 200)
        error = message if message.startswith("invalid grader result") else f"raised {message}"
        return Outcome(None, None, "", error=error, seconds=seconds)
    attempts = value.get("attempts")
    tries = f" on each of {attempts} attempts" if isinstance(attempts, int) and attempts > 1 else ""
    if reason in WORKER_KILLED:
        cause = summary_line(details, 200)
        error = f"killed its sandbox worker{tries} (over memory_mb, or crashed the interpreter): {cause}"
        return Outcome(None, None, "", error=error, seconds=seconds, killed_worker=True)
    if reason in WORKER_HUNG:
        return Outcome(0.0, False, f"hung its sandbox worker{tries}", timed_out=True, seconds=seconds)
    summary = summary_line(details, 200)
    return Outcome(None, None, summary, infrastructure=True, seconds=seconds, reason=reason or "unknown")


_warmed: weakref.WeakSet[Environment] = weakref.WeakSet()
_warm_up_failed: weakref.WeakKeyDictionary[Environment, str] = weakref.WeakKeyDictionary()


def grade_in_process(env: Environment, task: Task, completion: str, limit: float) -> Outcome:
    """Grade as the sandbox does: within ``limit`` seconds, and the result checked as the worker checks it."""
    if env not in _warmed:  # as the sandbox worker does: loading the grader is not the completion's time
        if env in _warm_up_failed:
            return Outcome(None, None, "", error=_warm_up_failed[env], seconds=0.0)
        try:  # bounded as the worker bounds it, so a warm_up too slow for the sandbox fails here too
            call_with_time_limit(env.warm_up, PREPARE_LIMIT_S)
        except GradeTimeout:
            _warm_up_failed[env] = PREPARE_TOO_SLOW
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - reported, as the sandbox reports it
            _warm_up_failed[env] = f"warm_up() raised {error_text(error)}"
        if env in _warm_up_failed:  # said once per environment, not waited out again for every completion
            return Outcome(None, None, "", error=_warm_up_failed[env], seconds=0.0)
        _warmed.add(env)
    started = time.perf_counter()
    try:
        grade = call_with_time_limit(lambda: env.grade(task, completion), limit)
    except GradeTimeout:
        seconds = time.perf_counter() - started
        return Outcome(0.0, False, f"grading exceeded {limit:g}s wall time", timed_out=True, seconds=seconds)
    except KeyboardInterrupt:
        raise  # the author stopping the run, not the grader failing
    except BaseException as error:  # noqa: BLE001 - sys.exit too: the check exists to report this, never propagate it
        return Outcome(None, None, "", error=f"raised {error_text(error)}", seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if not isinstance(grade, Grade):  # the sandbox calls .model_dump() on it and fails
        return Outcome(None, None, "", error=f"returned {type(grade).__name__}, not a Grade", seconds=seconds)
    return outcome_of(grade, seconds)


def grade_batch(
    env: Environment, pairs: list[tuple[Task, str]], grade_fn: GradeFn | None, limit: float
) -> list[Outcome]:
    """Grade every pair. A caller's function that raises fails every pair of the batch (with the reason)."""
    if grade_fn is None:
        return [grade_in_process(env, task, completion, limit) for task, completion in pairs]
    if not pairs:
        return []
    started = time.perf_counter()
    try:
        values = list(grade_fn(env, pairs))
    except Exception as error:
        failure = Outcome(None, None, "", error=f"grade_fn raised {error_text(error)}")
        return [failure] * len(pairs)
    if len(values) != len(pairs):
        failure = Outcome(None, None, "", error=f"grade_fn returned {len(values)} results for {len(pairs)} pairs")
        return [failure] * len(pairs)
    # A batch may be graded in parallel: its per-completion time is unknown, so bound it by the average.
    average = (time.perf_counter() - started) / len(pairs)
    return [outcome_of(value, average) for value in values]
