"""Small grading targets for tests, benchmarks and smoke checks of a deployment.

Not graders of any real environment.  ``score`` is the cheapest possible in-process grader and is
the benchmark's default target.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any


def score(payload: dict[str, Any]) -> dict[str, Any]:
    """Exact-match grader: passes when ``answer == expected``."""
    passed = payload.get("answer") == payload.get("expected")
    return {"score": 1.0 if passed else 0.0, "passed": passed, "details": ""}


def echo(payload: dict[str, Any]) -> Any:
    """Returns ``payload["result"]`` unchanged (to test validation of grader results)."""
    return payload["result"]


def raise_error(payload: dict[str, Any]) -> dict[str, Any]:
    """A grader with a bug: always raises."""
    raise RuntimeError(payload.get("message", "grader bug"))


def interrupted(payload: dict[str, Any]) -> dict[str, Any]:
    """As if Ctrl-C (or SIGTERM, which ``grpo train`` raises the same way) arrived while grading."""
    raise KeyboardInterrupt


def sleep(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(float(payload.get("seconds", 1.0)))
    return {"score": 1.0, "passed": True, "details": "slept"}


def slow_to_prepare(payload: dict[str, Any]) -> dict[str, Any]:
    """A grader whose preparation (an environment's warm_up()) takes ``prepare_seconds``."""
    return {"score": 1.0, "passed": True, "details": "prepared"}


def _sleep_to_prepare(payload: dict[str, Any]) -> None:
    time.sleep(float(payload.get("prepare_seconds", 0.0)))


slow_to_prepare.prepare = _sleep_to_prepare  # type: ignore[attr-defined]  # the worker's hook


def time_left(payload: dict[str, Any]) -> dict[str, Any]:
    """What a grader that nests its own limit reads as its job's time left (the real-time timer), in seconds."""
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    return {"score": min(1.0, left / float(payload["wall_time_s"])), "passed": True, "details": f"{left:.3f}"}


def hash_of(payload: dict[str, Any]) -> dict[str, Any]:
    """Details carry str hashes and set order: equal across runs only with a fixed PYTHONHASHSEED."""
    text = str(payload.get("text", ""))
    order = ",".join(sorted({text, text + "x", text + "y"}, key=hash))
    return {"score": 1.0, "passed": True, "details": f"{hash(text)} {order}"}


def exec_in_process(payload: dict[str, Any]) -> dict[str, Any]:
    """A naive grader that exec()s the completion in its own process and compares ``answer``.

    Only safe with ``isolate_each_completion`` (the job child absorbs whatever the code does).
    """
    namespace: dict[str, Any] = {}
    exec(payload["code"], namespace)
    answer = namespace.get("answer")
    passed = answer == payload.get("expected")
    return {"score": 1.0 if passed else 0.0, "passed": passed, "details": f"answer={str(answer)}"}


def print_fake_reply(payload: dict[str, Any]) -> dict[str, Any]:
    """Writes a well-formed 'passed' reply frame to stdout and stderr, then returns a failing grade."""
    from .protocol import encode_frame

    forged = encode_frame({"status": "graded", "score": 1.0, "passed": True, "reason": "passed", "details": ""})
    for stream in (sys.stdout.buffer, sys.stderr.buffer):
        stream.write(forged)
        stream.flush()
    os.write(1, forged)
    return {"score": 0.0, "passed": False, "details": "honest result"}


def coloring_check(payload: dict[str, Any]) -> dict[str, Any]:
    """A graph-coloring-style check: ``coloring`` must give adjacent nodes different colors and use
    at most ``max_colors``.  Stands in for a real cheap grader in benchmarks (tens of microseconds)."""
    edges = payload["edges"]
    coloring = payload["coloring"]
    conflicts = sum(1 for a, b in edges if coloring[a] == coloring[b])
    passed = conflicts == 0 and len(set(coloring)) <= int(payload["max_colors"])
    return {"score": 1.0 if passed else 0.0, "passed": passed, "details": f"{conflicts} conflicts"}
