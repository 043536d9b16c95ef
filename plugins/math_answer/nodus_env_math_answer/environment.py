"""math-answer@1: word problems with exact answers, graded by mathematical equivalence of the final answer."""

from __future__ import annotations

import random
import re
from typing import Any

from nodus.core import Grade, Task
from nodus.core.data_file import FileBackedEnvironment
from pydantic import BaseModel, ConfigDict, Field

from nodus_env_math_answer.datafile import ProblemSet, load_problem_file
from nodus_env_math_answer.equivalence import equivalent
from nodus_env_math_answer.extract import MAX_ANSWER_CHARS, final_answer
from nodus_env_math_answer.problems import generate_problem

PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
INSTRUCTION = "Solve the problem. Put your final answer in \\boxed{}."


class MathAnswerParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    difficulty: int = Field(2, ge=1, le=5, description="Size of the numbers and number of steps (built-in tasks).")
    data: str | None = Field(
        None, min_length=1, description="A JSONL problem file (GSM8K or MATH form) to use instead of built-in tasks."
    )
    last_number_fallback: bool = Field(
        False, description="When no final answer is marked, grade the last number in the completion."
    )


class MathAnswer(FileBackedEnvironment):
    name = "math-answer"
    version = 1
    description = "Arithmetic and algebra word problems (or your GSM8K/MATH file), graded by math equivalence."
    Params = MathAnswerParams
    grading_params = frozenset({"last_number_fallback"})
    # sympy parsing is untrusted work: bounded per job; math-verify + sympy need ~200 MiB resident.
    sandbox_limits = {"wall_time_s": 10.0, "cpu_time_s": 10.0, "memory_mb": 1024}

    def load_data_file(self, path: str) -> ProblemSet:
        return load_problem_file(path)

    def generate_built_in(self, rng: random.Random) -> dict[str, Any]:
        return generate_problem(rng, self.params.difficulty)

    def prompt_text(self, task: Task) -> str:
        return f"{task.data['question']}\n\n{INSTRUCTION}"

    def reference(self, task: Task) -> str:
        return f"The answer is $\\boxed{{{task.data['answer']}}}$."

    def mutations(self, task: Task) -> list[str]:
        """Wrong final answers near the right one: plus one, a digit changed, no answer at all."""
        answer = task.data["answer"]
        wrong = [f"\\boxed{{{answer}+1}}", "I could not solve it."]
        if PLAIN_NUMBER.fullmatch(answer):
            digit = next(i for i, char in enumerate(answer) if char.isdigit())
            wrong.append(f"\\boxed{{{answer[:digit]}{(int(answer[digit]) + 1) % 10}{answer[digit + 1 :]}}}")
        return wrong

    def warm_up(self) -> None:
        # math-verify (sympy, the LaTeX parser) is imported on first use: about a second, not the completion's. The
        # import comes first, outside equivalent()'s own parse time limit, which could cut it off half-way.
        import math_verify  # noqa: F401

        equivalent("1", "1")

    def grade(self, task: Task, completion: str) -> Grade:
        answer, how = final_answer(completion, self.params.last_number_fallback)
        if answer is None:
            fallback = "" if self.params.last_number_fallback else " (last_number_fallback is off)"
            return Grade(score=0.0, passed=False, details=f"no final answer: use \\boxed{{}}, ####, <answer> or "
                         f"'the answer is'{fallback}")
        if not answer:
            return Grade(score=0.0, passed=False, details=f"the final answer ({how}) is empty")
        if len(answer) > MAX_ANSWER_CHARS:
            return Grade(score=0.0, passed=False, details=f"the final answer ({how}) is over {MAX_ANSWER_CHARS} chars")
        verdict, why = equivalent(task.data["answer"], answer, question=task.data.get("question", ""))
        return Grade(score=1.0 if verdict else 0.0, passed=bool(verdict), details=f"{how}: {why}")
