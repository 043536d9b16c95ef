from __future__ import annotations

import pytest
from nodus.core import Environment, Grade, Task
from nodus.core.testing import GRADING_CHECKS, CheckReport, assert_conforms, determinism, run_checks, wall_time_limit
from nodus.core.testing.outcomes import error_text, outcome_of
from nodus.core.testing.probes import CHUNK, build_probes
from pydantic import ValidationError

from tests.testing import envs

ALL_CHECKS = ["deterministic_generation", "disjoint_splits", "task_data_survives_json", *GRADING_CHECKS]


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
        (envs.HashSeededParrot(), "deterministic_generation", "PYTHONHASHSEED=0 and 1 in two subprocesses gave"),
        # picks list(set_of_words)[0]: seeds 0 and 4242 agree on it, 0 and 1 do not; fixed seeds, so every run
        (envs.SetOrderParrot(), "deterministic_generation", "PYTHONHASHSEED=0 and 1 in two subprocesses gave"),
        (envs.CheckedOverScoringParrot(), "grade_in_range_never_raises", "reference_twice '95180\\n95180': raised "
         "ValidationError: Grade: score: Input should be less than or equal to 1 (got 1.5)"),
        (envs.IntKeyParrot(), "task_data_survives_json", "data['digits'] has the int key 0, which JSON turns into"),
        (envs.RaisingParrot(), "grade_in_range_never_raises", "raised ValueError: cannot handle NUL"),
        (envs.ExitingParrot(), "grade_in_range_never_raises", "raised SystemExit: 3"),
        (envs.OverScoringParrot(), "grade_in_range_never_raises", "grader returned score=1.5, outside [0, 1]"),
        (envs.DictParrot(), "grade_in_range_never_raises", "whitespace ' \\n\\t\\r\\n ': returned dict, not a Grade"),
        (envs.WrongReferenceParrot(), "reference_scores_1", "scored 0.0 (passed=False): different"),
        (envs.RaisingReferenceParrot(), "reference_scores_1", "task train-42-0: reference() raised KeyError: 'answer'"),
        (envs.MoodyParrot(), "grade_deterministic", "then score 0.0"),
        (envs.SlowParrot(), "grade_within_time_limit", "timed out at the 0.05 s wall-time limit"),
        (envs.HangingParrot(), "grade_within_time_limit", "timed out at the 0.2 s wall-time limit"),
        (envs.TypoLimitsParrot(), "grade_within_time_limit", "wal_time_s: Extra inputs are not permitted"),
        (envs.PlainParrot(), "mutations_score_below_1", "the environment has no mutations(task) method; add one "
         "returning wrong-but-close completions that must score below 1, e.g. def mutations(self, task): return "
         "[str(task.data['answer'] + 1)]"),
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


def test_a_difference_between_processes_names_the_field_and_the_usual_causes() -> None:
    # It said only "PYTHONHASHSEED=0 and 1 in two subprocesses gave different tasks", and the author had to hunt.
    counterexample = run_checks(envs.SetOrderParrot(), examples=2).row("deterministic_generation").counterexample
    assert counterexample == (
        "seed 42: PYTHONHASHSEED=0 and 1 in two subprocesses gave different tasks, first at task train-42-0 (draw 0) "
        "data['word']: 'alpha' vs 'echo'; the usual causes are iterating over a set (sort it first, or use a list) "
        "and hash() of a str (use hashlib)"
    )


def test_a_set_pick_that_hash_seeds_0_and_1_agree_on_is_caught_in_every_run() -> None:
    # PYTHONHASHSEED 0 and 1 both put "alpha" first of the eight Greek letters: with only those two seeds, the
    # check caught it only when this process's random seed happened to differ.
    rows = determinism.rows_in_subprocesses(envs.GreekSetOrderParrot(), 42, 1)
    assert len({determinism.digest(seed_rows) for seed_rows in rows.values()}) > 1
    counterexample = run_checks(envs.GreekSetOrderParrot(), examples=2).row("deterministic_generation").counterexample
    assert "in two subprocesses gave different tasks, first at task train-42-0 (draw 0) data['word']: 'alpha' vs" in (
        counterexample or ""
    )


def test_a_validation_error_says_which_field_broke_which_rule() -> None:
    with pytest.raises(ValidationError) as raised:
        Grade(score=1.5, passed=True, details="")
    expected = "ValidationError: Grade: score: Input should be less than or equal to 1 (got 1.5)"
    assert error_text(raised.value) == expected


