"""The conformance report: one row per check, printable as a table and serialisable as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckResult:
    """One check: whether it held, on how many examples, and the first example where it did not."""

    name: str
    passed: bool
    examples: int
    counterexample: str | None = None
    note: str = ""


@dataclass(frozen=True)
class CheckReport:
    env: str
    rows: tuple[CheckResult, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def failures(self) -> list[CheckResult]:
        return [row for row in self.rows if not row.passed]

    def row(self, name: str) -> CheckResult:
        for candidate in self.rows:
            if candidate.name == name:
                return candidate
        raise KeyError(f"no check named {name!r}; checks: {', '.join(r.name for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        return {"env": self.env, "passed": self.passed, "rows": [asdict(row) for row in self.rows]}

    def summary(self) -> str:
        """A plain-text table (the CLI may render its own from ``rows``)."""
        width = max((len(row.name) for row in self.rows), default=5)
        lines = [f"conformance of {self.env}: {'PASS' if self.passed else 'FAIL'}"]
        for row in self.rows:
            status = "ok  " if row.passed else "FAIL"
            line = f"  {status} {row.name:<{width}}  {row.examples:>5} examples"
            if row.counterexample:
                line += f"  first counterexample: {row.counterexample}"
            if row.note:
                line += f"  ({row.note})"
            lines.append(line)
        return "\n".join(lines)
