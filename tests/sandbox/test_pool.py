"""Pool semantics through the real sandbox: infrastructure failures are retried, counted, never 0."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

import pytest
from nodus.sandbox import GradeOutcome, GraderPool, SandboxLimits
from nodus.sandbox.protocol import ProtocolError, encode_frame, read_frame, validate_grader_result
from sandbox_helpers import python_job

SCORE = "nodus.sandbox.demo_targets:score"


def score_job(answer: object, expected: object) -> dict[str, object]:
    return {"target": SCORE, "payload": {"answer": answer, "expected": expected}}


@pytest.fixture(scope="module")
def pool() -> GraderPool:
    with GraderPool(SandboxLimits(wall_time_s=3), workers=2, batch_size=4) as shared:
        yield shared  # type: ignore[misc]


def test_scores_in_order(pool: GraderPool) -> None:
    outcomes = pool.run_many([score_job(i, 3) for i in range(10)])
    assert [o.passed for o in outcomes] == [i == 3 for i in range(10)]
    assert all(o.status == "graded" and o.attempts == 1 for o in outcomes)


def test_grader_that_raises_is_infrastructure_never_zero(pool: GraderPool, caplog: pytest.LogCaptureFixture) -> None:
    before = pool.stats
    bad = {"target": "nodus.sandbox.demo_targets:raise_error", "payload": {"message": "bug in grader"}}
    with caplog.at_level(logging.WARNING, logger="nodus.sandbox"):
        outcome, good = pool.run_many([bad, score_job(1, 1)])
    # One log line, naming the exception (a traceback's last line), not the head of the call path.
    logged = [r.getMessage() for r in caplog.records if "grading infrastructure failure" in r.getMessage()]
    assert logged == ["grading infrastructure failure (grader_error) after 1 attempt(s): RuntimeError: bug in grader"]
    assert outcome.status == "infrastructure_failure" and outcome.is_infrastructure_failure
    # Not retried: the same grader code on the same payload raises again on a fresh worker.
    assert (outcome.score, outcome.passed, outcome.reason, outcome.attempts) == (None, None, "grader_error", 1)
    assert "bug in grader" in outcome.details
    assert good.passed
    after = pool.stats
    assert after.infrastructure_failures == before.infrastructure_failures + 1
    assert after.retries == before.retries


@pytest.mark.parametrize(
    "result",
    [{"score": 2.0, "passed": True, "details": ""}, {"score": 1.0, "details": ""}, "1.0",
     {"score": True, "passed": True, "details": ""}],
)
def test_invalid_grader_results_are_grader_errors(pool: GraderPool, result: object) -> None:
    outcome = pool.run({"target": "nodus.sandbox.demo_targets:echo", "payload": {"result": result}})
    assert outcome.is_infrastructure_failure and outcome.reason == "grader_error", outcome


def test_unknown_target_is_a_grader_error(pool: GraderPool) -> None:
    outcome = pool.run({"target": "nodus.sandbox.no_such_module:grade", "payload": {}})
    assert outcome.is_infrastructure_failure and outcome.reason == "grader_error"
    assert "No module named" in outcome.details


def test_killed_worker_is_retried_on_a_fresh_worker() -> None:
    with GraderPool(SandboxLimits(wall_time_s=5), workers=1) as solo:
        solo.run(score_job(1, 1))
        victim = solo.worker_pids()[0]
        results: list[GradeOutcome] = []
        runner = threading.Thread(target=lambda: results.extend(solo.run_many(
            [{"target": "nodus.sandbox.demo_targets:sleep", "payload": {"seconds": 1.0}}])))
        runner.start()
        time.sleep(0.4)
        os.kill(victim, signal.SIGKILL)
        runner.join(timeout=30)
        (outcome,) = results
        assert outcome.status == "graded" and outcome.passed and outcome.attempts == 2
        stats = solo.stats
        assert (stats.infrastructure_attempts, stats.infrastructure_failures, stats.retries) == (1, 0, 1)
        assert victim not in solo.worker_pids()
        pids = solo.worker_pids()
    time.sleep(0.2)
    for pid in pids:  # closing the pool leaves no nsjail behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_worker_that_keeps_dying_is_reported_not_scored() -> None:
    with GraderPool(SandboxLimits(wall_time_s=5), workers=1) as solo:
        stop = threading.Event()

        def keep_killing() -> None:
            while not stop.is_set():
                for pid in solo.worker_pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)

        killer = threading.Thread(target=keep_killing)
        killer.start()
        try:
            outcome = solo.run({"target": "nodus.sandbox.demo_targets:sleep", "payload": {"seconds": 2}})
        finally:
            stop.set()
            killer.join()
        assert outcome.is_infrastructure_failure and outcome.attempts == 3 and outcome.score is None
        assert outcome.reason in ("worker_died", "sandbox_start_failed")
        assert solo.stats.infrastructure_failures == 1


def test_recycles_after_n_jobs() -> None:
    with GraderPool(workers=1, recycle_after=3, batch_size=8) as small:
        outcomes = small.run_many([score_job(1, 1)] * 7)
        assert all(o.passed for o in outcomes)
        assert small.stats.workers_started == 3


def test_same_completion_same_grade_across_pools() -> None:
    job = {"target": "nodus.sandbox.demo_targets:hash_of", "payload": {"text": "graph-coloring"}}
    program = python_job("print(hash('abc'), list({'a', 'b', 'c', 'd'}))")
    runs = []
    for isolate in (False, True, True):
        with GraderPool(workers=1, isolate_each_completion=isolate) as fresh:
            graded, ran = fresh.run_many([job, program])
            runs.append((graded.details, ran.status, ran.score))
    assert runs[0] == runs[1] == runs[2]


def test_in_process_grader_timeout_is_a_zero() -> None:
    with GraderPool(SandboxLimits(wall_time_s=0.5), workers=1) as quick:
        outcome = quick.run({"target": "nodus.sandbox.demo_targets:sleep", "payload": {"seconds": 5}})
        assert (outcome.status, outcome.score, outcome.reason) == ("graded", 0.0, "timeout")
        assert quick.run(score_job(1, 1)).passed


def test_for_environment_reads_class_attributes() -> None:
    class Env:
        sandbox_limits = {"wall_time_s": 4, "memory_mb": 128}
        isolate_each_completion = True

    pool = GraderPool.for_environment(Env(), {"memory_mb": 256}, workers=1)
    assert (pool.limits.wall_time_s, pool.limits.memory_mb, pool.isolate_each_completion) == (4.0, 256, True)
    pool.close()


# ---------------------------------------------------------------- protocol units


def test_frames_round_trip_and_bound_their_size() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, encode_frame({"a": [1, 2]}))
    assert read_frame(read_fd, time.monotonic() + 1) == {"a": [1, 2]}
    os.write(write_fd, (10**9).to_bytes(4, "big"))
    with pytest.raises(ProtocolError, match="more than the"):
        read_frame(read_fd, time.monotonic() + 1)
    os.write(write_fd, (3).to_bytes(4, "big") + b"\xff\xfe\x00")
    with pytest.raises(ProtocolError, match="not JSON"):
        read_frame(read_fd, time.monotonic() + 1)
    with pytest.raises(ProtocolError, match="timed out"):
        read_frame(read_fd, time.monotonic() + 0.05)
    os.close(write_fd)
    with pytest.raises(ProtocolError, match="closed"):
        read_frame(read_fd, time.monotonic() + 1)
    os.close(read_fd)


def test_jobs_that_are_not_json_are_refused_up_front(pool: GraderPool) -> None:
    with pytest.raises(ValueError, match="job 1 cannot be sent to a worker as JSON"):
        pool.run_many([score_job(1, 1), score_job(float("nan"), 1)])


def test_result_validation_rejects_nan() -> None:
    with pytest.raises(ValueError, match="finite"):
        validate_grader_result({"score": float("nan"), "passed": True, "details": ""}, max_details_chars=10)


def test_result_validation_cuts_details() -> None:
    checked = validate_grader_result({"score": 1, "passed": True, "details": "x" * 100}, max_details_chars=10)
    assert checked == {"score": 1.0, "passed": True, "reason": "passed", "details": "xxxxxxxxxx... [cut, 100 chars]"}


# ---------------------------------------------------------------- batches: one frame out, few frames back


def sleep_job(seconds: float) -> dict[str, object]:
    return {"target": "nodus.sandbox.demo_targets:sleep", "payload": {"seconds": seconds}}


def test_worker_killed_mid_batch_keeps_answered_and_retries_the_rest() -> None:
    # Job 0 takes longer than REPLY_FLUSH_S, so its reply is sent before job 1 runs; job 1's reply
    # is still held by the worker when it is killed during job 2.
    jobs = [sleep_job(0.1), score_job(1, 1), sleep_job(2.0), score_job(3, 3)]
    with GraderPool(SandboxLimits(wall_time_s=5), workers=1) as solo:
        solo.run(score_job(0, 0))
        victim = solo.worker_pids()[0]
        results: list[GradeOutcome] = []
        runner = threading.Thread(target=lambda: results.extend(solo.run_many(jobs)))
        runner.start()
        time.sleep(0.8)
        os.kill(victim, signal.SIGKILL)
        runner.join(timeout=30)
        assert [(o.status, o.passed) for o in results] == [("graded", True)] * 4
        # Answered before the kill: kept.  Unanswered: sent again, uncharged, since the worker may
        # have finished some of them without having sent their replies yet.
        assert [o.attempts for o in results] == [1, 1, 1, 1]
        stats = solo.stats
        assert (stats.requeued_unanswered, stats.infrastructure_attempts, stats.infrastructure_failures) == (3, 0, 0)
        assert victim not in solo.worker_pids() and stats.workers_replaced == 1


def test_job_that_kills_its_worker_in_a_batch_fails_alone() -> None:
    killer = {"target": "nodus.sandbox.demo_targets:exec_in_process", "payload": {"code": "import os; os._exit(3)"}}
    with GraderPool(SandboxLimits(wall_time_s=5), workers=1) as solo:
        outcomes = solo.run_many([score_job(1, 1), killer, score_job(2, 2), score_job(3, 4)])
        assert [(o.status, o.passed) for o in outcomes[::2]] == [("graded", True), ("graded", True)]
        assert (outcomes[3].status, outcomes[3].passed) == ("graded", False)
        dead = outcomes[1]
        assert dead.is_infrastructure_failure and dead.score is None
        assert (dead.reason, dead.attempts) == ("worker_died", 3)
        stats = solo.stats
        # First death: 4 unanswered, culprit unknown -> all sent again with streamed replies, then
        # each death pins the killer: 3 charged attempts.
        assert (stats.requeued_unanswered, stats.infrastructure_attempts, stats.retries) == (4, 3, 2)
        assert stats.infrastructure_failures == 1 and stats.workers_replaced == 4
        assert solo.run(score_job(5, 5)).passed


def test_each_in_process_job_gets_its_own_wall_time() -> None:
    # The worker arms its timer once and re-arms it for the running job's deadline: three jobs of
    # 0.3 s in a row with a 0.5 s limit all finish; a fourth that sleeps too long is a timeout.
    with GraderPool(SandboxLimits(wall_time_s=0.5), workers=1) as quick:
        outcomes = quick.run_many([sleep_job(0.3), sleep_job(0.3), sleep_job(0.3), sleep_job(3), score_job(1, 1)])
        assert [o.reason for o in outcomes] == ["passed", "passed", "passed", "timeout", "passed"]
        assert quick.stats.infrastructure_attempts == 0


def test_a_job_reads_its_own_time_left_from_the_timer() -> None:
    # The timer was armed only when none was pending: a job after an idle gap saw what was left of an earlier job's
    # deadline, and math-answer's parse limit (capped at the time left) cut a correct answer short as too slow.
    job = {"target": "nodus.sandbox.demo_targets:time_left", "payload": {"wall_time_s": 1.0}}
    with GraderPool(SandboxLimits(wall_time_s=1.0), workers=1) as quick:
        assert quick.run(job).score > 0.9
        time.sleep(0.6)
        later = quick.run(job)
        assert later.score > 0.9, f"the second job saw {later.details} s of its 1 s"


def test_a_grader_too_slow_to_prepare_is_its_failure_at_once() -> None:
    # It was charged to no one for the host's whole reply budget, then called a hung worker, three times over.
    slow = {"target": "nodus.sandbox.demo_targets:slow_to_prepare", "payload": {"prepare_seconds": 30}}
    with GraderPool(SandboxLimits(wall_time_s=1.0), workers=1) as quick:
        started = time.monotonic()
        outcome = quick.run(slow)
        assert time.monotonic() - started < 20
        assert (outcome.status, outcome.reason, outcome.attempts) == ("infrastructure_failure", "grader_error", 1)
        assert outcome.details.startswith(
            "preparing the grader (its environment's warm_up()) took more than 12 s, the sandbox's budget for loading"
        )
        fine = {"target": "nodus.sandbox.demo_targets:slow_to_prepare", "payload": {"prepare_seconds": 2}}
        assert quick.run(fine).passed, "a preparation inside the budget is not charged to the job's 1 s"


def test_refused_job_cancels_the_call_and_the_pool_stays_usable(pool: GraderPool) -> None:
    jobs = [score_job(i, i) for i in range(40)] + [score_job(object(), 1)]
    with pytest.raises(ValueError, match="job 40 cannot be sent to a worker as JSON"):
        pool.run_many(jobs)
    outcomes = pool.run_many([score_job(i, 2) for i in range(5)])
    assert [o.passed for o in outcomes] == [i == 2 for i in range(5)]


def test_many_jobs_from_concurrent_callers(pool: GraderPool) -> None:
    results: dict[int, list[GradeOutcome]] = {}

    def call(n: int) -> None:
        results[n] = pool.run_many([score_job(i % 7, n % 7) for i in range(50 + n)])

    callers = [threading.Thread(target=call, args=(n,)) for n in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=60)
    for n in range(3):
        assert [o.passed for o in results[n]] == [i % 7 == n % 7 for i in range(50 + n)]


def test_encode_json_matches_json_dumps_and_refuses_what_json_refuses() -> None:
    import json

    from nodus.sandbox.protocol import encode_batch_frame, encode_json

    value = {"a": [1, 2.5, None, True, "é\n\"x\""], "b": {"c": []}, "d": -0.0, "e": 10**30}
    assert encode_json(value) == json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    for bad in (float("nan"), float("inf"), {"x": {1, 2}}, b"bytes"):
        with pytest.raises((TypeError, ValueError)):
            encode_json(bad)
    circular: list[object] = []
    circular.append(circular)
    with pytest.raises(ValueError):
        encode_json(circular)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, encode_batch_frame([encode_json({"n": 1}), encode_json({"n": 2})], stream=True))
    assert read_frame(read_fd, time.monotonic() + 1) == {"stream": True, "jobs": [{"n": 1}, {"n": 2}]}
    os.close(read_fd)
    os.close(write_fd)
