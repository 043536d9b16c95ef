"""The sandbox's wall-time limit, enforced on an in-process grade, so a hanging grader fails a row, not the run.

On the main thread (pytest, ``grpo check --sandbox none`` aside) a SIGALRM timer interrupts the grader, as the
sandbox worker's own timer does: a grader that nests its own timer (math-answer's parse limit) meets the same
outer timer it meets in the sandbox. Signals reach only the main thread, so elsewhere the grade runs in a daemon
thread that is interrupted by an asynchronous exception, and abandoned if it is stuck in C code.
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from collections.abc import Callable

# How long a thread interrupted at its limit may take to unwind before it is abandoned.
STOP_GRACE_S = 1.0


class GradeTimeout(BaseException):
    """Raised inside a grader at its limit; a BaseException so its ``except Exception`` does not swallow it."""


def call_with_time_limit[T](function: Callable[[], T], seconds: float) -> T:
    """``function()``, or GradeTimeout once it has run ``seconds`` of wall time."""
    if threading.current_thread() is threading.main_thread():
        return _with_alarm(function, seconds)
    return _in_thread(function, seconds)


def _on_alarm(_signum: int, _frame: object) -> None:
    raise GradeTimeout()


def _with_alarm[T](function: Callable[[], T], seconds: float) -> T:
    # Keep an outer timer (pytest-timeout's signal method, say): ours never outlives it, and what is left of it
    # is set again afterwards (at once if it expired meanwhile), as math-answer's nested timer does.
    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left else seconds)
    try:
        return function()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - started), 1e-6), outer_interval)


def _in_thread[T](function: Callable[[], T], seconds: float) -> T:
    box: dict[str, T] = {}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            box["value"] = function()
        except BaseException as error:  # noqa: BLE001 - handed to the caller, which reports it
            failure.append(error)

    thread = threading.Thread(target=run, daemon=True, name="nodus-check-grade")
    thread.start()
    thread.join(seconds)
    if thread.is_alive() and thread.ident is not None:
        # Raised in the thread at its next bytecode: stops a pure-Python loop; one in C code is left behind.
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(GradeTimeout))
        thread.join(STOP_GRACE_S)
        raise GradeTimeout()
    if failure:
        raise failure[0]
    return box["value"]