def test_a_warm_up_the_sandbox_would_not_wait_for_fails_in_process_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # It passed here (pytest) and then failed `grpo check` minutes later, as a hung worker, naming the wall time.
    from nodus.core.testing import outcomes
    from nodus.sandbox.worker import PREPARE_TOO_SLOW

    monkeypatch.setattr(outcomes, "PREPARE_LIMIT_S", 0.3)  # the sandbox's 12 s, shrunk for the test
    row = run_checks(envs.SlowToWarmUpParrot(), examples=2).row("reference_scores_1")
    assert not row.passed and PREPARE_TOO_SLOW in str(row.counterexample)
    broken = run_checks(envs.BrokenWarmUpParrot(), examples=2).row("reference_scores_1")
    assert not broken.passed and "warm_up() raised ImportError: No module named 'big_library'" in str(
        broken.counterexample
    )


def test_generate_returning_a_list_fails_generation_saying_so() -> None:
    row = run_checks(envs.ListParrot(), examples=2).row("deterministic_generation")
    assert row.counterexample == (
        "seed 42: generation raised TaskGenerationError: ListParrot.generate() returned a list, not a dict; return "
        "the task's data as a dict of JSON values, e.g. {'numbers': [3, 1, 2]}"
    )


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
    *first_pass, regrade = batches  # chunks of CHUNK, so timeouts are counted between them; then one regrade
    assert max(first_pass) == CHUNK and sum(first_pass) == report.row("grade_in_range_never_raises").examples
    assert regrade == report.row("grade_deterministic").examples


def test_a_grade_fn_that_raises_fails_the_grading_rows_without_raising() -> None:
    def broken(env: Environment, pairs: list[tuple[Task, str]]) -> list[Grade]:
        raise ConnectionError("pool is down")

    report = run_checks(envs.Parrot(), examples=2, grade_fn=broken)
    assert failing(report) == [
        "reference_scores_1", "mutations_score_below_1", "grade_in_range_never_raises", "grade_deterministic"
    ]
    assert "grade_fn raised ConnectionError: pool is down" in (report.row("reference_scores_1").counterexample or "")
    # Nothing graded cleanly, so nothing was regraded: that is not "ok ... 0 examples".
    assert report.row("grade_deterministic").counterexample == (
        "not run: every completion raised, timed out or met an infrastructure failure, so none was regraded"
    )


def test_the_machines_failures_are_excused_for_hostile_input_but_never_pass_a_reference() -> None:
    def down(env: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, object]]:
        details = "nsjail could not start a jail\n(exit 255)"
        return [{"status": "infrastructure_failure", "reason": "sandbox_start_failed", "details": details}] * len(pairs)

    report = run_checks(envs.Parrot(), examples=2, grade_fn=down)
    assert failing(report) == ["reference_scores_1", "mutations_score_below_1", "grade_deterministic"]
    assert report.row("reference_scores_1").counterexample == (
        "task train-42-0, reference '95180': "
        "infrastructure failure, not the grader's (sandbox_start_failed): nsjail could not start a jail"
    )


def test_a_grader_error_in_the_sandbox_fails_the_range_row_even_when_it_is_every_input() -> None:
    # It used to pass as "infrastructure": a grader that raised on every input showed ok grade_in_range_never_raises.
    traceback = 'Traceback (most recent call last):\n  File "/x/grader.py", line 9\n    1 / x\nZeroDivisionError: x\n'

    def raising(env: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, object]]:
        reply = {"status": "infrastructure_failure", "reason": "grader_error", "details": traceback, "attempts": 3}
        return [reply] * len(pairs)

    report = run_checks(envs.Parrot(), examples=2, grade_fn=raising)
    assert failing(report) == [
        "reference_scores_1", "mutations_score_below_1", "grade_in_range_never_raises", "grade_deterministic"
    ]
    assert report.row("grade_in_range_never_raises").counterexample == (
        "task train-42-0, reference '95180': raised ZeroDivisionError: x"
    )


