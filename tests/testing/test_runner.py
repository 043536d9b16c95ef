from __future__ import annotations

import pytest
from nodus.core import Environment, Grade, Task
from nodus.core.testing import GRADING_CHECKS, CheckReport, assert_conforms, run_checks, wall_time_limit
from nodus.core.testing.outcomes import outcome_of

from tests.testing import envs

ALL_CHECKS = ["deterministic_generation", "disjoint_splits", *GRADING_CHECKS]


def failing(report: CheckReport) -> list[str]:
    return [row.name for row in report.failures]


def test_a_conforming_environment_passes_every_check() -> None:
    report = run_checks(envs.Parrot(), examples=6)
    assert [row.name for row in report.rows] == ALL_CHECKS
    assert report.passed, report.summary()
    assert report.row("reference_scores_1").examples == 6
    assert report.row("mutations_score_below_1").examples == 12
    # every hostile input (1 MB ones included) was graded
    assert report.row("grade_in_range_never_raises").examples > 40
    assert "counterexample" not in report.summary()


@pytest.mark.parametrize(
    ("env", "broken", "evidence"),
    [
        (envs.GlobalRandomParrot(), "deterministic_generation", "two calls in one process gave different tasks"),
        (envs.HashSeededParrot(), "deterministic_generation", "PYTHONHASHSEED=4242 in a subprocess"),
        (envs.RaisingParrot(), "grade_in_range_never_raises", "raised ValueError: cannot handle NUL"),
        (envs.WrongReferenceParrot(), "reference_scores_1", "scored 0.0 (passed=False): different"),
        (envs.MoodyParrot(), "grade_deterministic", "then score 0.0"),
        (envs.SlowParrot(), "grade_within_time_limit", "over the 0.05 s wall-time limit"),
        (envs.PlainParrot(), "mutations_score_below_1", "no mutations(task) -> list[str] method"),
        (envs.ForgetfulParrot(), "mutations_score_below_1", "returned no completions"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Environment) else "",
)
def test_each_broken_property_fails_its_own_row_with_a_counterexample(
    env: Environment, broken: str, evidence: str
) -> None:
    report = run_checks(env, examples=4)
    assert failing(report) == [broken]
    counterexample = report.row(broken).counterexample
    assert counterexample is not None and evidence in counterexample, counterexample


def test_a_gullible_grader_fails_the_mutation_check_on_a_named_task() -> None:
    report = run_checks(envs.GullibleParrot(), examples=4)
    assert failing(report) == ["reference_scores_1"] or failing(report) == ["mutations_score_below_1"]
    assert report.row("mutations_score_below_1").counterexample.startswith("task train-42-0, mutation 0")  # type: ignore[union-attr]


def test_assert_conforms_raises_with_the_table() -> None:
    with pytest.raises(AssertionError, match=r"(?s)FAIL reference_scores_1 .*first counterexample: task train-42-0"):
        assert_conforms(envs.WrongReferenceParrot(), examples=2)


def test_an_environment_defined_in_a_function_skips_only_the_subprocess_comparison() -> None:
    class LocalParrot(envs.Parrot):
        pass

    row = run_checks(LocalParrot(), examples=2).row("deterministic_generation")
    assert row.passed and "subprocess comparison skipped" in row.note


def sandbox_like(env: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, object]]:
    """A grade_fn in the form the sandbox returns: result dicts, not Grade objects."""
    return [{"status": "graded", "reason": "x", **env.grade(task, text).model_dump()} for task, text in pairs]


def test_a_caller_grade_fn_receives_batches_and_may_return_sandbox_dicts() -> None:
    batches: list[int] = []

    def counting(env: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, object]]:
        batches.append(len(pairs))
        return sandbox_like(env, pairs)

    report = run_checks(envs.Parrot(), examples=4, grade_fn=counting)
    assert report.passed, report.summary()
    assert len(batches) == 2 and batches[0] == report.row("grade_in_range_never_raises").examples


def test_a_grade_fn_that_raises_fails_the_grading_rows_without_raising() -> None:
    def broken(env: Environment, pairs: list[tuple[Task, str]]) -> list[Grade]:
        raise ConnectionError("pool is down")

    report = run_checks(envs.Parrot(), examples=2, grade_fn=broken)
    assert failing(report) == ["reference_scores_1", "mutations_score_below_1", "grade_in_range_never_raises"]
    assert "grade_fn raised ConnectionError: pool is down" in (report.row("reference_scores_1").counterexample or "")


def test_infrastructure_failures_are_allowed_for_hostile_input_but_never_pass_a_reference() -> None:
    def flaky(env: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, object]]:
        return [{"status": "infrastructure_failure", "reason": "crash", "details": "worker died"} for _ in pairs]

    report = run_checks(envs.Parrot(), examples=2, grade_fn=flaky)
    assert failing(report) == ["reference_scores_1", "mutations_score_below_1"]
    assert "infrastructure failure: worker died" in (report.row("reference_scores_1").counterexample or "")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"score": 2.0, "passed": True, "details": ""}, "score 2.0 outside [0, 1]"),
        ({"score": float("nan"), "passed": True, "details": ""}, "not a finite number"),
        ({"score": True, "passed": True, "details": ""}, "not a finite number"),
        ({"score": 1.0, "passed": "yes", "details": ""}, "returned dict"),
        (None, "not a finite number"),
    ],
)
def test_malformed_results_become_errors(value: object, problem: str) -> None:
    outcome = outcome_of(value, 0.0)
    assert outcome.error is not None and problem in outcome.error


def test_a_sandbox_timeout_counts_as_over_the_time_limit() -> None:
    outcome = outcome_of({"status": "graded", "score": 0.0, "passed": False, "details": "", "reason": "timeout"}, 1.0)
    assert outcome.timed_out and outcome.error is None


def test_the_time_limit_is_the_sandbox_wall_time_of_the_environment() -> None:
    assert wall_time_limit(envs.SlowParrot()) == 0.05
    assert wall_time_limit(envs.Parrot()) == 10.0


def test_the_report_serialises_every_row() -> None:
    payload = run_checks(envs.WrongReferenceParrot(), examples=2).to_dict()
    assert payload["env"] == "test/parrot@1" and payload["passed"] is False
    assert [row["name"] for row in payload["rows"]] == ALL_CHECKS
    assert {"name", "passed", "examples", "counterexample", "note"} == set(payload["rows"][0])
