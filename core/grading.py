"""Grading completions: the job the sandbox worker runs, and the host-side grader that sends it there.

The host never calls ``env.grade`` itself (unless the user chose ``sandbox="none"``): it sends a JSON job to a
pool of nsjail workers, and each worker calls :func:`grade_job` on its side of the jail.
"""

from __future__ import annotations

import inspect
import json
import sys
import weakref
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from nodus.core.environment import Environment, Grade, Task
from nodus.core.errors import NodusError
from nodus.core.registry import get_registry, load_environment
from nodus.sandbox import GradeOutcome, GraderPool, PoolStats, SandboxLimits
from nodus.sandbox.jail import python_mounts

GRADE_TARGET = "nodus.core.grading:grade_job"
SandboxMode = Literal["nsjail", "none"]


def grade_payload(env: Environment, task: Task, completion: str) -> dict[str, Any]:
    """The JSON a sandbox worker needs to grade ``completion``: everything by value, nothing by reference."""
    return {
        "env": env.id_text(),
        "params": env.params.model_dump(mode="json"),
        "task": task.model_dump(mode="json"),
        "completion": completion,
    }


# Environments graded in this process (sandbox "none") by object, so one built in Python (a function
# environment) needs no plugin. Sandbox workers never have entries here: they load plugins.
_IN_PROCESS: dict[tuple[str, str], Environment] = {}


def _params_key(params: Any) -> str:
    return json.dumps(params, sort_keys=True)


def _environment(env_id: str, params_json: str) -> Environment:
    # An in-process environment is looked up each time, never cached: a second function environment under the same
    # id (train_on_function twice in a notebook) replaces the first, and a cache would have kept grading the first.
    return _IN_PROCESS.get((env_id, params_json)) or _plugin_environment(env_id, params_json)


@lru_cache(maxsize=32)
def _plugin_environment(env_id: str, params_json: str) -> Environment:
    # A worker grades many jobs of the same environment: resolve the plugin and validate parameters once.
    return load_environment(env_id, json.loads(params_json))


def grade_job(payload: dict[str, Any]) -> dict[str, Any]:
    """Sandbox target: grade one completion. Raising here is a grader failure, never a score of 0."""
    env = _environment(payload["env"], _params_key(payload["params"]))
    task = env.task_from_dict(payload["task"])
    grade = env.grade(task, payload["completion"])
    if not isinstance(grade, Grade):  # said as the conformance kit says it, not as an AttributeError of model_dump
        raise TypeError(
            f"{type(env).__name__}.grade returned {type(grade).__name__}, not a Grade: return "
            "nodus.core.Grade(score=..., passed=..., details=...)"
        )
    result: dict[str, Any] = grade.model_dump()
    return result


_warmed: weakref.WeakSet[Environment] = weakref.WeakSet()


def prepare_job(payload: dict[str, Any]) -> None:
    """Run by the sandbox worker before a job's time limit starts (see ``Environment.warm_up``): loads the
    environment (plugin discovery, parameter validation) and warms it up, once per environment object."""
    env = _environment(payload["env"], _params_key(payload["params"]))
    if env not in _warmed:
        env.warm_up()
        _warmed.add(env)


grade_job.prepare = prepare_job  # type: ignore[attr-defined]  # the worker's hook, see sandbox/worker.py


def sandbox_limits(env: Environment, limits: Mapping[str, Any] | None) -> SandboxLimits:
    """The environment's sandbox limits with the user's overrides; an invalid override is one line naming the
    limits there are (checked by the dry run too, so a typo fails before a run is planned on it)."""
    try:
        return SandboxLimits.for_environment(env.sandbox_limits, limits)
    except ValueError as error:
        raise InvalidSandboxLimits(
            f"{error}; the limits and their bounds are the fields of nodus.sandbox.SandboxLimits "
            "(wall_time_s, cpu_time_s, memory_mb, max_processes, max_file_size_mb, max_output_bytes, tmpfs_mb, "
            "max_open_files, max_details_chars)"
        ) from None


class Grader:
    """Grades completions of one environment through a pool of sandboxed workers.

    Use as a context manager so the workers are started once and reused for every batch.
    """

    def __init__(
        self,
        env: Environment,
        sandbox: SandboxMode = "nsjail",
        limits: Mapping[str, Any] | None = None,
        workers: int = 2,
    ) -> None:
        self.env = env
        if sandbox == "none":
            _IN_PROCESS[(env.id_text(), _params_key(env.params.model_dump(mode="json")))] = env
        else:
            require_installed(env)
        self.pool = GraderPool(
            sandbox_limits(env, limits),
            workers=workers,
            mode=sandbox,
            isolate_each_completion=env.isolate_each_completion,
        )

    def __enter__(self) -> Grader:
        self.pool.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.pool.close()

    def grade(self, pairs: Sequence[tuple[Task, str]]) -> list[GradeOutcome]:
        return self.pool.run_many(
            [{"target": GRADE_TARGET, "payload": grade_payload(self.env, task, text)} for task, text in pairs]
        )

    @property
    def stats(self) -> PoolStats:
        return self.pool.stats


def require_installed(env: Environment) -> None:
    """A sandbox worker loads environments from installed plugins; one built in Python cannot be graded there."""
    try:
        installed = get_registry().resolve(env.id_text()).spec.cls
    except NodusError:
        installed = None
    if installed is not type(env):
        raise EnvironmentNotInstalled(
            f"{env.id_text()} is not an installed plugin, so a sandbox worker cannot load it; install its "
            "distribution, or grade it in this process with sandbox 'none' (trusted code only)"
        )
    # The jail mounts this interpreter's site-packages and the editable installs in them, not PYTHONPATH or the
    # user site: a plugin found there here is missing there, and each job failed with "pip install nodus-env-...".
    source = Path(inspect.getfile(installed)).resolve()
    if not any(source.is_relative_to(mount) for mount in python_mounts()):
        raise EnvironmentNotInstalled(
            f"{env.id_text()} is loaded from {source.parent}, which the sandbox does not mount (only this "
            f"interpreter's site-packages and the editable installs in it); install its distribution into {sys.prefix} "
            "(pip install -e for a checkout) rather than through PYTHONPATH or --user, or grade it in this process "
            "with sandbox 'none' (trusted code only)"
        )


class InvalidSandboxLimits(NodusError):
    """User overrides of the sandbox limits that fail validation."""


class EnvironmentNotInstalled(NodusError):
    """An environment object the sandbox workers cannot load."""


def grade_completions(
    env: Environment,
    pairs: Sequence[tuple[Task, str]],
    sandbox: SandboxMode = "nsjail",
    limits: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Grade a few completions once (the ``grpo grade`` command); a long job keeps a :class:`Grader` open."""
    with Grader(env, sandbox=sandbox, limits=limits, workers=1) as grader:
        return [outcome.model_dump() for outcome in grader.grade(pairs)]