def test_timed_out_probes_are_never_regraded_and_grading_stops_after_three_timeouts() -> None:
    seen: list[str] = []

    def hanging_on_nul(env: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, object]]:
        seen.extend(text for _, text in pairs)
        timeout = {"status": "graded", "score": 0.0, "passed": False, "details": "exceeded", "reason": "timeout"}
        return [timeout if "\x00" in text else sandbox_like(env, [(task, text)])[0] for task, text in pairs]

    report = run_checks(envs.Parrot(), examples=4, grade_fn=hanging_on_nul)
    assert failing(report) == ["grade_within_time_limit"]
    row = report.row("grade_within_time_limit")
    assert row.counterexample is not None and row.counterexample.endswith(": timed out at the 10 s wall-time limit")
    graded = report.row("grade_in_range_never_raises").examples
    env = envs.Parrot()
    probes, _ = build_probes(env, env.tasks("train", 42, 2) + env.tasks("heldout", 42, 2), 42)
    assert row.note == f"3 of {graded} timed out; {len(probes) - graded} not graded: grading stopped after 3 timeouts"
    assert len([text for text in seen if "\x00" in text]) == 3  # graded once each, never again


def test_grading_stops_after_three_jobs_that_killed_their_sandbox_worker() -> None:
    # With a memory cgroup, a grader allocating 2 GB on NUL kills its worker: the pool tries three fresh ones.
    def oom_on_nul(env: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, object]]:
        died = {"status": "infrastructure_failure", "reason": "worker_died", "details": "peer closed the channel",
                "attempts": 3}
        return [died if "\x00" in text else sandbox_like(env, [(task, text)])[0] for task, text in pairs]

    report = run_checks(envs.Parrot(), examples=4, grade_fn=oom_on_nul)
    assert failing(report) == ["grade_in_range_never_raises"]
    row = report.row("grade_in_range_never_raises")
    assert (row.counterexample or "").endswith(
        ": killed its sandbox worker on each of 3 attempts (over memory_mb, or crashed the interpreter): "
        "peer closed the channel"
    )
    assert row.note.endswith(" not graded: grading stopped after 3 timeouts or killed workers")
    assert report.row("grade_within_time_limit").note.startswith("slowest ")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"score": 2.0, "passed": True, "details": ""}, "invalid grader result: grader returned score=2.0, outside"),
        ({"score": float("nan"), "passed": True}, "invalid grader result: grader returned score=nan, expected a"),
        ({"score": True, "passed": True, "details": ""}, "grader returned score=True, expected a finite number"),
        ({"score": 1.0, "passed": "yes", "details": ""}, "grader returned passed='yes', expected bool"),
        (None, "invalid grader result: grader returned NoneType, expected dict"),
        # In-process graders used to pass with these: the kit checked no Grade instance (the sandbox does).
        (Grade.model_construct(score=1.5, passed=True, details=""), "grader returned score=1.5, outside [0, 1]"),
        (Grade.model_construct(score=-1.0, passed=False, details=""), "grader returned score=-1.0, outside [0, 1]"),
        (Grade.model_construct(score=0.5, passed=1, details=""), "grader returned passed=1, expected bool"),
        (Grade.model_construct(score=0.0, passed=False, details=None), "details of type NoneType, expected str"),
    ],
)
def test_malformed_results_become_errors_as_the_sandbox_worker_judges_them(value: object, problem: str) -> None:
    outcome = outcome_of(value, 0.0)
    assert outcome.error is not None and problem in outcome.error, outcome.error


@pytest.mark.parametrize(
    ("reply", "error", "timed_out", "excused"),
    [
        ({"reason": "grader_error", "details": "Traceback (most recent call last):\n  ...\nSystemExit: 3\n"},
         "raised SystemExit: 3", False, False),
        ({"reason": "grader_error", "details": "invalid grader result: grader returned score=1.5, outside [0, 1]"},
         "invalid grader result: grader returned score=1.5, outside [0, 1]", False, False),
        # A job that brought down a fresh worker on every attempt: with a memory cgroup, a grader over memory_mb.
        ({"reason": "worker_died", "attempts": 3, "details": "peer closed the channel; nsjail said: [E] killed"},
         "killed its sandbox worker on each of 3 attempts (over memory_mb, or crashed the interpreter): "
         "peer closed the channel; nsjail said: [E] killed", False, False),
        ({"reason": "worker_timeout", "details": "timed out waiting for a frame", "attempts": 3}, None, True, False),
        ({"reason": "sandbox_start_failed", "details": "no nsjail"}, None, False, True),
        ({"reason": "pool_closed", "details": "pool closed"}, None, False, True),
    ],
)
def test_sandbox_failures_are_the_graders_unless_the_machine_failed(
    reply: dict[str, object], error: str | None, timed_out: bool, excused: bool
) -> None:
    outcome = outcome_of({"status": "infrastructure_failure", **reply}, 0.0)
    assert (outcome.error, outcome.timed_out, outcome.infrastructure) == (error, timed_out, excused)


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
