"""Grading throughput: the sandboxed pool against grading without a sandbox.

    .venv/bin/python benchmarks/grading_throughput.py                      # built-in cheap target
    .venv/bin/python benchmarks/grading_throughput.py --target nodus.core.grading:grade_job \\
        --payload-json '{"env": "graph-coloring@1", "params": {}, "task": {...}, "completion": "..."}'

Part 1, cheap in-process-style grader: gradings/s through GraderPool (no per-completion isolation,
as for environments whose grader does not execute model code) vs calling the target in this
process.  Goal: the pool costs at most 2x the in-process time.

Part 2, small Python programs: GraderPool with isolate_each_completion=True running
nodus.sandbox.programs:run_python vs one unsandboxed ``subprocess`` (python -c) per program.
Goal: at least 100 programs/s.

Each figure is the median over --repeats batches of --batch jobs (default 64), after a warm-up.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from nodus.sandbox import GraderPool, SandboxLimits

DEFAULT_TARGET = "nodus.sandbox.demo_targets:coloring_check"


def default_payload(nodes: int = 300) -> dict[str, Any]:
    """A ring plus chords, 3-colored properly: a graph-coloring answer of realistic size."""
    edges = [[i, (i + 1) % nodes] for i in range(nodes)] + [[i, (i + 3) % nodes] for i in range(0, nodes, 2)]
    coloring = [i % 3 for i in range(nodes)]
    edges = [e for e in edges if coloring[e[0]] != coloring[e[1]]]
    return {"edges": edges, "coloring": coloring, "max_colors": 3}
PROGRAM = "n = int(input())\nprint(sum(i * i for i in range(n)))\n"
PROGRAM_STDIN = "1000"
PROGRAM_EXPECTED = str(sum(i * i for i in range(1000)))


def median_rate(run_batch: Callable[[], None], batch: int, repeats: int) -> float:
    run_batch()  # warm-up: worker start, first imports
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        run_batch()
        rates.append(batch / (time.perf_counter() - started))
    return statistics.median(rates)


def load_target(spec: str) -> Callable[[dict[str, Any]], Any]:
    module, _, name = spec.partition(":")
    function: Callable[[dict[str, Any]], Any] = getattr(importlib.import_module(module), name)
    return function


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=DEFAULT_TARGET, help="module:function of the cheap grader")
    parser.add_argument("--payload-json", default=None, help="payload for --target (JSON)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    payload = json.loads(args.payload_json) if args.payload_json else default_payload()
    limits = SandboxLimits(wall_time_s=10)

    target = load_target(args.target)
    in_process = median_rate(lambda: [target(payload) for _ in range(args.batch)] and None, args.batch, args.repeats)
    jobs = [{"target": args.target, "payload": payload}] * args.batch
    with GraderPool(limits, workers=args.workers) as pool:
        def grade_batch() -> None:
            outcomes = pool.run_many(jobs)
            assert all(o.status == "graded" for o in outcomes), outcomes[0]

        pooled = median_rate(grade_batch, args.batch, args.repeats)
    print(f"cheap grader {args.target}, batches of {args.batch}, {args.workers} workers")
    print(f"  in-process      : {in_process:10.1f} gradings/s")
    print(f"  GraderPool      : {pooled:10.1f} gradings/s")
    print(f"  pool time / in-process time: {in_process / pooled:.1f}x (goal <= 2x); "
          f"pool cost {1e6 / pooled:.0f} us/job vs {1e6 / in_process:.0f} us/job")

    program_jobs = [
        {"target": "nodus.sandbox.programs:run_python",
         "payload": {"code": PROGRAM, "stdin": PROGRAM_STDIN, "expected_stdout": PROGRAM_EXPECTED}}
    ] * args.batch
    with GraderPool(limits, workers=args.workers, isolate_each_completion=True) as pool:
        def program_batch() -> None:
            outcomes = pool.run_many(program_jobs)
            assert all(o.passed for o in outcomes), outcomes[0]

        isolated = median_rate(program_batch, args.batch, args.repeats)

    def subprocess_batch() -> None:
        for _ in range(args.batch):
            done = subprocess.run([sys.executable, "-c", PROGRAM], input=PROGRAM_STDIN, capture_output=True,
                                  text=True, timeout=10)
            assert done.stdout.strip() == PROGRAM_EXPECTED

    unsandboxed = median_rate(subprocess_batch, args.batch, args.repeats)
    print(f"small Python programs, batches of {args.batch}, {args.workers} workers")
    print(f"  GraderPool, isolate_each_completion: {isolated:8.1f} programs/s (goal >= 100)")
    print(f"  subprocess per program, no sandbox : {unsandboxed:8.1f} programs/s")


if __name__ == "__main__":
    main()
