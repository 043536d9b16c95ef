"""Errors a user can cause and fix. The CLI prints them as one line and exits 2, never a traceback."""

from __future__ import annotations


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an error's message, at most `limit` characters: what failed, for a one-line report."""
    return (str(error).strip().splitlines() or [""])[0][:limit]


class NodusError(Exception):
    """A mistake in what the user asked for. ``str(error)`` is one line: what was wrong and the fix."""


class InvalidEnvironmentId(NodusError):
    """An environment id that does not follow ``[namespace/]name[@version]``."""


class UnknownEnvironment(NodusError):
    """No installed environment has this name."""


class UnknownVersion(NodusError):
    """The environment is installed, but not in this version."""


class DuplicateEnvironment(NodusError):
    """Two plugins registered the same environment id."""


class PluginLoadError(NodusError):
    """An installed plugin failed to import or to register its environments."""


class InvalidParameters(NodusError):
    """Environment parameters that fail validation."""


class TaskGenerationError(NodusError):
    """The environment cannot produce the tasks asked for with these parameters."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, docker stop, a batch scheduler), raised where Ctrl-C would be so that a run stops the same
    way and records it; the command then exits 143 (128 + SIGTERM), as a process ended by the signal would."""
