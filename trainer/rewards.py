"""An environment as TRL sees it: a dataset of prompts and a reward function that grades in the sandbox.

Also usable from a user's own TRL script::

    env = load_environment("graph-coloring@1")
    with Grader(env) as grader:
        trainer = GRPOTrainer(model, reward_funcs=SandboxReward(grader),
                              train_dataset=prompt_dataset(env, env.tasks("train", 42, 200)), ...)
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

from datasets import Dataset
from nodus.core.environment import Environment, Task
from nodus.core.grading import Grader

# The share of a round's groups that teach nothing (fast_grpo logs it with TRL's metrics; the progress line and
# results.json read it). TRL's frac_reward_zero_std is not that: it is per completion of a standard deviation that
# is batch-wide under scale_rewards="batch", and a group with one graded completion (the others infrastructure
# failures) has a NaN deviation, which it counts as varied.
ZERO_VARIANCE_METRIC = "zero_variance_groups"


def prompt_dataset(env: Environment, tasks: list[Task]) -> Dataset:
    """Conversational prompts (the ``prompt`` column TRL expects) and each task by value (``task``)."""
    return Dataset.from_list(
        [{"prompt": env.prompt(task), "task": task.model_dump_json(), "task_id": task.id} for task in tasks]
    )


def completion_text(completion: Any) -> str:
    """TRL passes a conversational completion as a list of messages; a plain one as a string."""
    if isinstance(completion, list):
        return "".join(str(message.get("content", "")) for message in completion)
    return str(completion)


class SandboxReward:
    """A TRL reward function: grade each completion in the sandbox.

    An infrastructure failure is not a score: it is returned as ``None``, which TRL leaves out of the group
    mean and standard deviation (and gives an advantage of 0), and it is counted here.
    """

    def __init__(self, grader: Grader, tokenizer: Any = None) -> None:
        self.grader = grader
        self.tokenizer = tokenizer
        self.__name__ = f"sandbox:{grader.env.id_text()}"  # TRL names logged metrics after the function
        self._lock = threading.Lock()
        self.infrastructure_failures = 0
        self.graded = 0
        self.reward_counts: Counter[float] = Counter()

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        task: list[str],
        completion_ids: list[list[int]] | None = None,
        **_: Any,
    ) -> list[float | None]:
        if self.tokenizer is not None and completion_ids is not None:
            # The text the held-out evaluations grade, decoded the same way. TRL's own messages can be less: with a
            # tokenizer that has a response template or schema, it hands over only the parsed `content` (the
            # reasoning of a thinking model, say, split off), so training would reward other text than evaluation.
            texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        else:
            texts = [completion_text(c) for c in completions]
        pairs = [(self.grader.env.task_from_dict(json.loads(t)), text) for t, text in zip(task, texts, strict=True)]
        outcomes = self.grader.grade(pairs)
        rewards: list[float | None] = [None if o.is_infrastructure_failure else o.score for o in outcomes]
        with self._lock:
            for reward in rewards:
                if reward is None:
                    self.infrastructure_failures += 1
                else:
                    self.graded += 1
                    self.reward_counts[round(reward, 6)] += 1
        return rewards

    def state(self) -> dict[str, Any]:
        return {
            "graded": self.graded,
            "infrastructureFailures": self.infrastructure_failures,
            "rewardCounts": {str(k): v for k, v in sorted(self.reward_counts.items())},
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.graded = int(state.get("graded", 0))
        self.infrastructure_failures = int(state.get("infrastructureFailures", 0))
        self.reward_counts = Counter({float(k): int(v) for k, v in state.get("rewardCounts", {}).items()})


def merge_reward_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The tallies of several processes (SandboxReward.state()) as one."""
    counts: Counter[str] = Counter()
    for state in states:
        counts.update({key: int(value) for key, value in state.get("rewardCounts", {}).items()})
    return {
        "graded": sum(int(state.get("graded", 0)) for state in states),
        "infrastructureFailures": sum(int(state.get("infrastructureFailures", 0)) for state in states),
        "rewardCounts": {key: counts[key] for key in sorted(counts, key=float)},
    }
