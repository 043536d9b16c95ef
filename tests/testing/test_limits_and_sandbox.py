"""The kit's wall-time limit in-process, and the kit fed by the real sandbox (nsjail), as grpo check feeds it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from nodus.core import Environment, Grade, Task
from nodus.core.testing import CheckReport, run_checks
from nodus.core.testing.timelimit import call_with_time_limit
from nodus.sandbox import GraderPool, SandboxLimits

from tests.testing import envs


def failing(report: CheckReport) -> list[str]:
    return [row.name for row in report.failures]


def test_a_hanging_grader_fails_the_time_row_off_the_main_thread_too() -> None:
    # Signals reach only the main thread: elsewhere the grade runs in a thread stopped by an async exception.
    reports: list[CheckReport] = []
    runner = threading.Thread(target=lambda: reports.append(run_checks(envs.HangingParrot(), examples=2)))
    runner.start()
    runner.join(60)
    assert not runner.is_alive() and len(reports) == 1
    row = reports[0].row("grade_within_time_limit")
    assert failing(reports[0]) == ["grade_within_time_limit"]
    assert row.note.startswith("3 of ") and row.note.endswith("not graded: grading stopped after 3 timeouts")
    assert not [thread for thread in threading.enumerate() if thread.name == "nodus-check-grade"]


def test_the_time_limit_leaves_an_outer_timer_running() -> None:
    # pytest-timeout's signal method (or math-answer's parse limit around us) must survive our timer.
    fired: list[int] = []

    def outer(signum: int, _frame: object) -> None:
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, outer)
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        assert call_with_time_limit(lambda: "graded", 5.0) == "graded"
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < left <= 30 and not fired
        assert signal.getsignal(signal.SIGALRM) is outer
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_keyboard_interrupt_in_a_grader_stops_the_run() -> None:
    class Interrupted(envs.Parrot):  # local: the subprocess comparison is skipped, which keeps this fast
        def grade(self, task: Task, completion: str) -> Grade:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_checks(Interrupted(), examples=2)


@pytest.fixture(scope="module")
def pool() -> Iterator[GraderPool]:
    with GraderPool(SandboxLimits(wall_time_s=5), workers=2) as started:
        yield started


def through_sandbox(pool: GraderPool, broken: Callable[[str], dict[str, Any] | None]) -> Any:
    """A grade function like grpo check's: every result comes back from a jailed worker. ``broken(text)`` gives
    the job of a misbehaving grader for some inputs; the others return the Parrot's own grade (echoed)."""

    def grade_fn(env: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, Any]]:
        jobs = [
            broken(text)
            or {"target": "nodus.sandbox.demo_targets:echo", "payload": {"result": env.grade(task, text).model_dump()}}
            for task, text in pairs
        ]
        return [outcome.model_dump() for outcome in pool.run_many(jobs)]

    return grade_fn


def raise_on_nul(text: str) -> dict[str, Any] | None:
    if text != "\x00" * 64:
        return None
    return {"target": "nodus.sandbox.demo_targets:raise_error", "payload": {"message": "cannot handle NUL"}}


def negative_on_blank(text: str) -> dict[str, Any] | None:
    if text.strip() or not text:
        return None
    result = {"score": -1.0, "passed": False, "details": "blank"}
    return {"target": "nodus.sandbox.demo_targets:echo", "payload": {"result": result}}


@pytest.mark.parametrize(
    ("broken", "counterexample"),
    [
        (raise_on_nul, "task train-42-0, nul_bytes '" + "\\x00" * 60 + "'... (64 chars): "
         "raised RuntimeError: cannot handle NUL"),
        (negative_on_blank, "task train-42-0, whitespace ' \\n\\t\\r\\n ': "
         "invalid grader result: grader returned score=-1.0, outside [0, 1]"),
    ],
    ids=["raises", "invalid_score"],
)
def test_a_grader_error_in_the_sandbox_fails_the_range_row_naming_the_probe(
    pool: GraderPool, broken: Callable[[str], dict[str, Any] | None], counterexample: str
) -> None:
    # The sandbox reports these as infrastructure failures (reason grader_error); they used to pass the row.
    report = run_checks(envs.Parrot(), examples=2, grade_fn=through_sandbox(pool, broken))
    assert failing(report) == ["grade_in_range_never_raises"]
    assert report.row("grade_in_range_never_raises").counterexample == counterexample
