import hashlib
import json
from pathlib import Path

import pytest
from nodus.core.errors import NodusError
from nodus_env_unit_tests import UnitTests
from nodus_env_unit_tests.datafile import DataFileError
from nodus_env_unit_tests.environment import INSTRUCTION
from unit_tests_samples import HUMANEVAL, HUMANEVAL_COMPUTED_ARGS, MBPP

# sha256 of the first 8 tasks of each split for seed 42 with default parameters. If this fails, what
# unit-tests@1 generates has changed: put the new behaviour in unit-tests@2 and restore @1.
GOLDEN = {
    "train": "012a4073152f43ec9ca3aaf9b061df9cd28329566acdf9623af41c2d40cf4449",
    "heldout": "943a225a13d732fc00a57e6e50b217fad3cc2a131ebff142c3c524cb85bb800c",
}


def digest(env: UnitTests, split: str) -> str:
    tasks = [[t.id, env.prompt_text(t), t.data] for t in env.tasks(split, 42, 8)]  # type: ignore[arg-type]
    return hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_golden_tasks_for_seed_42(split: str) -> None:
    assert digest(UnitTests(), split) == GOLDEN[split]


def test_200_train_and_64_heldout_tasks_with_distinct_prompts_from_every_family() -> None:
    env = UnitTests()
    tasks = env.tasks("train", 42, 200) + env.tasks("heldout", 42, 64)
    assert len({env.prompt_text(t) for t in tasks}) == 264
    assert len({t.data["family"] for t in tasks}) == 10
    assert all(t.data["tests"].count("assert same(") == 6 for t in tasks)


def write_jsonl(path: Path, records: list[object]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_humaneval_and_mbpp_records_become_tasks(tmp_path: Path) -> None:
    env = UnitTests({"data": write_jsonl(tmp_path / "p.jsonl", HUMANEVAL + MBPP)})
    assert env.data_file is not None
    splits = [env.split_of(f"{record['prompt']}\n\n{INSTRUCTION}") for record in env.data_file.records]
    tasks = env.tasks("train", 0, splits.count("train")) + env.tasks("heldout", 0, splits.count("heldout"))
    assert len(tasks) == 6
    by_source = {t.data["source"] for t in tasks}
    assert by_source == {"humaneval", "mbpp"}
    mbpp = next(t for t in tasks if t.data["source"] == "mbpp")
    assert mbpp.data["entry_point"] in env.prompt_text(mbpp)
    humaneval = next(t for t in tasks if t.data["source"] == "humaneval")
    assert humaneval.data["preamble"] in env.prompt_text(humaneval)


def test_reordering_the_file_changes_nothing(tmp_path: Path) -> None:
    records = HUMANEVAL + MBPP
    first = UnitTests({"data": write_jsonl(tmp_path / "a.jsonl", records)}).tasks("train", 1, 4)
    second = UnitTests({"data": write_jsonl(tmp_path / "b.jsonl", records[::-1])}).tasks("train", 1, 4)
    assert [t.data for t in first] == [t.data for t in second]


def test_tests_with_computed_arguments_are_a_load_error_or_skipped(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [*HUMANEVAL, HUMANEVAL_COMPUTED_ARGS])
    expected = (
        r"p.jsonl:4: line 5 of the tests: candidate\(\.\.\.\) has arguments that are not literals "
        r"\(candidate\(x\)\); .* skip_unsupported=true"
    )
    with pytest.raises(DataFileError, match=expected) as raised:
        UnitTests({"data": path}).tasks("train", 0, 1)
    assert isinstance(raised.value, NodusError) and "\n" not in str(raised.value)
    env = UnitTests({"data": path, "skip_unsupported": True})
    assert env.data_file is not None and env.data_file.skipped == 1 and len(env.data_file.records) == 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "p.jsonl:1: not valid JSON"),
        ('{"text": "t", "code": "def f(): pass", "test_list": []}', "p.jsonl:1: the MBPP 'test_list' has no tests"),
        (
            '{"text": "t", "code": "def f(): pass", "test_list": ["assert g(1) == 1"]}',
            "p.jsonl:1: the MBPP tests call no function that 'code' defines",
        ),
        ('{"question": "q"}', r"p.jsonl:1: unknown record form \(keys: question\)"),
        (
            '{"text": "t", "code": "def f(x): return x", "test_list": ["f(1)", "assert True"]}',
            r"p.jsonl:1: no assert statement checks what f\(\.\.\.\) returns",
        ),
    ],
)
def test_a_bad_file_is_a_one_line_error(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "p.jsonl").write_text(line + "\n")
    with pytest.raises(DataFileError, match=message):
        UnitTests({"data": str(tmp_path / "p.jsonl")}).tasks("train", 0, 1)
