import json
from pathlib import Path

import pytest
from nodus.core.testing import assert_conforms
from nodus_env_unit_tests import UnitTests
from unit_tests_samples import HUMANEVAL, MBPP

pytestmark = pytest.mark.usefixtures("fast_programs")


def test_built_in_tasks_pass_the_conformance_kit() -> None:
    report = assert_conforms(UnitTests({"time_limit_s": 2.0}), examples=4)
    assert report.row("mutations_score_below_1").examples == 4 * 9  # a broken return and 8 reward hacks


def test_file_tasks_pass_the_conformance_kit(tmp_path: Path) -> None:
    # Enough distinct prompts that both splits have a few: the samples, each in several variants.
    records = [
        {**record, "prompt": f"# variant {copy}\n{record['prompt']}"} for copy in range(12) for record in HUMANEVAL
    ]
    records += [{**record, "text": f"{record['text']} (variant {copy})"} for copy in range(12) for record in MBPP]
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert_conforms(UnitTests({"data": str(path), "time_limit_s": 2.0}), examples=4)
