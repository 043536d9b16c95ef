import hashlib
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from nodus.core.errors import InvalidParameters, NodusError
from nodus_env_math_answer import MathAnswer
from nodus_env_math_answer.datafile import DataFileError
from nodus_env_math_answer.problems import exact_text

# sha256 of the first 8 tasks of each split for seed 42 with default parameters. If this fails, what
# math-answer@1 generates has changed: put the new behaviour in math-answer@2 and restore @1.
GOLDEN = {
    "train": "3073359ee6db8be321cc1a6df0fe8fe5809c709112f8c07a1353e6ed20e9159e",
    "heldout": "ca3144eb74c3ece183ba2ba1a77044d172897db8e2b7fc509ff2a923ac3048c2",
}


def digest(env: MathAnswer, split: str) -> str:
    tasks = [[t.id, env.prompt_text(t), t.data] for t in env.tasks(split, 42, 8)]  # type: ignore[arg-type]
    return hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_golden_tasks_for_seed_42(split: str) -> None:
    assert digest(MathAnswer(), split) == GOLDEN[split]


@pytest.mark.parametrize("difficulty", [1, 3, 5])
def test_every_difficulty_yields_200_train_and_64_heldout_tasks_with_exact_answers(difficulty: int) -> None:
    env = MathAnswer({"difficulty": difficulty})
    tasks = env.tasks("train", 7, 200) + env.tasks("heldout", 7, 64)
    assert len({env.prompt_text(t) for t in tasks}) == 264
    families = {t.data["family"] for t in tasks}
    assert families == {"leftover", "temperature", "sharing", "shopping", "linear_equation", "mean"}
    answers = [t.data["answer"] for t in tasks]
    assert any(a.startswith("-") for a in answers)
    assert any("/" in a for a in answers)
    assert any("." in a for a in answers)


def test_difficulty_grows_the_numbers() -> None:
    def largest(difficulty: int) -> float:
        tasks = MathAnswer({"difficulty": difficulty}).tasks("train", 1, 60)
        return max(abs(float(Fraction(t.data["answer"]))) for t in tasks if t.data["family"] == "leftover")

    assert largest(1) < largest(3) < largest(5)


def test_exact_text_is_canonical() -> None:
    assert exact_text(Fraction(6, 3), "fraction") == "2"
    assert exact_text(Fraction(-7, 4), "fraction") == "-7/4"
    assert exact_text(Fraction(1250, 100), "decimal") == "12.5"
    assert exact_text(Fraction(-5, 100), "decimal") == "-0.05"


def test_bounds_are_enforced() -> None:
    with pytest.raises(InvalidParameters, match="difficulty=6 .* less than or equal to 5"):
        MathAnswer({"difficulty": 6})


GSM8K = [
    {"question": f"Tom has {n} apples and buys {n + 3} more. How many apples now?",
     "answer": f"He has {n} + {n + 3} = {2 * n + 3}.\n#### {2 * n + 3:,}"}
    for n in range(1, 300, 3)
]
MATH = [
    {"problem": f"Compute $\\frac{{{n}}}{{{n + 1}}} + \\frac{{1}}{{{n + 1}}}$.", "solution": "It is $\\boxed{1}$."}
    for n in range(1, 40)
] + [{"problem": "What day follows Sunday?", "solution": "It is $\\boxed{\\text{Monday}}$."}]


def write_jsonl(path: Path, records: list[dict[str, str]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_gsm8k_and_math_files_become_tasks(tmp_path: Path) -> None:
    env = MathAnswer({"data": write_jsonl(tmp_path / "mixed.jsonl", GSM8K + MATH)})
    tasks = env.tasks("train", 0, 80) + env.tasks("heldout", 0, 10)
    by_question = {t.data["question"]: t.data for t in tasks}
    gsm = by_question.get(GSM8K[-1]["question"]) or next(d for d in by_question.values() if d["source"] == "gsm8k")
    assert gsm["answer"].isdigit()  # "1,234" in the file -> "1234"
    assert {d["source"] for d in by_question.values()} == {"gsm8k", "math"}
    assert all(d["answer"] == "1" for d in by_question.values() if d["source"] == "math" and "Compute" in d["question"])


def test_reordering_the_file_changes_nothing_and_editing_it_changes_the_draws(tmp_path: Path) -> None:
    original = MathAnswer({"data": write_jsonl(tmp_path / "a.jsonl", GSM8K)})
    reordered = MathAnswer({"data": write_jsonl(tmp_path / "b.jsonl", list(reversed(GSM8K)))})
    edited = MathAnswer({"data": write_jsonl(tmp_path / "c.jsonl", GSM8K[:-1])})
    for split in ("train", "heldout"):
        first = [t.data for t in original.tasks(split, 5, 10)]  # type: ignore[arg-type]
        assert first == [t.data for t in reordered.tasks(split, 5, 10)]  # type: ignore[arg-type]
        assert first != [t.data for t in edited.tasks(split, 5, 10)]  # type: ignore[arg-type]
    # the split of a record is decided by its content: it is the same in the edited file
    heldout = {t.data["question"] for t in original.tasks("heldout", 5, 10)}
    assert not heldout & {t.data["question"] for t in edited.tasks("train", 5, 40)}


def test_file_tasks_are_the_same_under_another_hash_seed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", GSM8K)
    code = (
        "import hashlib, json; from nodus_env_math_answer import MathAnswer; "
        f"e = MathAnswer({{'data': {path!r}}}); "
        "print(json.dumps([t.data for t in e.tasks('train', 3, 12)]))"
    )
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "q", "answer": "a"}\nnot json\n', r"bad.jsonl:1: the GSM8K 'answer' does not end in '####"),
        ('\n\n{"question": "q", "answer": "#### 5"}\nnot json\n', r"bad.jsonl:4: not valid JSON"),
        ('[1, 2]\n', r"bad.jsonl:1: a JSON list, not an object"),
        ('{"problem": "p", "solution": "no box"}\n', r"bad.jsonl:1: the MATH 'solution' has no \\boxed"),
        ('{"prompt": "p"}\n', r"bad.jsonl:1: unknown record form \(keys: prompt\)"),
        ("\n", r"bad.jsonl: the problem file has no records"),
    ],
)
def test_a_bad_file_is_a_one_line_error_naming_file_line_and_fix(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "bad.jsonl").write_text(content)
    env = MathAnswer({"data": str(tmp_path / "bad.jsonl")})
    with pytest.raises(DataFileError, match=message) as raised:
        env.tasks("train", 0, 1)
    assert isinstance(raised.value, NodusError)
    assert "\n" not in str(raised.value) and "each line must be a JSON object" in str(raised.value)


def test_a_missing_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"nope.jsonl: cannot read the problem file .* --param data=path.jsonl"):
        MathAnswer({"data": str(tmp_path / "nope.jsonl")}).tasks("train", 0, 1)
