"""What grading one job produced: a score, or an infrastructure failure that must never be a score."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

GRADED: Final = "graded"
INFRASTRUCTURE_FAILURE: Final = "infrastructure_failure"


def summary_line(details: str, limit: int = 300) -> str:
    """Failure details on one line: a traceback's last line (the exception; its head is only the grader's call
    path, and a long traceback is kept by its tail, so its head may be gone), else the first line."""
    lines = [line.strip() for line in details.strip().splitlines() if line.strip()]
    if not lines:
        return "(no details)"
    traceback = lines[0].startswith("Traceback") or any(line.startswith('File "') for line in lines)
    return (lines[-1] if traceback else lines[0])[:limit]


class GradeOutcome(BaseModel):
    """``status == "graded"``: score/passed are set (the completion's doing, incl. timeouts -> 0).

    ``status == "infrastructure_failure"``: score and passed are None; callers must exclude the
    sample from training rather than treat it as 0.  ``reason`` says which (e.g. "wrong",
    "timeout", "memory_limit", "output_limit", "crash", "worker_died", "grader_error").
    """

    model_config = ConfigDict(frozen=True)

    status: Literal["graded", "infrastructure_failure"]
    score: float | None
    passed: bool | None
    details: str
    reason: str
    attempts: int

    @property
    def is_infrastructure_failure(self) -> bool:
        return self.status == INFRASTRUCTURE_FAILURE

    @classmethod
    def from_reply(cls, reply: dict[str, Any], attempts: int) -> GradeOutcome:
        if reply.get("status") == GRADED:
            return cls(
                status=GRADED,
                score=float(reply["score"]),
                passed=bool(reply["passed"]),
                details=str(reply.get("details", "")),
                reason=str(reply.get("reason", "")),
                attempts=attempts,
            )
        return cls.infrastructure(str(reply.get("reason", "unknown")), str(reply.get("details", "")), attempts)

    @classmethod
    def infrastructure(cls, reason: str, details: str, attempts: int) -> GradeOutcome:
        return cls(status=INFRASTRUCTURE_FAILURE, score=None, passed=None, details=details, reason=reason,
                   attempts=attempts)


@dataclass
class PoolStats:
    """Counters since the pool was created.  ``infrastructure_failures`` counts final outcomes;
    ``infrastructure_attempts`` counts every failed attempt, including ones a retry recovered."""

    jobs: int = 0
    graded: int = 0
    infrastructure_failures: int = 0
    infrastructure_attempts: int = 0
    retries: int = 0
    workers_started: int = 0
    workers_replaced: int = 0
    # Jobs sent again uncharged because their worker was lost with several of its batch unanswered.
    requeued_unanswered: int = 0
