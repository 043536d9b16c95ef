"""What grading one job produced: a score, or an infrastructure failure that must never be a score."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

GRADED: Final = "graded"
INFRASTRUCTURE_FAILURE: Final = "infrastructure_failure"


def summary_line(details: str, limit: int = 300) -> str:
    """Failure details on one line: a traceback's exception (its head is only the grader's call path, and a long
    traceback is kept by its tail, so its head may be gone), else the first line."""
    raw = [line.rstrip() for line in details.strip("\n").splitlines() if line.strip()]
    if not raw:
        return "(no details)"
    frames = [i for i, line in enumerate(raw) if line.lstrip().startswith('File "')]
    if not frames:
        return raw[-1 if raw[0].startswith("Traceback") else 0].strip()[:limit]
    start = frames[-1] + 1
    while start < len(raw) - 1 and raw[start].startswith("    "):  # the frame's source line and its ^^^ markers
        start += 1
    # A multi-line exception (pydantic's ValidationError: the model, the field, the rule, the input) is kept whole,
    # less pydantic's link to its docs, which had been all the line said.
    message = [line.strip() for line in raw[start:] if not line.strip().startswith("For further information visit")]
    return _SHORT_CLASS.sub(r"\1", " ".join(message))[:limit]


# "pydantic_core._pydantic_core.ValidationError: ..." -> "ValidationError: ..."
_SHORT_CLASS = re.compile(r"^(?:[A-Za-z_][\w]*\.)+([A-Za-z_]\w*:)")


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
