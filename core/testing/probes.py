"""What the grading checks grade: each sampled task's reference, its mutations and hostile completions.

Grading stops after MAX_TIMEOUTS timeouts: each costs a whole wall time (a grader hanging on NUL bytes made
``grpo check --examples 16`` take 13 minutes), and one timeout already fails the time row. A sandbox worker
killed by the job (a grader over its memory) counts as one too: the pool tries it on three fresh workers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nodus.core.environment import Environment, Task
from nodus.core.testing.completions import HOSTILE, huge_completions, near_misses, random_text
from nodus.core.testing.outcomes import GradeFn, Outcome, error_text, grade_batch

MAX_TIMEOUTS = 3
# Probes per call of a caller's grade function: the sandbox grades one call in parallel on its workers, and
# between calls the runner counts timeouts. In-process, probes are graded one at a time.
CHUNK = 8
KINDS = ("reference", "mutation", "hostile")  # grading order: the rows that need every probe come first


@runtime_checkable
class Mutable(Protocol):
    """An environment that can break its own reference answers (the ``mutations`` method)."""

    def mutations(self, task: Task) -> list[str]:
        """Completions close to the reference that must score below 1: a swapped color, a changed digit..."""
        ...


def has_mutations(env: Environment) -> bool:
    """Whether ``env`` wrote its own ``mutations``: the base class's only raises, saying to write one."""
    return isinstance(env, Mutable) and getattr(type(env), "mutations", None) is not Environment.mutations


@dataclass(frozen=True)
class Probe:
    task: Task
    label: str
    completion: str
    kind: str  # one of KINDS

    def describe(self) -> str:
        text = self.completion
        preview = repr(text[:60]) + (f"... ({len(text)} chars)" if len(text) > 60 else "")
        return f"task {self.task.id}, {self.label} {preview}"


@dataclass(frozen=True)
class Left:
    """The probes not graded, and why grading stopped early."""

    probes: tuple[Probe, ...] = ()
    why: str = ""

    def note(self, kind: str | None = None) -> str:
        count = sum(1 for probe in self.probes if kind is None or probe.kind == kind)
        return f"{count} not graded: grading stopped after {self.why}" if count else ""


@dataclass
class Problems:
    """An author's method that raised or returned the wrong type while the probes were built."""

    reference: list[str] = field(default_factory=list)
    mutations: list[str] = field(default_factory=list)


def build_probes(env: Environment, tasks: list[Task], seed: int) -> tuple[list[Probe], Problems]:
    rng = random.Random(seed)
    probes: list[Probe] = []
    problems = Problems()
    first_of_split: set[str] = set()
    for task in tasks:
        reference = _reference(env, task, problems)
        if reference is not None:
            probes.append(Probe(task, "reference", reference, "reference"))
        if has_mutations(env):
            mutations = _mutations(env, task, problems)
            probes += [Probe(task, f"mutation {i}", text, "mutation") for i, text in enumerate(mutations)]
        hostile = (near_misses(reference, rng) if reference is not None else []) + [("random_text", random_text(rng))]
        if task.split not in first_of_split:  # the fixed corpus once per split; the huge inputs once in all
            hostile += list(HOSTILE) + (huge_completions(reference or "") if not first_of_split else [])
            first_of_split.add(task.split)
        probes += [Probe(task, label, text, "hostile") for label, text in hostile]
    return sorted(probes, key=lambda probe: KINDS.index(probe.kind)), problems


def _reference(env: Environment, task: Task, problems: Problems) -> str | None:
    try:
        reference = env.reference(task)
    except (Exception, SystemExit) as error:
        problems.reference.append(f"task {task.id}: reference() raised {error_text(error)}")
        return None
    if not isinstance(reference, str):
        problems.reference.append(f"task {task.id}: reference() returned {type(reference).__name__}, not a str")
        return None
    return reference


def _mutations(env: Mutable, task: Task, problems: Problems) -> list[str]:
    try:
        mutations = list(env.mutations(task))
    except (Exception, SystemExit) as error:
        problems.mutations.append(f"task {task.id}: mutations() raised {error_text(error)}")
        return []
    wrong = [type(text).__name__ for text in mutations if not isinstance(text, str)]
    if wrong:
        problems.mutations.append(f"task {task.id}: mutations() returned a {wrong[0]}, not a str")
        return []
    return mutations


def grade_probes(
    env: Environment, probes: list[Probe], grade_fn: GradeFn | None, limit: float
) -> tuple[list[tuple[Probe, Outcome]], Left]:
    """Grade probes in order until MAX_TIMEOUTS timed out (or killed their worker); the graded ones, and the rest."""
    step = 1 if grade_fn is None else CHUNK
    graded: list[tuple[Probe, Outcome]] = []
    for start in range(0, len(probes), step):
        timeouts = sum(outcome.timed_out or outcome.killed_worker for _, outcome in graded)
        if timeouts >= MAX_TIMEOUTS:
            kills = any(outcome.killed_worker for _, outcome in graded)
            return graded, Left(tuple(probes[start:]), f"{timeouts} timeouts" + (" or killed workers" if kills else ""))
        chunk = probes[start : start + step]
        graded += zip(chunk, grade_batch(env, [(p.task, p.completion) for p in chunk], grade_fn, limit), strict=True)
    return graded, Left()
