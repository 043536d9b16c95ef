"""The grading rows of the report, each judged on the probes graded (see :mod:`nodus.core.testing.probes`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nodus.core.environment import MISSING_MUTATIONS, Environment
from nodus.core.testing.outcomes import GradeFn, Outcome, grade_batch
from nodus.core.testing.probes import Left, Probe, Problems
from nodus.core.testing.report import CheckResult
from nodus.sandbox.outcome import summary_line

Graded = list[tuple[Probe, Outcome]]


def _first(graded: Iterable[tuple[Probe, Outcome]], bad: Callable[[Outcome], str | None]) -> str | None:
    for probe, outcome in graded:
        problem = bad(outcome)
        if problem:
            return f"{probe.describe()}: {problem}"
    return None


def reference_row(graded: Graded, problems: Problems, left: Left, limit: float) -> CheckResult:
    name = "reference_scores_1"
    references = [(p, o) for p, o in graded if p.kind == "reference"]
    examples = len(references) + len(problems.reference)
    if problems.reference:
        return CheckResult(name, False, examples, problems.reference[0])

    def bad(outcome: Outcome) -> str | None:
        if outcome.score == 1.0 and outcome.passed:
            return None
        if outcome.timed_out:
            return f"timed out at the {limit:g} s wall-time limit"
        details = summary_line(outcome.details, 120)
        return what(outcome) or f"scored {outcome.score} (passed={outcome.passed}): {details}"

    counter = _first(references, bad)
    if counter is None and not references:
        counter = f"not run: {left.note()}" if left.probes else "no task has a reference"
    return CheckResult(name, counter is None, examples, counter, note=left.note("reference"))


def mutation_row(graded: Graded, problems: Problems, has_method: bool, left: Left) -> CheckResult:
    name = "mutations_score_below_1"
    mutations = [(p, o) for p, o in graded if p.kind == "mutation"]
    note = left.note("mutation")
    if not has_method:
        return CheckResult(name, False, 0, MISSING_MUTATIONS)
    if problems.mutations:
        return CheckResult(name, False, len(mutations), problems.mutations[0])
    if not mutations:
        why = f"not run: {note}" if note else "mutations(task) returned no completions for any sampled task"
        return CheckResult(name, False, 0, why)

    def bad(outcome: Outcome) -> str | None:
        if outcome.error or outcome.infrastructure:
            return what(outcome)
        return f"scored {outcome.score}: {summary_line(outcome.details, 120)}" if outcome.score == 1.0 else None

    counter = _first(mutations, bad)
    return CheckResult(name, counter is None, len(mutations), counter, note=note)


def range_row(graded: Graded, left: Left) -> CheckResult:
    """Raising, exiting, an invalid result or a killed worker: only the machine's own failures are excused."""
    counter = _first(graded, lambda outcome: outcome.error)
    return CheckResult("grade_in_range_never_raises", counter is None, len(graded), counter, note=left.note())


def determinism_row(
    env: Environment, graded: Graded, grade_fn: GradeFn | None, examples: int, limit: float
) -> CheckResult:
    # Regrade every reference and mutation and a bounded number of hostile probes (never the huge ones: they
    # are slow and add nothing a short input does not). Never one that timed out or failed: the time and range
    # rows already fail it, and regrading it costs a wall time (or, in the sandbox, three fresh workers).
    def regradable(probe: Probe, outcome: Outcome) -> bool:
        return not (outcome.timed_out or outcome.error or outcome.infrastructure) and len(probe.completion) < 100_000

    again = [(p, o) for p, o in graded if p.kind != "hostile" and regradable(p, o)]
    hostile = [(p, o) for p, o in graded if p.kind == "hostile" and regradable(p, o)]
    again += hostile[: 2 * max(examples, 4)]
    if not again:  # "ok" on nothing would read as a pass; the other rows say why nothing graded cleanly
        why = "not run: every completion raised, timed out or met an infrastructure failure, so none was regraded"
        return CheckResult("grade_deterministic", False, 0, why)
    second = grade_batch(env, [(p.task, p.completion) for p, _ in again], grade_fn, limit)
    for (probe, outcome), repeat in zip(again, second, strict=True):
        if repeat.infrastructure:
            continue  # a flaky machine is not a nondeterministic grader
        if outcome.verdict != repeat.verdict:
            counter = f"{probe.describe()}: {verdict_text(outcome)} then {verdict_text(repeat)}"
            return CheckResult("grade_deterministic", False, len(again), counter)
    return CheckResult("grade_deterministic", True, len(again))


def time_row(graded: Graded, limit: float, limit_problem: str | None, left: Left) -> CheckResult:
    name = "grade_within_time_limit"
    timed_out = [(p, o) for p, o in graded if o.timed_out]
    over = [(p, o) for p, o in graded if not o.timed_out and o.seconds is not None and o.seconds > limit]

    def bad(outcome: Outcome) -> str | None:
        if outcome.timed_out:
            hung = f" ({outcome.details})" if outcome.details.startswith("hung") else ""
            return f"timed out at the {limit:g} s wall-time limit{hung}"
        if outcome.seconds is not None and outcome.seconds > limit:
            return f"took {outcome.seconds:.2f} s, over the {limit:g} s wall-time limit"
        return None

    counter = _first(graded, bad)
    if limit_problem:  # graded with the default limit meanwhile, so the other rows still say something
        counter = f"{limit_problem} (graded with the default {limit:g} s)"
    parts = [f"{len(timed_out)} of {len(graded)} timed out"] if timed_out else []
    parts += [f"{len(over)} of {len(graded)} over {limit:g} s"] if over else []
    if not parts:  # the slowest time says nothing useful next to a timeout: the count does
        parts = [f"slowest {max((o.seconds or 0.0 for _, o in graded), default=0.0):.3f} s of {limit:g} s"]
    parts += [left.note()] if left.probes else []
    return CheckResult(name, counter is None, len(graded), counter, note="; ".join(parts))


def what(outcome: Outcome) -> str | None:
    if outcome.error:
        return outcome.error
    if outcome.infrastructure:
        return f"infrastructure failure, not the grader's ({outcome.reason}): {summary_line(outcome.details, 200)}"
    return None


def verdict_text(outcome: Outcome) -> str:
    if outcome.timed_out:
        return "timed out"
    return what(outcome) or f"score {outcome.score} passed={outcome.passed} details={outcome.details[:60]!r}"
