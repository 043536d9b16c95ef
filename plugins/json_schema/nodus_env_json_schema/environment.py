"""json-schema@1: answer with a JSON value that satisfies a JSON Schema and the values the request fixes."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from nodus.core import Grade, Task
from nodus.core.data_file import FileBackedEnvironment
from pydantic import BaseModel, ConfigDict, Field

from nodus_env_json_schema.answer import NoJson, extract_json
from nodus_env_json_schema.datafile import TaskSet, load_task_file
from nodus_env_json_schema.schemas import generate_schema_task, resolve
from nodus_env_json_schema.validation import summary, validator_for, violations


class JsonSchemaParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    depth: int = Field(2, ge=1, le=3, description="Nesting depth of generated schemas (objects in objects/arrays).")
    fixed_values: int = Field(2, ge=0, le=5, description="How many values the request fixes (generated tasks).")
    data: str | None = Field(
        None, min_length=1, description="A JSONL task file of {prompt, schema[, expected][, reference]} to use."
    )


class JsonSchema(FileBackedEnvironment):
    name = "json-schema"
    version = 1
    description = "Write a JSON value that satisfies a JSON Schema and the values the request fixes."
    Params = JsonSchemaParams
    sandbox_limits = {"wall_time_s": 10.0, "memory_mb": 512}

    def load_data_file(self, path: str) -> TaskSet:
        return load_task_file(path)

    def generate_built_in(self, rng: random.Random) -> dict[str, Any]:
        return generate_schema_task(rng, self.params.depth, self.params.fixed_values)

    def prompt_text(self, task: Task) -> str:
        schema = json.dumps(task.data["schema"], indent=2, sort_keys=True)
        return (
            f"{task.data['request']}\n\nThe JSON must conform to this JSON Schema:\n```json\n{schema}\n```\n"
            "Answer with the JSON value in a ```json code block."
        )

    def reference(self, task: Task) -> str:
        return f"```json\n{json.dumps(task.data['reference'], indent=2)}\n```"

    def mutations(self, task: Task) -> list[str]:
        """Broken references: a requested value changed, a required field dropped, a wrong type, cut JSON."""
        reference = task.data["reference"]
        wrong = [self.reference(task)[: -len("\n```")].rstrip()[:-1] + "\n```"]  # drop the closing bracket
        for pointer, value in task.data["expected"].items():
            wrong.append(_fenced(_replaced(reference, pointer, _different(value))))
        schema = task.data["schema"]
        if isinstance(reference, dict) and schema.get("required"):
            key = schema["required"][0]
            wrong.append(_fenced({k: v for k, v in reference.items() if k != key}))
            wrong.append(_fenced({**reference, key: [reference.get(key)]}))  # a required value of the wrong type
        return wrong

    def grade(self, task: Task, completion: str) -> Grade:
        try:
            instance, where = extract_json(completion)
        except NoJson as error:
            return Grade(score=0.0, passed=False, details=str(error))
        try:
            problems = violations(validator_for(task.data["schema"]), task.data["expected"], instance)
        except RecursionError:
            return Grade(score=0.0, passed=False, details="the JSON is nested too deeply to validate")
        if problems:
            return Grade(score=0.0, passed=False, details=f"JSON from the {where}: {summary(problems)}")
        return Grade(score=1.0, passed=True, details=f"JSON from the {where} satisfies the schema and the request")


def _fenced(value: Any) -> str:
    return f"```json\n{json.dumps(value)}\n```"


def _different(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return None


def _replaced(document: Any, pointer: str, value: Any) -> Any:
    copied = copy.deepcopy(document)
    *parents, last = pointer.split("/")[1:]
    target = resolve(copied, "/" + "/".join(parents)) if parents else copied
    target[int(last) if isinstance(target, list) else last] = value
    return copied
