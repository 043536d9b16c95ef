"""nodus.core: the environment contract, the plugin registry and the ``grpo`` command line."""

from nodus.core.environment import (
    DEFAULT_HELD_OUT_TASKS,
    DEFAULT_TRAIN_TASKS,
    Environment,
    Grade,
    Split,
    Task,
)
from nodus.core.errors import NodusError
from nodus.core.hookspecs import hookimpl
from nodus.core.ids import EnvId, format_env_id, parse_env_id
from nodus.core.registry import Registry, get_registry, load_environment

__all__ = [
    "DEFAULT_HELD_OUT_TASKS",
    "DEFAULT_TRAIN_TASKS",
    "EnvId",
    "Environment",
    "Grade",
    "NodusError",
    "Registry",
    "Split",
    "Task",
    "format_env_id",
    "get_registry",
    "hookimpl",
    "load_environment",
    "parse_env_id",
]
