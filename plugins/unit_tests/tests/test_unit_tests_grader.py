import ast
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodus.core import Task
from nodus_env_unit_tests import UnitTests
from nodus_env_unit_tests.hacks import READ_EXPECTED, hacks
from nodus_env_unit_tests.values import Opaque, decode, encode, same
from unit_tests_samples import HUMANEVAL, MBPP

pytestmark = pytest.mark.usefixtures("fast_programs")
ENV = UnitTests()


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module")
def tasks(fast_programs: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Task]:
    # Drawn only after the zygote forked, with a seed used nowhere else: whatever a completion finds in its
    # process memory, it is not these tasks' tests.
    path = tmp_path_factory.mktemp("data") / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in HUMANEVAL + MBPP))
    env = UnitTests({"data": str(path)})
    assert env.data_file is not None
    by_source: dict[str, Task] = {}
    for index, record in enumerate(env.data_file.records):
        task = Task(env=env.id_text(), id=f"file-{index}", split="train", seed=0, index=index, draw=0, data=record)
        by_source.setdefault(record["source"], task)
    return {"generated": ENV.task("heldout", 918273, 0), **by_source}


@pytest.mark.parametrize("source", ["generated", "humaneval", "mbpp"])
def test_the_reference_passes_and_every_reward_hack_scores_0(tasks: dict[str, Task], source: str) -> None:
    task = tasks[source]
    assert ENV.grade(task, ENV.reference(task)).passed
    for code in hacks(task.data["entry_point"]):
        grade = ENV.grade(task, fenced(code))
        assert grade.score == 0.0 and not grade.passed, (code, grade.details)
        partial = UnitTests({"partial_credit": True}).grade(task, fenced(code))
        assert partial.score == 0.0, (code, partial.details)  # not even partial credit


def test_the_memory_hack_is_real_it_finds_expected_values_that_are_in_memory(tasks: dict[str, Task]) -> None:
    # Run in this process, where the tests are in memory: the hack reads the right answers. Through the
    # harness it scores 0 (test above), because the completion's process never holds them.
    task = tasks["generated"]
    namespace: dict[str, Any] = {}
    exec(READ_EXPECTED.replace("ENTRY", task.data["entry_point"]), namespace)
    reference: dict[str, Any] = {}
    exec(task.data["reference"], reference)
    tests_in_memory = [task.data["tests"]]
    call = ast.parse(tests_in_memory[0].splitlines()[0]).body[0].test.args[1]  # type: ignore[attr-defined]
    args = tuple(ast.literal_eval(a) for a in call.args)
    entry = task.data["entry_point"]
    assert same(reference[entry](*args), namespace[entry](*args))


def test_details_say_why_a_completion_failed(tasks: dict[str, Task]) -> None:
    task = tasks["generated"]
    entry = task.data["entry_point"]
    cases = {
        "no code at all": "the code does not compile: SyntaxError",
        fenced(f"def {entry}(*args):\n    raise ValueError('no')"): "0 of 6 assertions passed; assertion 1 of 6 failed "
        "(CallRaised: ValueError for arguments",
        fenced(f"def {entry}(*args):\n    while True:\n        pass"): "timeout: the program stopped before",
        fenced("import os\nos._exit(0)"): "the program stopped before the tests could call its function",
    }
    fast = UnitTests({"time_limit_s": 1.0})
    for completion, reason in cases.items():
        details = fast.grade(task, completion).details
        assert details.startswith(reason) or reason in details, (completion, details)


def test_humaneval_completions_may_be_the_body_or_the_whole_function(tasks: dict[str, Task]) -> None:
    task = tasks["humaneval"]
    body = task.data["reference"]
    assert ENV.grade(task, body).passed  # raw continuation of the prompt
    whole = task.data["preamble"] + body
    assert ENV.grade(task, f"Here you go:\n```python\n{whole}```\nDone.").passed


def test_partial_credit_on_a_known_split() -> None:
    task = ENV.task("train", 5, 0)
    entry = task.data["entry_point"]
    reference: dict[str, Any] = {}
    exec(task.data["reference"], reference)
    # Right on the first test case only: memorise its answer.
    first = ast.parse(task.data["tests"].splitlines()[0]).body[0].test  # type: ignore[attr-defined]
    args = tuple(ast.literal_eval(a) for a in first.args[1].args)
    code = f"def {entry}(*args):\n    return {reference[entry](*args)!r} if args == {args!r} else None"
    grade = UnitTests({"partial_credit": True}).grade(task, fenced(code))
    assert grade.score == pytest.approx(1 / 6) and not grade.passed
    assert ENV.grade(task, fenced(code)).score == 0.0


@settings(max_examples=200, deadline=None)
@given(value=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=3), inner,
                                                                                        max_size=3),
    max_leaves=10,
))
def test_values_survive_the_round_trip_exactly(value: Any) -> None:
    back = decode(json.loads(json.dumps(encode(value))))
    assert same(value, back)


def test_type_strict_comparison_keeps_bool_int_and_float_apart() -> None:
    assert not same(1, True) and not same(1, 1.0) and not same((1,), [1]) and same([1.0], [1.0 + 1e-12])
    assert decode(encode(object())) != decode(encode(object()))
    assert isinstance(decode({"opaque": "_Anything"}), Opaque)


@settings(max_examples=25, deadline=None)
@given(text=st.text(max_size=200))
def test_grader_never_raises_and_scores_in_range(text: str) -> None:
    grade = ENV.grade(ENV.task("train", 42, 0), text)
    assert grade.score in (0.0, 1.0) and grade.details
