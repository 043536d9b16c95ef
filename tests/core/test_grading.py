"""Grading through the real sandbox: what a completion is charged for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from nodus.core import load_environment
from nodus.core.grading import Grader
from nodus.sandbox.outcome import summary_line


@pytest.mark.parametrize("env_id", ["test/letters@1", "math-answer@1"])
def test_loading_the_grader_is_not_charged_to_the_first_completion(env_id: str) -> None:
    """A fresh worker loads the environment (plugin discovery, math-verify's import: about a second) before the
    first job's wall-time limit starts. It used to count, so a correct answer scored 0 ("grading exceeded 0.3s")."""
    env = load_environment(env_id)
    task = env.task("heldout", 42, 0)
    with Grader(env, limits={"wall_time_s": 0.3, "cpu_time_s": 1}, workers=1) as grader:
        (outcome,) = grader.grade([(task, env.reference(task))])
    assert (outcome.status, outcome.score, outcome.passed) == ("graded", 1.0, True), outcome.details


def test_a_second_in_process_environment_under_the_same_id_grades_with_its_own_function() -> None:
    """train_on_function twice under one name (a notebook): the second run was graded by the first's reward."""
    from nodus.core.function_env import function_environment

    prompts = [f"Task {i}" for i in range(40)]
    for value in (0.25, 0.75):
        env = function_environment("same-name", prompts, lambda prompt, completion, value=value: value)
        task = env.tasks("train", 42, 1)[0]
        with Grader(env, sandbox="none", workers=1) as grader, pytest.warns(UserWarning):
            (outcome,) = grader.grade([(task, "anything")])
        assert outcome.score == value


@pytest.mark.parametrize(
    ("completion", "summary"),
    [
        (
            "RETURN-FLOAT",
            "TypeError: Letters.grade returned float, not a Grade: return nodus.core.Grade(score=..., passed=..., "
            "details=...)",
        ),
        # pydantic's own last line was only a link to its docs: the model, field, rule and input are what matter.
        (
            "SCORE-1.5",
            "ValidationError: 1 validation error for Grade score Input should be less than or equal to 1 "
            "[type=less_than_equal, input_value=1.5, input_type=float]",
        ),
    ],
)
def test_an_authors_grade_mistake_is_named_in_the_sandboxs_one_line(completion: str, summary: str) -> None:
    env = load_environment("test/letters@1")
    with Grader(env, workers=1) as grader:
        (outcome,) = grader.grade([(env.tasks("train", 0, 1)[0], completion)])
    assert outcome.is_infrastructure_failure and outcome.reason == "grader_error"
    assert summary_line(outcome.details) == summary


def test_a_plugin_the_sandbox_cannot_import_is_one_line_before_any_grading(tmp_path: Path) -> None:
    """A plugin on PYTHONPATH is listed here but missing in the jail: every job failed, each saying to pip install
    it from the registry (a name that may be a squatter's)."""
    source = Path(__file__).resolve().parents[1] / "fixtures" / "toy_env" / "nodus_env_toy" / "__init__.py"
    package = tmp_path / "nodus_env_elsewhere"
    package.mkdir()
    (package / "__init__.py").write_text(source.read_text().replace('namespace = "test"', 'namespace = "elsewhere"'))
    info = tmp_path / "nodus_env_elsewhere-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nodus-env-elsewhere\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[nodus]\nelsewhere = nodus_env_elsewhere\n")
    grpo = Path(sys.executable).with_name("grpo")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    command = [str(grpo), "grade", "--env", "elsewhere/letters@1", "--split", "train", "--index", "0", "--reference"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"grpo: error: elsewhere/letters@1 is loaded from {package}, which the sandbox does not mount (only this "
        f"interpreter's site-packages and the editable installs in it); install its distribution into {sys.prefix} "
        "(pip install -e for a checkout) rather than through PYTHONPATH or --user, or grade it in this process with "
        "sandbox 'none' (trusted code only)"
    )
    trusted = subprocess.run([*command, "--sandbox", "none"], capture_output=True, text=True, env=env, timeout=300)
    assert trusted.returncode == 0 and "score 1.000" in trusted.stdout, trusted.stderr
