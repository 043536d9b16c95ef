import ast
import collections
import json
from collections import Counter, namedtuple
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodus.core import Task
from nodus_env_unit_tests import UnitTests
from nodus_env_unit_tests.checks import plan
from nodus_env_unit_tests.hacks import READ_EXPECTED, hacks
from nodus_env_unit_tests.harness import NoResults, parse_results
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


def test_an_example_block_after_the_solution_is_not_what_is_graded(tasks: dict[str, Task]) -> None:
    # A usage example after the solution was graded instead of it: a correct solution scored 0 (NameError).
    task = tasks["generated"]
    entry = task.data["entry_point"]
    solution = fenced(ENV.reference(task).strip().removeprefix("```python").removesuffix("```").strip())
    for example in (fenced(f"print({entry}([1, 2, 3]))"), "Output:\n```\n[1, 3]\n```"):
        assert ENV.grade(task, f"{solution}\nFor example:\n{example}").passed, example
    # Of two blocks that define the function, the last is the answer, as before.
    wrong = fenced(f"def {entry}(*args):\n    return None")
    assert not ENV.grade(task, f"{solution}\nOn second thought:\n{wrong}").passed


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
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.tuples(inner, inner)
            | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=10,
    )
)
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


Bounds = namedtuple("Bounds", "low high")


def file_tasks(tmp_path: Path, records: list[dict[str, Any]]) -> dict[str, Task]:
    """The tasks of a problem file, by entry point."""
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    env = UnitTests({"data": str(path)})
    assert env.data_file is not None
    return {
        record["entry_point"]: Task(
            env=env.id_text(), id=f"file-{i}", split="train", seed=0, index=i, draw=0, data=record
        )
        for i, record in enumerate(env.data_file.records)
    }


def mbpp(name: str, code: str, *tests: str) -> dict[str, Any]:
    return {"task_id": name, "text": f"Write {name}.", "code": code, "test_list": list(tests)}


def test_a_result_line_nested_too_deeply_to_decode_scores_0(tasks: dict[str, Task]) -> None:
    # The completion knows the nonce (it is on its stdin) and writes a result line the decoder cannot
    # follow: that is the completion's doing, a 0 with a reason, never a grader crash.
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(NoResults, match=r"the results are malformed \(RecursionError\)"):
        parse_results(f"nonce:{deep}\n", "nonce:", 1)
    code = (
        "import json, os, sys\nnonce = json.loads(sys.stdin.readline())['nonce']\n"
        f"sys.stdout.write('\\n' + nonce + {deep[:1]!r} * 200_000 + {deep[-1:]!r} * 200_000 + '\\n')\n"
        "sys.stdout.flush()\nos._exit(0)\n"
    )
    for env in (ENV, UnitTests({"partial_credit": True})):
        grade = env.grade(tasks["humaneval"], fenced(code))
        assert grade.score == 0.0 and "the results are malformed (RecursionError)" in grade.details


def test_integers_too_long_for_decimal_text_come_back_exactly(tmp_path: Path) -> None:
    # Python will not write or read decimal ints over 4300 digits; a correct function may return one.
    for value in (10**5000 + 7, -(3**20000), 2**10000, 2**10001):
        assert decode(json.loads(json.dumps(encode(value)))) == value
    record = mbpp(
        "fact",
        "import math\ndef fact(n):\n    return math.factorial(n)\n",
        "assert fact(5) == 120",
        "assert fact(2000) % 1000003 == 28665",
    )
    task = file_tasks(tmp_path, [record])["fact"]
    assert ENV.grade(task, ENV.reference(task)).score == 1.0
    wrong = fenced("import math\ndef fact(n):\n    return math.factorial(n) + 1\n")
    assert UnitTests({"partial_credit": True}).grade(task, wrong).score == 0.0


def test_container_subclasses_compare_like_their_builtin_base(tmp_path: Path) -> None:
    # Counter, defaultdict, OrderedDict and namedtuples equal dicts and tuples under ==, as in the benchmarks.
    records = [
        mbpp(
            "count",
            "def count(s):\n    return {c: s.count(c) for c in s}\n",
            "assert count('aab') == {'a': 2, 'b': 1}",
            "assert count('') == {}",
        ),
        mbpp(
            "bounds",
            "def bounds(xs):\n    return (min(xs), max(xs))\n",
            "assert bounds([3, 1, 2]) == (1, 3)",
            "assert bounds([5]) == (5, 5)",
        ),
        mbpp(
            "evens",
            "def evens(xs):\n    return [x for x in xs if x % 2 == 0]\n",
            "assert evens([1, 2, 3, 4]) == [2, 4]",
            "assert evens([1]) == []",
        ),
    ]
    tasks = file_tasks(tmp_path, records)
    right = {
        "count": [
            "from collections import Counter\ndef count(s):\n    return Counter(s)\n",
            "from collections import defaultdict\ndef count(s):\n    d = defaultdict(int)\n"
            "    for c in s:\n        d[c] += 1\n    return d\n",
            "from collections import OrderedDict\ndef count(s):\n    return OrderedDict((c, s.count(c)) for c in s)\n",
        ],
        "bounds": [
            "from collections import namedtuple\nBounds = namedtuple('Bounds', 'low high')\n"
            "def bounds(xs):\n    return Bounds(min(xs), max(xs))\n",
        ],
        "evens": ["class Evens(list):\n    pass\n\ndef evens(xs):\n    return Evens(x for x in xs if x % 2 == 0)\n"],
    }
    for name, programs in right.items():
        for program in programs:
            grade = ENV.grade(tasks[name], fenced(program))
            assert grade.passed, (program, grade.details)
    wrong = [
        # a list subclass that claims to equal everything, and one that lies about its contents
        (
            "evens",
            "class Yes(list):\n    def __eq__(self, other):\n        return True\n\ndef evens(xs):\n    return Yes()\n",
        ),
        (
            "evens",
            "class Lies(list):\n    def __iter__(self):\n        return iter([2, 4])\n\n"
            "def evens(xs):\n    return Lies()\n",
        ),
        ("evens", "def evens(xs):\n    return tuple(x for x in xs if x % 2 == 0)\n"),  # a tuple is no list
        ("bounds", "def bounds(xs):\n    return [min(xs), max(xs)]\n"),  # nor a list a tuple
        (
            "count",
            "class Yes(dict):\n    def __eq__(self, other):\n        return True\n\ndef count(s):\n    return Yes()\n",
        ),
    ]
    for name, program in wrong:
        grade = UnitTests({"partial_credit": True}).grade(tasks[name], fenced(program))
        assert grade.score < 1.0 and not grade.passed, (program, grade.details)
    # Built-in tasks stay type-strict: a subclass arrives as its base, and a tuple is still not a list.
    assert type(decode(encode(Counter("ab")))) is dict and type(decode(encode(Bounds(1, 2)))) is tuple
    assert not same([1, 2], decode(encode((1, 2))))


