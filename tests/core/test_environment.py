import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nodus.core.environment import Environment, Grade, Split, Task
from nodus.core.errors import InvalidParameters, TaskGenerationError
from nodus.core.registry import Registry
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tests.conftest import EchoNumber


def test_splits_are_disjoint_by_content_and_stable(registry: Registry) -> None:
    env = registry.resolve("test/echo@1").spec.make({"digits": 3})
    heldout = env.tasks("heldout", seed=7, count=64)
    train = env.tasks("train", seed=7, count=200)
    assert not {env.prompt_text(t) for t in heldout} & {env.prompt_text(t) for t in train}
    assert len({env.prompt_text(t) for t in train}) == 200  # no duplicates within a split either
    assert [t.id for t in heldout[:3]] == ["heldout-7-0", "heldout-7-1", "heldout-7-2"]
    assert [t.index for t in train] == list(range(200))
    # The first tasks of a split do not depend on how many tasks were asked for.
    assert env.tasks("train", seed=7, count=10) == train[:10]
    assert env.task("heldout", 7, 5) == heldout[5]


def test_generation_is_a_pure_function_of_its_inputs(registry: Registry) -> None:
    first = registry.resolve("test/echo@1").spec.make({"digits": 4}).tasks("heldout", 3, 20)
    again = EchoNumber({"digits": 4}).tasks("heldout", 3, 20)
    assert first == again
    assert EchoNumber({"digits": 4}).tasks("heldout", 4, 20) != first  # the seed matters
    assert EchoNumber({"digits": 5}).tasks("heldout", 3, 20) != first  # generation parameters matter


def test_grading_only_parameters_keep_the_same_tasks() -> None:
    assert EchoNumber({"strict": True}).tasks("heldout", 1, 10) == EchoNumber().tasks("heldout", 1, 10)


def test_too_small_a_parameter_space_is_a_clear_error() -> None:
    env = EchoNumber({"digits": 1})  # only 10 distinct prompts exist
    with pytest.raises(TaskGenerationError) as error:
        env.tasks("train", 0, 20)
    assert str(error.value) == (
        "test/echo@1 with parameters {'digits': 1, 'strict': False} yields only 7 distinct train tasks in "
        "2304 draws; ask for fewer tasks or use parameters with more possible tasks"
    )


def test_parameter_errors_name_the_field_and_the_rule() -> None:
    with pytest.raises(InvalidParameters) as error:
        EchoNumber({"digits": 9})
    assert str(error.value) == (
        "invalid parameter digits=9 for test/echo@1: Input should be less than or equal to 6; "
        "see 'grpo envs --env test/echo@1' for the parameters and their bounds"
    )
    with pytest.raises(InvalidParameters) as error:
        EchoNumber({"digitz": 2})
    assert str(error.value) == "unknown parameter 'digitz' for test/echo@1; its parameters are: digits, strict"


def test_prompt_is_chat_messages_and_reference_passes() -> None:
    env = EchoNumber()
    task = env.task("train", 0, 0)
    assert env.prompt(task) == [{"role": "user", "content": env.prompt_text(task)}]
    assert env.grade(task, env.reference(task)).passed
    assert env.task_from_dict(task.model_dump(mode="json")) == task


class LaxParams(BaseModel):  # an author who left out extra="forbid"
    digits: int = Field(2, ge=1, le=6)


class LaxEcho(EchoNumber):
    name = "lax-echo"
    Params = LaxParams  # type: ignore[assignment]
    grading_params = frozenset()


def test_a_misspelt_parameter_is_refused_even_when_params_allow_extra_keys() -> None:
    with pytest.raises(InvalidParameters) as error:
        LaxEcho({"digitz": 3})
    assert str(error.value) == "unknown parameter 'digitz' for test/lax-echo@1; its parameters are: digits"
    assert LaxEcho({"digits": 3}).params.digits == 3  # type: ignore[attr-defined]


def test_a_grade_adjusted_after_it_was_built_keeps_its_bounds() -> None:
    grade = Grade(score=0.5, passed=False, details="half")
    grade.score += 0.25
    assert grade.score == 0.75
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        grade.score += 0.5  # a bonus that would leave [0, 1] fails where it is added, not later in the sandbox


