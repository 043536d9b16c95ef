"""Resource limits applied to every grading job, per environment.

An environment declares overrides in ``sandbox_limits`` (a plain dict); the user may override them
again.  Bounds are deliberately wide enough for real graders and tight enough that a typo (a limit
of 0, or 10**6 seconds) is rejected with a message naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SandboxLimits(BaseModel):
    """Per-job limits. Memory and CPU apply to each completion; output caps what the host reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_time_s: float = Field(default=10.0, gt=0, le=600, description="Wall-clock seconds for one job.")
    cpu_time_s: float = Field(default=10.0, gt=0, le=600, description="CPU seconds for one completion process.")
    memory_mb: int = Field(default=512, ge=64, le=65536, description="Address space for one completion, MiB.")
    max_processes: int = Field(default=32, ge=1, le=4096, description="Processes/threads a job may have at once.")
    max_file_size_mb: int = Field(default=16, ge=1, le=4096, description="Largest file a job may write, MiB.")
    max_output_bytes: int = Field(
        default=1_000_000, ge=1024, le=256 * 1024 * 1024, description="stdout+stderr bytes read from a program."
    )
    tmpfs_mb: int = Field(default=64, ge=1, le=16384, description="Size of the private /tmp of each worker, MiB.")
    max_open_files: int = Field(default=256, ge=16, le=65536, description="RLIMIT_NOFILE of the jailed processes.")
    max_details_chars: int = Field(default=4000, ge=0, le=1_000_000, description="Grader details are cut to this.")

    @model_validator(mode="after")
    def _cpu_within_wall(self) -> SandboxLimits:
        # A CPU budget larger than the wall budget can never be used; it is almost always a typo.
        if self.cpu_time_s > self.wall_time_s * 64:
            raise ValueError("cpu_time_s must not exceed 64 x wall_time_s")
        if self.max_file_size_mb > self.tmpfs_mb * 64:
            raise ValueError("max_file_size_mb must not exceed 64 x tmpfs_mb")
        return self

    @classmethod
    def for_environment(
        cls, env_overrides: Mapping[str, Any] | None = None, user_overrides: Mapping[str, Any] | None = None
    ) -> SandboxLimits:
        """Defaults, then the environment's ``sandbox_limits``, then the user's overrides."""
        merged: dict[str, Any] = {**(env_overrides or {}), **(user_overrides or {})}
        try:
            return cls(**merged)
        except ValidationError as exc:
            raise ValueError(f"invalid sandbox limits {merged}: {_first_errors(exc)}") from exc


def _first_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err["loc"]) or "limits"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
