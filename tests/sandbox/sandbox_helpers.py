"""Shared constants for the sandbox tests (imported by conftest and the test modules)."""

from __future__ import annotations

from nodus.sandbox import SandboxLimits

HOST_SECRET_NAME = "NODUS_TEST_HOST_SECRET"
HOST_SECRET_VALUE = "hunter2-must-not-leak"
RUN_PYTHON = "nodus.sandbox.programs:run_python"

# Small limits keep the hostile suite fast: timeouts cost wall_time_s each.
HOSTILE_LIMITS = SandboxLimits(
    wall_time_s=2.0, cpu_time_s=1.0, memory_mb=256, max_processes=16, max_file_size_mb=4,
    max_output_bytes=100_000, tmpfs_mb=8, max_details_chars=2000,
)


def python_job(code: str, **payload: object) -> dict[str, object]:
    return {"target": RUN_PYTHON, "payload": {"code": code, **payload}}
