"""The conformance runner: the properties every environment must have, checked on sampled tasks.

``run_checks(env, examples)`` never raises for a misbehaving environment: every problem becomes a failed
row with its first counterexample, so ``grpo check`` can print all of them at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from nodus.core.environment import SPLITS, Environment, Task
from nodus.core.testing import determinism, rows
from nodus.core.testing.jsondata import json_problem
from nodus.core.testing.outcomes import GradeFn, error_text
from nodus.core.testing.probes import Mutable, build_probes, grade_probes, has_mutations
from nodus.core.testing.report import CheckReport, CheckResult
from nodus.sandbox.limits import SandboxLimits
from nodus.sandbox.outcome import summary_line

__all__ = ["GRADING_CHECKS", "Mutable", "run_checks", "wall_time_limit"]

DEFAULT_SEED = 42
# What a grade gets when the environment's own sandbox_limits are invalid: the sandbox's default.
DEFAULT_WALL_TIME_S: float = SandboxLimits.model_fields["wall_time_s"].default

GRADING_CHECKS = (
    "reference_scores_1",
    "mutations_score_below_1",
    "grade_in_range_never_raises",
    "grade_deterministic",
    "grade_within_time_limit",
)


def run_checks(
    env: Environment, examples: int = 16, grade_fn: GradeFn | None = None, seed: int = DEFAULT_SEED
) -> CheckReport:
    """Check ``env`` on ``examples`` sampled tasks (half from each split, at least one each).

    ``grade_fn(env, [(task, completion), ...])`` grades a batch and returns Grade-like results (a
    :class:`Grade` or the sandbox's result dict); by default grading runs in-process, within the sandbox's
    wall-time limit and checked as the sandbox checks a result.
    """
    per_split = max(1, (examples + 1) // 2)
    results = [_check_generation(env, seed, per_split)]
    try:
        tasks = env.tasks("train", seed, per_split) + env.tasks("heldout", seed, per_split)
    except (Exception, SystemExit) as error:
        reason = f"not run: task generation raised {error_text(error)}"
        names = ["disjoint_splits", "task_data_survives_json", *GRADING_CHECKS]
        return CheckReport(env.id_text(), (*results, *(CheckResult(name, False, 0, reason) for name in names)))
    results.append(_guarded("disjoint_splits", lambda: _check_disjoint(env, seed, per_split)))
    results.append(_guarded("task_data_survives_json", lambda: _check_json(tasks)))
    limit, limit_problem = _limit(env)
    try:
        probes, problems = build_probes(env, tasks, seed)
        graded, left = grade_probes(env, probes, grade_fn, limit)
    except (Exception, SystemExit) as error:  # a bug of ours or a very odd environment: still rows, not a traceback
        reason = f"not run: grading raised {error_text(error)}"
        return CheckReport(env.id_text(), (*results, *(CheckResult(name, False, 0, reason) for name in GRADING_CHECKS)))
    results += [
        rows.reference_row(graded, problems, left, limit),
        rows.mutation_row(graded, problems, has_mutations(env), left),
        rows.range_row(graded, left),
        _guarded("grade_deterministic", lambda: rows.determinism_row(env, graded, grade_fn, examples, limit)),
        rows.time_row(graded, limit, limit_problem, left),
    ]
    return CheckReport(env.id_text(), tuple(results))


def wall_time_limit(env: Environment) -> float:
    """The wall-clock seconds the sandbox gives one grading job of ``env`` (ValueError for invalid limits)."""
    return SandboxLimits.for_environment(env.sandbox_limits).wall_time_s


def _limit(env: Environment) -> tuple[float, str | None]:
    """The wall-time limit, or the default and the one-line reason when the environment's sandbox_limits are
    invalid (``grpo check`` refuses them before grading; in-process they fail the time row)."""
    try:
        return wall_time_limit(env), None
    except (ValueError, TypeError, AttributeError) as error:
        return DEFAULT_WALL_TIME_S, f"sandbox_limits: {summary_line(str(error), 300)}"


def _guarded(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    try:
        return check()
    except (Exception, SystemExit) as error:
        return CheckResult(name, False, 0, f"not run: the check raised {error_text(error)}")


def _check_generation(env: Environment, seed: int, count: int) -> CheckResult:
    name = "deterministic_generation"
    try:
        first = determinism.task_rows(env, seed, count)
        second = determinism.task_rows(env, seed, count)
    except (Exception, SystemExit) as error:
        return CheckResult(name, False, 0, f"seed {seed}: generation raised {error_text(error)}")
    if determinism.digest(second) != determinism.digest(first):
        where = determinism.first_difference(first, second)
        counter = (
            f"seed {seed}: two calls in one process gave different tasks, first at {where}: generate() uses state "
            "besides its rng and parameters (the global random module, a counter, the clock)"
        )
        return CheckResult(name, False, 2 * count, counter)
    if determinism.class_path(env) is None:
        return CheckResult(name, True, 2 * count, note="subprocess comparison skipped: class not importable")
    try:
        others = determinism.rows_in_subprocesses(env, seed, count)
    except Exception as error:
        return CheckResult(name, False, 2 * count, f"seed {seed}: {summary_line(str(error), 300)}")
    (seed_a, a), *rest = others.items()
    for seed_b, b in rest:
        if determinism.digest(b) != determinism.digest(a):
            where = determinism.first_difference(a, b)
            counter = (
                f"seed {seed}: PYTHONHASHSEED={seed_a} and {seed_b} in two subprocesses gave different tasks, "
                f"first at {where}; {determinism.USUAL_CAUSES}"
            )
            return CheckResult(name, False, 2 * count, counter)
    if determinism.digest(a) != determinism.digest(first):  # a true finding, though this process's seed may differ
        here = os.environ.get("PYTHONHASHSEED", "random")
        where = determinism.first_difference(first, a)
        counter = (
            f"seed {seed}: this process (PYTHONHASHSEED={here}) and fresh ones gave different tasks, first at {where}: "
            f"generate() depends on str hashes or on state besides its rng and parameters; {determinism.USUAL_CAUSES}"
        )
        return CheckResult(name, False, 2 * count, counter)
    return CheckResult(name, True, 2 * count)


def _check_disjoint(env: Environment, seed: int, count: int) -> CheckResult:
    name = "disjoint_splits"
    by_split = {split: env.tasks(split, seed, count) for split in SPLITS}
    # Neither a prompt nor a problem (the split key, when an environment overrides it) may appear twice.
    seen: dict[tuple[str, str], str] = {}
    for split, tasks in by_split.items():
        for task in tasks:
            if task.split != split:
                return CheckResult(name, False, 2 * count, f"task {task.id} of {split} says split={task.split}")
            for kind, value in (("prompt", env.prompt_text(task)), ("split key", env.split_key(task))):
                if (kind, value) in seen:
                    return CheckResult(
                        name, False, 2 * count, f"task {task.id} repeats the {kind} of {seen[kind, value]}"
                    )
                seen[kind, value] = task.id
    return CheckResult(name, True, 2 * count)


def _check_json(tasks: list[Task]) -> CheckResult:
    """The sandbox grades a task rebuilt from JSON: data that changes on the way grades differently there."""
    for task in tasks:
        problem = json_problem(task.data)
        if problem:
            return CheckResult("task_data_survives_json", False, len(tasks), f"task {task.id}: {problem}")
    return CheckResult("task_data_survives_json", True, len(tasks))
