import json
from pathlib import Path

from nodus.core.testing import assert_conforms
from nodus_env_math_answer import MathAnswer


def test_built_in_tasks_pass_the_conformance_kit() -> None:
    assert_conforms(MathAnswer({"difficulty": 3}), examples=8)


def test_file_tasks_pass_the_conformance_kit(tmp_path: Path) -> None:
    records = [
        {"question": f"What is {n} times 7?", "answer": f"{n} * 7 = {7 * n}\n#### {7 * n:,}"} for n in range(300)
    ]
    records += [{"problem": "Simplify $\\sqrt{12}$.", "solution": "$\\boxed{2\\sqrt{3}}$"}]
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert_conforms(MathAnswer({"data": str(path)}), examples=6)
