"""Fixtures for the sandbox tests: real nsjail, no mocks (run as root or with user namespaces)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from nodus.sandbox import GraderPool
from sandbox_helpers import HOST_SECRET_NAME, HOST_SECRET_VALUE, HOSTILE_LIMITS


@pytest.fixture(scope="session")
def isolated_pool() -> Iterator[GraderPool]:
    """One worker, so a job and the probe after it always share the worker (and its /tmp)."""
    os.environ[HOST_SECRET_NAME] = HOST_SECRET_VALUE  # set on the host before the jail starts
    with GraderPool(HOSTILE_LIMITS, workers=1, isolate_each_completion=True) as pool:
        yield pool
