"""unit-tests@1: write a Python function that passes hidden unit tests; graded in two steps (see checks.py)."""

from __future__ import annotations

import random
from typing import Any

from nodus.core import Grade, Task
from nodus.core.data_file import FileBackedEnvironment
from nodus.sandbox.spawner import ProgramLimits, run_program
from pydantic import BaseModel, ConfigDict, Field

from nodus_env_unit_tests import hacks
from nodus_env_unit_tests.checks import UnsupportedTests, plan
from nodus_env_unit_tests.datafile import ProblemSet, load_problem_file
from nodus_env_unit_tests.extract import extract_code
from nodus_env_unit_tests.grading import run_tests
from nodus_env_unit_tests.harness import HARNESS, NoResults, parse_results, request
from nodus_env_unit_tests.problems import generate_problem

INSTRUCTION = "Answer with the complete function in a ```python code block."


class UnitTestsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    num_tests: int = Field(6, ge=1, le=6, description="Tests per built-in task.")
    data: str | None = Field(None, min_length=1, description="A JSONL file of HumanEval or MBPP problems to use.")
    skip_unsupported: bool = Field(
        False, description="Skip file problems whose tests call the function with computed arguments."
    )
    partial_credit: bool = Field(False, description="Score = the fraction of assertions that held.")
    time_limit_s: float = Field(5.0, gt=0, le=30, description="CPU and wall seconds for running one completion.")


class UnitTests(FileBackedEnvironment):
    name = "unit-tests"
    version = 1
    description = "Write a Python function that passes hidden unit tests (built-in, HumanEval or MBPP)."
    Params = UnitTestsParams
    grading_params = frozenset({"partial_credit", "time_limit_s"})
    isolate_each_completion = True
    # The job covers the completion's own run (time_limit_s, at most 30 s) plus starting it and the tests.
    sandbox_limits = {"wall_time_s": 40.0, "cpu_time_s": 40.0, "memory_mb": 512, "max_processes": 32}

    def load_data_file(self, path: str) -> ProblemSet:
        return load_problem_file(path, self.params.skip_unsupported)

    def generate_built_in(self, rng: random.Random) -> dict[str, Any]:
        return generate_problem(rng, self.params.num_tests)

    def prompt_text(self, task: Task) -> str:
        return f"{task.data['prompt']}\n\n{INSTRUCTION}"

    def reference(self, task: Task) -> str:
        return f"```python\n{task.data['reference']}```"

    def mutations(self, task: Task) -> list[str]:
        """The reference with its last ``return`` made to return None, and every reward hack (all must fail)."""
        wrong = [f"```python\n{code}\n```" for code in hacks.hacks(task.data["entry_point"])]
        lines = task.data["reference"].rstrip("\n").split("\n")
        returns = [i for i, line in enumerate(lines) if line.strip().startswith("return ")]
        if returns:
            last = returns[-1]
            indent = lines[last][: len(lines[last]) - len(lines[last].lstrip())]
            dropped = "\n".join([*lines[:last], f"{indent}return None", *lines[last + 1 :]])
            wrong.insert(0, f"```python\n{dropped}\n```")
        return wrong

    def grade(self, task: Task, completion: str) -> Grade:
        data = task.data
        program = data["preamble"] + "\n" + extract_code(completion, data["entry_point"])
        try:  # compiling runs nothing; it spares a process for what can never run
            compile(program, "<completion>", "exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as error:
            return Grade(score=0.0, passed=False, details=f"the code does not compile: {type(error).__name__}")
        try:
            test_plan = plan(data["tests"], data.get("call_name", data["entry_point"]))
        except UnsupportedTests as error:  # generated and loaded tasks were planned already
            raise RuntimeError(f"task {task.id} has unsupported tests: {error}") from error
        stdin, nonce = request(data["entry_point"], test_plan.calls)
        limits = ProgramLimits(wall_time_s=self.params.time_limit_s, cpu_time_s=self.params.time_limit_s,
                               memory_mb=256, max_output_bytes=1_000_000)
        result = run_program(program, stdin=stdin, epilogue=HARNESS, limits=limits)
        try:
            results = parse_results(result.stdout, nonce, len(test_plan.calls))
        except NoResults as error:
            why = result.failure_reason or "no_results"
            stderr = result.stderr.strip().splitlines()[-1:] or [""]
            return Grade(score=0.0, passed=False, details=f"{why}: {error}; {stderr[0][:160]}".rstrip("; "))
        verdict = run_tests(test_plan, results, data.get("then_call"))
        if verdict.total and not verdict.failed:
            return Grade(score=1.0, passed=True, details=f"all {verdict.total} assertions passed")
        score = verdict.passed / verdict.total if self.params.partial_credit and verdict.total else 0.0
        return Grade(score=score, passed=False,
                     details=f"{verdict.passed} of {verdict.total} assertions passed; {verdict.problem}")
