from __future__ import annotations

import pytest
from nodus.sandbox import SandboxLimits
from pydantic import ValidationError


def test_defaults_are_sane() -> None:
    limits = SandboxLimits()
    assert limits.wall_time_s == 10.0
    assert limits.memory_mb == 512
    assert limits.max_output_bytes == 1_000_000


def test_environment_then_user_overrides() -> None:
    limits = SandboxLimits.for_environment({"wall_time_s": 5, "memory_mb": 256}, {"memory_mb": 1024})
    assert (limits.wall_time_s, limits.memory_mb) == (5.0, 1024)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"memory_mb": 1},
            "invalid sandbox limits {'memory_mb': 1}: memory_mb: Input should be greater than or equal to 64",
        ),
        ({"wall_time_s": 0}, "invalid sandbox limits {'wall_time_s': 0}: wall_time_s: Input should be greater than 0"),
        ({"wall_time_s": 10_000}, "wall_time_s: Input should be less than or equal to 600"),
        ({"max_processes": 0}, "max_processes: Input should be greater than or equal to 1"),
        ({"max_output_bytes": 10}, "max_output_bytes: Input should be greater than or equal to 1024"),
        ({"memory_gb": 2}, "memory_gb: Extra inputs are not permitted"),
        ({"wall_time_s": 1, "cpu_time_s": 100}, "Value error, cpu_time_s must not exceed 64 x wall_time_s"),
        ({"tmpfs_mb": 1, "max_file_size_mb": 100}, "Value error, max_file_size_mb must not exceed 64 x tmpfs_mb"),
    ],
)
def test_invalid_limits_name_the_field(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        SandboxLimits.for_environment(overrides)
    assert message in str(excinfo.value)


def test_limits_are_immutable() -> None:
    with pytest.raises(ValidationError):
        SandboxLimits().wall_time_s = 3  # type: ignore[misc]
