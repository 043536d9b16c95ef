"""An environment from a list of prompts and a Python reward function, for users who do not write a plugin.

    env = function_environment("shout", prompts, lambda prompt, completion: float(completion.isupper()))

The reward function runs in the trainer's process (it is the user's own trusted code and cannot be imported
inside a jail), so training on it needs ``sandbox: none``, which warns on every run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nodus.core.environment import Environment, Grade, Task
from nodus.core.errors import NodusError
from nodus.core.ids import parse_env_id

RewardFunction = Callable[[str, str], float]


class InvalidFunctionEnvironment(NodusError):
    """Prompts or a reward function that cannot make an environment."""


def function_environment(
    name: str, prompts: Sequence[str], reward: RewardFunction, references: Mapping[str, str] | None = None
) -> Environment:
    """An environment ``local/<name>@1`` whose tasks are ``prompts`` and whose grader is ``reward``.

    Splits follow the usual rule (a prompt's hash decides its split), so about one prompt in eight is held
    out; ``reward(prompt, completion)`` must return a number in [0, 1]. ``references`` (prompt -> a completion
    that scores 1) are optional; the conformance kit and SFT warm-up need them.
    """
    parse_env_id(f"local/{name}@1")  # the same grammar as every environment id
    unique = list(dict.fromkeys(prompts))
    if len(unique) < 2:
        raise InvalidFunctionEnvironment(f"function environment {name!r} needs at least 2 distinct prompts")

    class FunctionEnvironment(Environment):
        namespace = "local"
        version = 1
        description = f"Prompts graded by {getattr(reward, '__name__', 'a Python function')}."

        def generate(self, rng: random.Random) -> dict[str, Any]:
            return {"prompt": rng.choice(unique)}

        def prompt_text(self, task: Task) -> str:
            return str(task.data["prompt"])

        def grade(self, task: Task, completion: str) -> Grade:
            score = float(reward(task.data["prompt"], completion))
            if math.isnan(score) or not 0.0 <= score <= 1.0:
                raise ValueError(f"reward function returned {score}, not a number in [0, 1]")
            return Grade(score=score, passed=score == 1.0, details=f"reward {score:g}")

        def reference(self, task: Task) -> str:
            prompt = task.data["prompt"]
            if references is None or prompt not in references:
                raise InvalidFunctionEnvironment(
                    f"function environment {name!r} has no reference answer for {prompt[:40]!r}; pass references="
                )
            return references[prompt]

    FunctionEnvironment.name = name
    FunctionEnvironment.__name__ = FunctionEnvironment.__qualname__ = f"FunctionEnvironment[{name}]"
    return FunctionEnvironment()
