"""The conformance runner: the properties every environment must have, checked on sampled tasks.

``run_checks(env, examples)`` never raises for a misbehaving environment: every problem becomes a failed
row with its first counterexample, so ``grpo check`` can print all of them at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nodus.core.environment import SPLITS, Environment, Task
from nodus.core.testing import determinism
from nodus.core.testing.completions import HOSTILE, huge_completions, near_misses, random_text
from nodus.core.testing.outcomes import GradeFn, Outcome, grade_batch
from nodus.core.testing.report import CheckReport, CheckResult

DEFAULT_SEED = 42
DEFAULT_WALL_TIME_S = 10.0


@runtime_checkable
class Mutable(Protocol):
    """An environment that can break its own reference answers (the optional ``mutations`` method)."""

    def mutations(self, task: Task) -> list[str]:
        """Completions close to the reference that must score below 1: a swapped color, a changed digit..."""
        ...


@dataclass(frozen=True)
class Probe:
    task: Task
    label: str
    completion: str
    kind: str  # "reference", "mutation" or "hostile"

    def describe(self) -> str:
        text = self.completion
        preview = repr(text[:60]) + (f"... ({len(text)} chars)" if len(text) > 60 else "")
        return f"task {self.task.id}, {self.label} {preview}"


def run_checks(
    env: Environment, examples: int = 16, grade_fn: GradeFn | None = None, seed: int = DEFAULT_SEED
) -> CheckReport:
    """Check ``env`` on ``examples`` sampled tasks (half from each split, at least one each).

    ``grade_fn(env, [(task, completion), ...])`` grades a batch and returns Grade-like results (a
    :class:`Grade` or the sandbox's result dict); by default grading runs in-process.
    """
    per_split = max(1, (examples + 1) // 2)
    rows = [_check_generation(env, seed, per_split)]
    try:
        tasks = env.tasks("train", seed, per_split) + env.tasks("heldout", seed, per_split)
    except Exception as error:
        reason = f"not run: task generation raised {type(error).__name__}: {error}"
        names = ["disjoint_splits", *GRADING_CHECKS]
        return CheckReport(env.id_text(), (*rows, *(CheckResult(name, False, 0, reason) for name in names)))
    rows.append(_check_disjoint(env, seed, per_split))
    probes, mutation_problems = _probes(env, tasks, seed)
    outcomes = grade_batch(env, [(p.task, p.completion) for p in probes], grade_fn)
    graded = list(zip(probes, outcomes, strict=True))
    rows.append(_reference_row(graded))
    rows.append(_mutation_row(graded, mutation_problems, isinstance(env, Mutable)))
    rows.append(_range_row(graded))
    rows.append(_determinism_row(env, graded, grade_fn, examples))
    rows.append(_time_row(graded, wall_time_limit(env)))
    return CheckReport(env.id_text(), tuple(rows))


GRADING_CHECKS = (
    "reference_scores_1",
    "mutations_score_below_1",
    "grade_in_range_never_raises",
    "grade_deterministic",
    "grade_within_time_limit",
)


def wall_time_limit(env: Environment) -> float:
    """The wall-clock seconds the sandbox gives one grading job of ``env``."""
    try:
        from nodus.sandbox.limits import SandboxLimits
    except ImportError:  # the sandbox package is optional for authoring; fall back to its default
        return float(env.sandbox_limits.get("wall_time_s", DEFAULT_WALL_TIME_S))
    return SandboxLimits.for_environment(env.sandbox_limits).wall_time_s


def _check_generation(env: Environment, seed: int, count: int) -> CheckResult:
    name = "deterministic_generation"
    try:
        first = determinism.fingerprint(env, seed, count)
        if determinism.fingerprint(env, seed, count) != first:
            return CheckResult(name, False, 2 * count, f"seed {seed}: two calls in one process gave different tasks")
    except Exception as error:
        return CheckResult(name, False, 0, f"seed {seed}: generation raised {type(error).__name__}: {error}")
    if determinism.class_path(env) is None:
        return CheckResult(name, True, 2 * count, note="subprocess comparison skipped: class not importable")
    try:
        other = determinism.fingerprint_in_subprocess(env, seed, count)
    except Exception as error:
        return CheckResult(name, False, 2 * count, f"seed {seed}: {error}")
    if other != first:
        return CheckResult(
            name,
            False,
            2 * count,
            f"seed {seed}: PYTHONHASHSEED={determinism.OTHER_HASH_SEED} in a subprocess gave different tasks",
        )
    return CheckResult(name, True, 2 * count)


def _check_disjoint(env: Environment, seed: int, count: int) -> CheckResult:
    name = "disjoint_splits"
    by_split = {split: env.tasks(split, seed, count) for split in SPLITS}
    prompts: dict[str, str] = {}
    for split, tasks in by_split.items():
        for task in tasks:
            prompt = env.prompt_text(task)
            if task.split != split:
                return CheckResult(name, False, 2 * count, f"task {task.id} of {split} says split={task.split}")
            if prompt in prompts:
                return CheckResult(name, False, 2 * count, f"task {task.id} repeats the prompt of {prompts[prompt]}")
            prompts[prompt] = task.id
    return CheckResult(name, True, 2 * count)


def _probes(env: Environment, tasks: list[Task], seed: int) -> tuple[list[Probe], list[str]]:
    rng = random.Random(seed)
    probes: list[Probe] = []
    problems: list[str] = []
    first_of_split: set[str] = set()
    for task in tasks:
        reference = env.reference(task)
        probes.append(Probe(task, "reference", reference, "reference"))
        if isinstance(env, Mutable):
            try:
                mutations = list(env.mutations(task))
            except Exception as error:
                problems.append(f"task {task.id}: mutations() raised {type(error).__name__}: {error}")
                mutations = []
            probes += [Probe(task, f"mutation {i}", text, "mutation") for i, text in enumerate(mutations)]
        hostile = near_misses(reference, rng) + [("random_text", random_text(rng))]
        if task.split not in first_of_split:  # the fixed corpus once per split; the huge inputs once in all
            hostile += list(HOSTILE) + (huge_completions(reference) if not first_of_split else [])
            first_of_split.add(task.split)
        probes += [Probe(task, label, text, "hostile") for label, text in hostile]
    return probes, problems


Graded = list[tuple[Probe, Outcome]]


def _first(graded: Iterable[tuple[Probe, Outcome]], bad: Callable[[Outcome], str | None]) -> str | None:
    for probe, outcome in graded:
        problem = bad(outcome)
        if problem:
            return f"{probe.describe()}: {problem}"
    return None


def _reference_row(graded: Graded) -> CheckResult:
    references = [(p, o) for p, o in graded if p.kind == "reference"]

    def bad(outcome: Outcome) -> str | None:
        if outcome.score == 1.0 and outcome.passed:
            return None
        return _what(outcome) or f"scored {outcome.score} (passed={outcome.passed}): {outcome.details[:120]}"

    counter = _first(references, bad)
    return CheckResult("reference_scores_1", counter is None, len(references), counter)


def _mutation_row(graded: Graded, problems: list[str], has_method: bool) -> CheckResult:
    name = "mutations_score_below_1"
    mutations = [(p, o) for p, o in graded if p.kind == "mutation"]
    if not has_method:
        return CheckResult(name, False, 0, "the environment has no mutations(task) -> list[str] method")
    if problems:
        return CheckResult(name, False, len(mutations), problems[0])
    if not mutations:
        return CheckResult(name, False, 0, "mutations(task) returned no completions for any sampled task")

    def bad(outcome: Outcome) -> str | None:
        if outcome.error or outcome.infrastructure:
            return _what(outcome)
        return f"scored {outcome.score}: {outcome.details[:120]}" if outcome.score == 1.0 else None

    counter = _first(mutations, bad)
    return CheckResult(name, counter is None, len(mutations), counter)


def _range_row(graded: Graded) -> CheckResult:
    counter = _first(graded, lambda outcome: outcome.error)
    return CheckResult("grade_in_range_never_raises", counter is None, len(graded), counter)


def _determinism_row(env: Environment, graded: Graded, grade_fn: GradeFn | None, examples: int) -> CheckResult:
    # Regrade every reference and mutation and a bounded number of hostile probes (never the huge ones:
    # they are slow and add nothing a short input does not).
    again = [(p, o) for p, o in graded if p.kind != "hostile"]
    hostile = [(p, o) for p, o in graded if p.kind == "hostile" and len(p.completion) < 100_000]
    again += hostile[: 2 * max(examples, 4)]
    second = grade_batch(env, [(p.task, p.completion) for p, _ in again], grade_fn)
    for (probe, outcome), repeat in zip(again, second, strict=True):
        if outcome.infrastructure or repeat.infrastructure:
            continue  # a flaky machine is not a nondeterministic grader
        if outcome.verdict != repeat.verdict:
            counter = f"{probe.describe()}: {_verdict_text(outcome)} then {_verdict_text(repeat)}"
            return CheckResult("grade_deterministic", False, len(again), counter)
    return CheckResult("grade_deterministic", True, len(again))


def _time_row(graded: Graded, limit: float) -> CheckResult:
    def bad(outcome: Outcome) -> str | None:
        if outcome.timed_out:
            return f"timed out in the sandbox ({limit:g} s limit)"
        if outcome.seconds is not None and outcome.seconds > limit:
            return f"took {outcome.seconds:.2f} s, over the {limit:g} s wall-time limit"
        return None

    counter = _first(graded, bad)
    slowest = max((o.seconds or 0.0 for _, o in graded), default=0.0)
    return CheckResult(
        "grade_within_time_limit", counter is None, len(graded), counter, note=f"slowest {slowest:.3f} s of {limit:g} s"
    )


def _what(outcome: Outcome) -> str | None:
    if outcome.error:
        return outcome.error
    if outcome.infrastructure:
        return f"infrastructure failure: {outcome.details[-120:]}"
    return None


def _verdict_text(outcome: Outcome) -> str:
    return _what(outcome) or f"score {outcome.score} passed={outcome.passed} details={outcome.details[:60]!r}"
