"""Exceptions of nodus.sandbox."""

from __future__ import annotations


class SandboxUnavailable(RuntimeError):
    """nsjail cannot run here. ``str()`` is one line: the cause, then the fix."""

    def __init__(self, cause: str, fix: str) -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(f"nodus sandbox unavailable: {cause}. Fix: {fix}")


class UnsandboxedGradingWarning(UserWarning):
    """Emitted on every run of a pool in sandbox="none" mode."""