def test_an_ordered_dict_arrives_in_its_own_order(tmp_path: Path) -> None:
    # It was read through dict.items, which gives the order of its storage: after move_to_end("a") a correct
    # function arrived as {"a": 1, "b": 2} and failed a test of the order.
    record = mbpp(
        "last_first",
        "from collections import OrderedDict\n"
        "def last_first(d):\n    return OrderedDict(list(d.items())[1:] + list(d.items())[:1])\n",
        "r = last_first({'a': 1, 'b': 2})\nassert list(r) == ['b', 'a']",
        "assert list(last_first({'x': 1, 'y': 2, 'z': 3}).items()) == [('y', 2), ('z', 3), ('x', 1)]",
    )
    task = file_tasks(tmp_path, [record])["last_first"]
    assert ENV.grade(task, ENV.reference(task)).passed
    moved = "from collections import OrderedDict\ndef last_first(d):\n    r = OrderedDict(d)\n    k = next(iter(d))\n"
    moved += "    r.move_to_end(k)\n    return r\n"
    grade = ENV.grade(task, fenced(moved))
    assert grade.passed and grade.score == 1.0, grade.details
    # Still read through OrderedDict's own method: an override in a further subclass fakes nothing.
    lies = "from collections import OrderedDict\nclass Lies(OrderedDict):\n    def items(self):\n"
    lies += "        return [('b', 2), ('a', 1)]\n    def __iter__(self):\n        return iter(['b', 'a'])\n"
    lies += "def last_first(d):\n    return Lies(d)\n"
    grade = UnitTests({"partial_credit": True}).grade(task, fenced(lies))
    assert grade.score == 0.0, grade.details
    ordered = collections.OrderedDict(a=1, b=2)
    ordered.move_to_end("a")
    assert list(decode(encode(ordered)).items()) == [("b", 2), ("a", 1)]


def test_assertions_that_check_no_result_earn_no_credit(tmp_path: Path) -> None:
    # HumanEval's tests start with `assert True, '...'`: with partial credit, a function returning None
    # must not earn those.
    record = {
        "task_id": "X/0",
        "prompt": 'def add(x: int, y: int):\n    """Add two numbers."""\n',
        "canonical_solution": "    return x + y\n",
        "test": "def check(candidate):\n    assert True, 'debugging 1'\n    assert candidate(0, 1) == 1\n"
        "    assert True\n    total = candidate(1, 0)\n    assert total == 1\n    assert candidate(2, 3) == 5\n",
        "entry_point": "add",
    }
    task = file_tasks(tmp_path, [record])["add"]
    partial = UnitTests({"partial_credit": True})
    assert partial.grade(task, ENV.reference(task)).details == "all 3 assertions passed"
    none = partial.grade(task, fenced("def add(x, y):\n    return None\n"))
    assert none.score == 0.0 and none.details.startswith("0 of 3 assertions passed"), none.details
    # Only the first sum is right: 1 of 3 (the result read through `total` counts too).
    one = partial.grade(task, fenced("def add(x, y):\n    return 1 if (x, y) == (0, 1) else None\n"))
    assert one.score == pytest.approx(1 / 3), one.details
    # An assertion that checks no result still fails the tests when it fails, as in the benchmark.
    failing = task.model_copy(update={"data": {**task.data, "tests": task.data["tests"].replace("True\n", "1 == 2\n")}})
    grade = partial.grade(failing, ENV.reference(task))
    assert not grade.passed and grade.details.startswith("3 of 4 assertions passed"), grade.details


@pytest.mark.parametrize(
    "tests",
    [
        "assert True\nassert f(1) == 2\nassert True, 'debugging'",
        "r = f(1)\nassert r == 2\nassert len([1]) == 1",
        "rs = []\nrs.append(f(1))\nassert rs == [2]\nassert not []",
        "for x in f(1):\n    assert x > 0\nassert 1",
        "def g():\n    return f(1)\n\nassert g() == 2\nassert 1 == 1",
    ],
)
def test_only_assertions_that_involve_a_result_of_the_function_count(tests: str) -> None:
    code = plan(tests, "f").code
    assert code.count("_nodus_ok, True)") == 1 and code.count("_nodus_ok, False)") == tests.count("assert") - 1