class WordedSum(EchoNumber):
    """One problem (a pair of digits), worded two ways: the case split_key exists for."""

    name = "worded-sum"
    grading_params = frozenset()

    def generate(self, rng: random.Random) -> dict[str, Any]:
        return {"numbers": [rng.randrange(10), rng.randrange(10)], "wording": rng.randrange(2)}

    def prompt_text(self, task: Task) -> str:
        a, b = task.data["numbers"]
        return f"Add {a} and {b}." if task.data["wording"] == 0 else f"What is the sum of {a} and {b}?"


class WordedSumByProblem(WordedSum):
    name = "worded-sum-by-problem"

    def split_key(self, task: Task) -> str:
        return json.dumps(task.data["numbers"])


def test_split_key_keeps_rewordings_of_a_held_out_problem_out_of_train() -> None:
    def problems(env: Environment, split: Split, count: int) -> set[str]:
        return {json.dumps(t.data["numbers"]) for t in env.tasks(split, 0, count)}

    # By prompt, a rewording of a held-out problem can be a train task; by problem, never.
    assert problems(WordedSum(), "heldout", 10) & problems(WordedSum(), "train", 60)
    by_problem = WordedSumByProblem()
    assert not problems(by_problem, "heldout", 10) & problems(by_problem, "train", 60)


class TagParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    digits: int = Field(3, ge=1, le=6)
    tags: frozenset[str] = frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta"})
    groups: dict[str, set[str]] = {"vowels": {"a", "e", "i", "o", "u"}}


class TaggedEcho(EchoNumber):
    """Set-valued parameters that generate() never reads: they must still not change the tasks by hash order."""

    name = "tagged-echo"
    Params = TagParams  # type: ignore[assignment]
    grading_params = frozenset()


def test_set_valued_parameters_draw_the_same_tasks_under_any_hash_seed() -> None:
    root = Path(__file__).parents[2]
    code = "from tests.core.test_environment import TaggedEcho; print(TaggedEcho().tasks('train', 0, 5))"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in ("0", "1", "2", "3")
    ]
    outputs = {run.communicate(timeout=60)[0] for run in runs}
    assert len(outputs) == 1 and all(run.returncode == 0 for run in runs), outputs
    # Sorted at every depth: what the seed is made of no longer depends on the order of a set.
    assert TaggedEcho().seed_inputs() == [
        {
            "digits": 3,
            "tags": ["alpha", "beta", "delta", "epsilon", "gamma", "zeta"],
            "groups": {"vowels": ["a", "e", "i", "o", "u"]},
        }
    ]


def test_parameters_without_sets_are_seeded_as_their_json_dump() -> None:
    # What every shipped version draws depends on this staying the same (their golden tests pin the tasks).
    assert EchoNumber({"digits": 4, "strict": True}).seed_inputs() == [{"digits": 4}]
    assert LaxEcho().seed_inputs() == [LaxParams().model_dump(mode="json")]


class ListEcho(EchoNumber):
    def generate(self, rng: random.Random) -> dict[str, Any]:
        return [rng.randrange(10)]  # type: ignore[return-value]


def test_generate_returning_something_other_than_a_dict_is_a_clear_error() -> None:
    with pytest.raises(TaskGenerationError) as error:
        ListEcho().tasks("train", 0, 1)
    assert str(error.value) == (
        "ListEcho.generate() returned a list, not a dict; return the task's data as a dict of JSON values, "
        "e.g. {'numbers': [3, 1, 2]}"
    )


def test_an_environment_without_mutations_is_told_what_to_write() -> None:
    env = EchoNumber()  # the four methods only, as the README once said
    with pytest.raises(NotImplementedError) as error:
        env.mutations(env.task("train", 0, 0))
    assert str(error.value) == (
        "the environment has no mutations(task) method; add one returning wrong-but-close completions that must "
        "score below 1, e.g. def mutations(self, task): return [str(task.data['answer'] + 1)]"
    )
