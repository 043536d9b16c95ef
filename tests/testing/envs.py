"""Small environments for testing the kit: one that conforms, and ones each breaking one property.

They live in an importable module (not inside test functions) so the kit can rebuild them in a subprocess.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

from nodus.core import Environment, Grade, Task


class PlainParrot(Environment):
    """Repeat a number; has no mutations method."""

    namespace = "test"
    name = "parrot"
    version = 1
    description = "Repeat the number."

    def generate(self, rng: random.Random) -> dict[str, Any]:
        return {"number": rng.randrange(10**6)}

    def prompt_text(self, task: Task) -> str:
        return f"Repeat {task.data['number']}."

    def grade(self, task: Task, completion: str) -> Grade:
        ok = completion.strip() == str(task.data["number"])
        return Grade(score=float(ok), passed=ok, details="equal" if ok else "different")

    def reference(self, task: Task) -> str:
        return str(task.data["number"])


class Parrot(PlainParrot):
    """Conforms to every check."""

    def mutations(self, task: Task) -> list[str]:
        return [str(task.data["number"] + 1), ""]


class GlobalRandomParrot(Parrot):
    def generate(self, rng: random.Random) -> dict[str, Any]:
        return {"number": random.randrange(10**6)}  # the global RNG: not reproducible


class HashSeededParrot(Parrot):
    def generate(self, rng: random.Random) -> dict[str, Any]:
        return {"number": hash(str(rng.random())) % 10**6}  # hash() of str changes with PYTHONHASHSEED


class RaisingParrot(Parrot):
    def grade(self, task: Task, completion: str) -> Grade:
        if "\x00" in completion:
            raise ValueError("cannot handle NUL")
        return super().grade(task, completion)


class GullibleParrot(Parrot):
    def grade(self, task: Task, completion: str) -> Grade:
        return Grade(score=1.0, passed=True, details="anything goes")


class WrongReferenceParrot(Parrot):
    def reference(self, task: Task) -> str:
        return str(task.data["number"] + 2)


class MoodyParrot(Parrot):
    def grade(self, task: Task, completion: str) -> Grade:
        grade = super().grade(task, completion)
        return grade if grade.passed else grade.model_copy(update={"details": f"different ({random.random():.6f})"})


class SlowParrot(Parrot):
    sandbox_limits = {"wall_time_s": 0.05, "cpu_time_s": 0.05}

    def grade(self, task: Task, completion: str) -> Grade:
        if completion.startswith("\x1b"):  # only the kit's control-character probe: keeps the test fast
            time.sleep(0.08)
        return super().grade(task, completion)


class ForgetfulParrot(Parrot):
    def mutations(self, task: Task) -> list[str]:
        return []


class HangingParrot(Parrot):
    sandbox_limits = {"wall_time_s": 0.2, "cpu_time_s": 0.2}

    def grade(self, task: Task, completion: str) -> Grade:
        while "\x00" in completion:  # a parser that never advances past a NUL byte
            pass
        return super().grade(task, completion)


class ExitingParrot(Parrot):
    def grade(self, task: Task, completion: str) -> Grade:
        if "\x00" in completion:
            sys.exit(3)
        return super().grade(task, completion)


class OverScoringParrot(Parrot):
    def grade(self, task: Task, completion: str) -> Grade:
        if completion.count(str(task.data["number"])) > 1:  # a bonus per correct answer, built unvalidated
            return Grade.model_construct(score=1.5, passed=True, details="twice right")
        return super().grade(task, completion)


class DictParrot(Parrot):
    def grade(self, task: Task, completion: str) -> Grade:
        if completion and not completion.strip():
            return {"score": 0.0, "passed": False, "details": "blank"}  # type: ignore[return-value]
        return super().grade(task, completion)


class IntKeyParrot(Parrot):
    def generate(self, rng: random.Random) -> dict[str, Any]:
        number = rng.randrange(10**6)
        return {"number": number, "digits": {0: str(number)[0]}}  # {0: ...} comes back from JSON as {"0": ...}


class RaisingReferenceParrot(Parrot):
    def reference(self, task: Task) -> str:
        return str(task.data["answer"])


class TypoLimitsParrot(Parrot):
    sandbox_limits = {"wal_time_s": 5.0}


WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


class SetOrderParrot(Parrot):
    def generate(self, rng: random.Random) -> dict[str, Any]:
        # The first element of a set of strings depends on PYTHONHASHSEED: a classic nondeterministic generator.
        return {"number": rng.randrange(10**6), "word": list(set(WORDS))[0]}

    def prompt_text(self, task: Task) -> str:
        return f"Repeat {task.data['number']} ({task.data['word']})."


GREEK = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


class GreekSetOrderParrot(SetOrderParrot):
    """PYTHONHASHSEED 0 and 1 both put "alpha" first of these: only more seeds catch it in every run."""

    def generate(self, rng: random.Random) -> dict[str, Any]:
        return {"number": rng.randrange(10**6), "word": list(set(GREEK))[0]}


class CheckedOverScoringParrot(Parrot):
    def grade(self, task: Task, completion: str) -> Grade:
        if completion.count(str(task.data["number"])) > 1:  # a bonus per correct answer: Grade refuses 1.5
            return Grade(score=1.5, passed=True, details="twice right")
        return super().grade(task, completion)


class ListParrot(Parrot):
    def generate(self, rng: random.Random) -> dict[str, Any]:
        return [rng.randrange(10**6)]  # type: ignore[return-value]


class SlowToWarmUpParrot(Parrot):
    """A warm_up slower than the sandbox's budget for preparing a grader (the tests shrink that budget)."""

    def warm_up(self) -> None:
        time.sleep(2)


class BrokenWarmUpParrot(Parrot):
    def warm_up(self) -> None:
        raise ImportError("No module named 'big_library'")
