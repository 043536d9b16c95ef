"""Grading jobs: the function the sandbox worker runs, and the job payloads the host sends it."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from nodus.core.environment import Environment, Task
from nodus.core.registry import load_environment

GRADE_TARGET = "nodus.core.grading:grade_job"


def grade_payload(env: Environment, task: Task, completion: str) -> dict[str, Any]:
    """The JSON a sandbox worker needs to grade ``completion``: everything by value, nothing by reference."""
    return {
        "env": env.id_text(),
        "params": env.params.model_dump(mode="json"),
        "task": task.model_dump(mode="json"),
        "completion": completion,
    }


@lru_cache(maxsize=32)
def _environment(env_id: str, params_json: str) -> Environment:
    # A worker grades many jobs of the same environment: resolve the plugin and validate parameters once.
    return load_environment(env_id, json.loads(params_json))


def grade_job(payload: dict[str, Any]) -> dict[str, Any]:
    """Sandbox target: grade one completion. Raising here is a grader failure, never a score of 0."""
    env = _environment(payload["env"], json.dumps(payload["params"], sort_keys=True))
    task = env.task_from_dict(payload["task"])
    return env.grade(task, payload["completion"]).model_dump()
