"""A pool of long-lived jailed workers that grade batches of jobs, with retries on fresh workers."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Protocol

from .errors import UnsandboxedGradingWarning
from .jail import build_worker_command, cgroup_v1_available, check_sandbox_available
from .limits import SandboxLimits
from .outcome import GRADED, INFRASTRUCTURE_FAILURE, GradeOutcome, PoolStats, summary_line
from .protocol import (
    MAX_FRAME_BYTES,
    ProtocolError,
    batch_frame_size,
    encode_batch_frame,
    encode_json,
    read_frame,
    reply_bytes_bound,
    write_all,
)
from .worker import JOB_CHILD_GRACE_S, REPLY_FLUSH_S, Worker

log = logging.getLogger("nodus.sandbox")

# Beyond the job's own wall time, how long the host waits for a reply before declaring the worker
# hung (first use of a target imports its module inside the worker, which can take seconds).
HOST_REPLY_SLACK_S = 15.0
MAX_ATTEMPTS = 3  # first try + 2 retries, each on a fresh worker
# A grader that raised or returned an invalid result does the same again on a fresh worker with the same
# payload (its code and input are unchanged), so retrying it only multiplies the cost and the log lines.
NOT_RETRIED = frozenset({"grader_error"})


class EnvironmentLike(Protocol):
    sandbox_limits: Mapping[str, Any]
    isolate_each_completion: bool


class WorkerStartError(Exception):
    pass


class _WorkerProcess:
    """One nsjail running ``nodus.sandbox.worker``; the host side of the frame protocol."""

    def __init__(self, argv: list[str], startup_timeout_s: float) -> None:
        self.jobs_done = 0
        self._stderr_tail: collections.deque[bytes] = collections.deque(maxlen=64)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._in_fd = self.proc.stdin.fileno()
        self._out_fd = self.proc.stdout.fileno()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        try:
            hello = read_frame(self._out_fd, time.monotonic() + startup_timeout_s, max_bytes=4096)
        except ProtocolError as exc:
            self.kill()
            raise WorkerStartError(f"sandbox could not start: {exc}{said(self.stderr_tail())}") from exc
        if hello != {"ready": True}:
            self.kill()
            raise WorkerStartError(f"sandbox sent {hello!r} instead of ready")

    def _drain_stderr(self) -> None:
        assert self.proc.stderr
        while chunk := self.proc.stderr.read(4096):
            self._stderr_tail.append(chunk)

    def stderr_tail(self) -> str:
        lines = b"".join(self._stderr_tail).decode(errors="replace").splitlines()
        return " | ".join(line for line in lines if "no version information" not in line)[-2000:]

    def send(self, frame: bytes) -> None:
        write_all(self._in_fd, frame)

    def receive(self, deadline: float, max_replies: int, reply_bytes: int) -> list[dict[str, Any]]:
        """The next frame of replies: 1..max_replies dicts, each graded or infrastructure_failure."""
        frame = read_frame(self._out_fd, deadline, max_bytes=max_replies * reply_bytes + 64)
        replies = frame.get("replies") if isinstance(frame, dict) else None
        if (
            not isinstance(replies, list)
            or not 1 <= len(replies) <= max_replies
            or not all(isinstance(r, dict) and r.get("status") in (GRADED, INFRASTRUCTURE_FAILURE) for r in replies)
        ):
            raise ProtocolError(f"garbled reply {str(frame)[:200]}")
        return replies

    def close(self) -> None:
        try:
            assert self.proc.stdin
            self.proc.stdin.close()  # the worker exits on EOF
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()

    def kill(self) -> None:
        # nsjail kills the jail's pid namespace when it dies (the child has PDEATHSIG).
        self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("nsjail pid %s did not exit after SIGKILL", self.proc.pid)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream:
                with contextlib.suppress(OSError):
                    stream.close()


class _Run:
    """The jobs of one run_many call: where their outcomes go, and how many are still open.

    ``chunk``: how many of its jobs a slot takes at once (None: split what is queued evenly between
    the slots, down to single jobs -- for slow, uneven jobs such as programs).  ``cancelled``: the
    call raised while submitting; its queued jobs are dropped.
    """

    def __init__(self, size: int, chunk: int | None) -> None:
        self.results: list[GradeOutcome | None] = [None] * size
        self.open = size
        self.chunk = chunk
        self.cancelled = False


@dataclasses.dataclass(eq=False)
class _Item:
    run: _Run
    index: int
    encoded: bytes  # the job as JSON, encoded once when submitted
    attempts: int = 0
    # Set after a worker died with this job among several unanswered ones: it is sent again in a
    # batch whose replies are streamed one frame each, so a second death pins the job that ran.
    stream: bool = False


class _WorkQueue:
    """Jobs waiting to be graded, shared by the pool's slot threads for the pool's lifetime.

    Retries go to the front.  take() blocks until there is work and returns [] once the queue is
    closed.  Each item is finished exactly once, with its outcome; wait() returns when a run's items
    are all finished.
    """

    def __init__(self) -> None:
        self._items: collections.deque[_Item] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._idle = 0  # slot threads waiting in take()
        self._handovers = 0  # submitters waiting in hand_over()

    def take(self, at_most: int, slots: int) -> list[_Item]:
        with self._cond:
            while not self._items and not self._closed:
                self._idle += 1
                try:
                    self._cond.wait()
                finally:
                    self._idle -= 1
            if self._closed:
                return []
            chunk = self._items[0].run.chunk
            if chunk is None:  # split what is left evenly so one slot does not take everything
                chunk = -(-len(self._items) // max(1, slots))
            n = max(1, min(at_most, chunk, len(self._items)))
            if self._handovers:
                self._cond.notify_all()
            return [self._items.popleft() for _ in range(n)]

    def hand_over(self, items: Sequence[_Item]) -> None:
        """Queue ``items`` at the back and, if a slot thread is idle, wait (briefly) until one took
        them: the submitting thread would otherwise keep the GIL and encode every other job first."""
        with self._cond:
            idle = self._idle
        self.put(items, front=False)
        if not idle or not items:
            return
        with self._cond:
            self._handovers += 1
            try:
                self._cond.wait_for(lambda: self._closed or self._idle < idle, timeout=0.005)
            finally:
                self._handovers -= 1

    def cancel(self, run: _Run) -> None:
        """Drop the queued jobs of ``run`` (batches already sent finish, their outcomes unread)."""
        with self._cond:
            run.cancelled = True
            self._items = collections.deque(item for item in self._items if not item.run.cancelled)

    def put(self, items: Sequence[_Item], front: bool = True) -> None:
        if not items:
            return
        with self._cond:
            if self._closed:
                for item in items:
                    self._finish_locked(item, GradeOutcome.infrastructure("pool_closed", "pool closed", item.attempts))
                return
            if front:
                self._items.extendleft(reversed(items))
            else:
                self._items.extend(items)
            self._cond.notify_all()

    def finish(self, item: _Item, outcome: GradeOutcome) -> None:
        with self._cond:
            self._finish_locked(item, outcome)

    def _finish_locked(self, item: _Item, outcome: GradeOutcome) -> None:
        if item.run.results[item.index] is None:
            item.run.results[item.index] = outcome
            item.run.open -= 1
            if not item.run.open:
                self._cond.notify_all()

    def wait(self, run: _Run) -> None:
        with self._cond:
            while run.open:
                self._cond.wait()

    def close(self) -> None:
        """Stop the slot threads; jobs still queued end as infrastructure failures ("pool_closed")."""
        with self._cond:
            self._closed = True
            while self._items:
                item = self._items.popleft()
                self._finish_locked(item, GradeOutcome.infrastructure("pool_closed", "pool closed", item.attempts))
            self._cond.notify_all()


class GraderPool:
    """Grade jobs ``{"target": "module:function", "payload": {...}}`` in nsjail workers.

    ``mode="nsjail"`` (default) fails at start with SandboxUnavailable when nsjail cannot run.
    ``mode="none"`` grades in this process, for trusted graders only, and warns on every run.
    """

    def __init__(
        self,
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        workers: int = 2,
        recycle_after: int = 500,
        mode: Literal["nsjail", "none"] = "nsjail",
        isolate_each_completion: bool = False,
        *,
        batch_size: int = 32,
        nsjail_path: str | os.PathLike[str] | None = None,
        extra_mounts: Sequence[str | os.PathLike[str]] = (),
        hidden_paths: Sequence[str | os.PathLike[str]] = (),
        startup_timeout_s: float = 30.0,
    ) -> None:
        if mode not in ("nsjail", "none"):
            raise ValueError(f"mode must be 'nsjail' or 'none', not {mode!r}")
        if workers < 1 or recycle_after < 1 or batch_size < 1:
            raise ValueError("workers, recycle_after and batch_size must be >= 1")
        self.limits = limits if isinstance(limits, SandboxLimits) else SandboxLimits.for_environment(limits)
        self.workers = workers
        self.recycle_after = recycle_after
        self.mode = mode
        self.isolate_each_completion = isolate_each_completion
        self.batch_size = batch_size
        self._nsjail_path = nsjail_path
        self._extra_mounts = extra_mounts
        self._hidden_paths = hidden_paths
        self._startup_timeout_s = startup_timeout_s
        self._argv: list[str] | None = None
        self._slots: list[_WorkerProcess | None] = [None] * workers
        self._stats = PoolStats()
        self._stats_lock = threading.Lock()
        self._queue = _WorkQueue()
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_environment(
        cls, env: EnvironmentLike, user_limits: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> GraderPool:
        limits = SandboxLimits.for_environment(getattr(env, "sandbox_limits", {}), user_limits)
        return cls(limits, isolate_each_completion=bool(getattr(env, "isolate_each_completion", False)), **kwargs)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> GraderPool:
        """Check the sandbox and build the worker command; raises SandboxUnavailable (no fallback)."""
        if self.mode == "none" or self._argv is not None:
            return self
        nsjail = check_sandbox_available(self._nsjail_path)
        config = {
            "limits": self.limits.model_dump(),
            "isolate": self.isolate_each_completion,
            # Without a pids cgroup, RLIMIT_NPROC (per user namespace) is the process cap.
            "rlimit_nproc_per_completion": False,
        }
        self._argv = build_worker_command(self.limits, config, nsjail, self._extra_mounts, self._hidden_paths)
        if not cgroup_v1_available():
            log.info("no cgroup v1 memory/pids controllers: limiting memory with rlimit_as and nproc rlimits")
        return self

    def close(self) -> None:
        self._closed = True
        self._queue.close()
        with self._threads_lock:
            threads, self._threads = self._threads, []
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()  # a slot finishes the batch it is grading (bounded by the reply deadline)
        for i, worker in enumerate(self._slots):
            if worker is not None:
                worker.close()
                self._slots[i] = None

    def __enter__(self) -> GraderPool:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def stats(self) -> PoolStats:
        with self._stats_lock:
            return dataclasses.replace(self._stats)

    def worker_pids(self) -> list[int]:
        """Host pids of the running nsjail processes (for monitoring and fault-injection tests)."""
        return [w.proc.pid for w in self._slots if w is not None]

    # ----------------------------------------------------------------- grading

    def run(self, job: dict[str, Any]) -> GradeOutcome:
        return self.run_many([job])[0]

    def run_many(self, jobs: Sequence[dict[str, Any]]) -> list[GradeOutcome]:
        if self._closed:
            raise RuntimeError("GraderPool is closed")
        if self.mode == "none":
            for position, job in enumerate(jobs):
                _encode_job(position, job)  # same up-front check as with a sandbox
            results: list[GradeOutcome | None] = [None] * len(jobs)
            self._run_unsandboxed(jobs, results)
        else:
            run = self._submit(jobs)
            self._queue.wait(run)
            results = run.results
        final = [r if r is not None else GradeOutcome.infrastructure("lost", "no result", 0) for r in results]
        with self._stats_lock:
            self._stats.jobs += len(final)
            self._stats.graded += sum(1 for r in final if not r.is_infrastructure_failure)
            self._stats.infrastructure_failures += sum(1 for r in final if r.is_infrastructure_failure)
        return final

    def _submit(self, jobs: Sequence[dict[str, Any]]) -> _Run:
        """Encode the jobs and queue them chunk by chunk, so workers start on the first chunk while the
        rest is encoded.  Encoding is the JSON check and the wire format at once (each job is encoded
        once, also when retried).  A job that is not JSON raises ValueError and cancels the call."""
        chunk = None if self.isolate_each_completion else max(1, min(self.batch_size, -(-len(jobs) // self.workers)))
        run = _Run(len(jobs), chunk)
        step = chunk or self.batch_size
        pending: list[_Item] = []
        started = False
        try:
            for i, job in enumerate(jobs):
                pending.append(_Item(run, i, _encode_job(i, job)))
                if len(pending) == step:
                    if not started:
                        self.start()
                        self._start_slot_threads()
                        started = True
                    self._queue.hand_over(pending)
                    pending = []
        except BaseException:
            self._queue.cancel(run)
            raise
        if not started:
            self.start()
            self._start_slot_threads()
        self._queue.put(pending, front=False)
        return run

    def _start_slot_threads(self) -> None:
        """One long-lived thread per worker slot (started once: a thread start per call costs ~0.1-1 ms)."""
        with self._threads_lock:
            if self._threads or self._closed:
                return
            self._threads = [
                threading.Thread(target=self._slot_loop, args=(slot,), daemon=True, name=f"nodus-grader-slot-{slot}")
                for slot in range(self.workers)
            ]
            for thread in self._threads:
                thread.start()

    def _run_unsandboxed(self, jobs: Sequence[dict[str, Any]], results: list[GradeOutcome | None]) -> None:
        message = (
            f"nodus.sandbox: grading {len(jobs)} job(s) with sandbox='none', in this process, without "
            "isolation or limits other than wall time; only for trusted graders"
        )
        log.warning(message)
        warnings.warn(message, UnsandboxedGradingWarning, stacklevel=3)
        worker = Worker({"limits": self.limits.model_dump(), "isolate": False, "borrowed": True},
                        use_alarm=threading.current_thread() is threading.main_thread())
        for i, job in enumerate(jobs):
            for attempt in range(1, MAX_ATTEMPTS + 1):
                reply = worker.run_job(job)
                if reply["status"] == GRADED or attempt == MAX_ATTEMPTS or reply.get("reason") in NOT_RETRIED:
                    results[i] = GradeOutcome.from_reply(reply, attempt)
                    break
                self._count_infra_attempt(retry=True)
            if results[i] is not None and results[i].is_infrastructure_failure:  # type: ignore[union-attr]
                self._count_infra_attempt(retry=False)

    def _count_infra_attempt(self, retry: bool) -> None:
        with self._stats_lock:
            self._stats.infrastructure_attempts += 1
            self._stats.retries += int(retry)

    def _worker_for(self, slot: int) -> _WorkerProcess:
        worker = self._slots[slot]
        if worker is not None and worker.jobs_done >= self.recycle_after:
            worker.close()
            worker = self._slots[slot] = None
        if worker is None:
            assert self._argv is not None
            worker = _WorkerProcess(self._argv, self._startup_timeout_s)
            self._slots[slot] = worker
            with self._stats_lock:
                self._stats.workers_started += 1
        return worker

    def _replace_worker(self, slot: int) -> None:
        worker = self._slots[slot]
        if worker is not None:
            worker.kill()
            self._slots[slot] = None
            with self._stats_lock:
                self._stats.workers_replaced += 1

    def _infrastructure_failure(self, item: _Item, reason: str, details: str) -> None:
        item.attempts += 1
        if item.attempts < MAX_ATTEMPTS and reason not in NOT_RETRIED:
            log.warning(
                "grading infrastructure failure (%s), retrying on a fresh worker: %s", reason, summary_line(details)
            )
            self._count_infra_attempt(retry=True)
            self._queue.put([item])
            return
        log.error(
            "grading infrastructure failure (%s) after %d attempt(s): %s", reason, item.attempts, summary_line(details)
        )
        self._count_infra_attempt(retry=False)
        self._queue.finish(item, GradeOutcome.infrastructure(reason, details, item.attempts))

    def _slot_loop(self, slot: int) -> None:
        while batch := self._queue.take(self.batch_size, self.workers):
            try:
                self._serve_batch(slot, batch)
            except BaseException as exc:  # noqa: BLE001 - a bug here must not leave run_many waiting
                log.exception("grading slot %d failed", slot)
                with contextlib.suppress(BaseException):
                    self._replace_worker(slot)
                for item in batch:  # finish() ignores the items this batch already answered
                    self._queue.finish(item, GradeOutcome.infrastructure("pool_error", repr(exc), item.attempts + 1))

    def _serve_batch(self, slot: int, batch: list[_Item]) -> None:
        try:
            worker = self._worker_for(slot)
        except WorkerStartError as exc:
            self._replace_worker(slot)
            self._queue.put(batch[1:])
            self._infrastructure_failure(batch[0], "sandbox_start_failed", str(exc))
            return
        room = max(1, self.recycle_after - worker.jobs_done)  # never run past recycle_after on one worker
        size = 0
        for count, item in enumerate(batch):  # and keep the frame under MAX_FRAME_BYTES
            size += len(item.encoded)
            if count >= room or (count and batch_frame_size(size, count + 1) > MAX_FRAME_BYTES):
                self._queue.put(batch[count:])
                batch = batch[:count]
                break
        stream = any(item.stream for item in batch)
        try:
            worker.send(encode_batch_frame([item.encoded for item in batch], stream))
        except OSError as exc:
            self._replace_worker(slot)
            self._queue.put(batch[1:])
            self._infrastructure_failure(batch[0], "worker_died", f"sending failed: {exc}")
            return
        self._collect(slot, worker, batch, stream)

    def _collect(self, slot: int, worker: _WorkerProcess, batch: list[_Item], stream: bool) -> None:
        """Read the batch's replies.  Outcomes are handed out only after the worker was dealt with
        (replaced after a fault), so when run_many returns, stats and worker_pids() are settled."""
        # The worker sends a frame at the latest REPLY_FLUSH_S after the job that follows its last one.
        budget = self.limits.wall_time_s + JOB_CHILD_GRACE_S + HOST_REPLY_SLACK_S + REPLY_FLUSH_S
        reply_bytes = reply_bytes_bound(self.limits.max_details_chars)
        graded: list[tuple[_Item, GradeOutcome]] = []
        faults: list[tuple[_Item, str, str]] = []
        answered = 0
        lost: ProtocolError | None = None
        retire = False
        while answered < len(batch) and not retire:
            try:
                replies = worker.receive(time.monotonic() + budget, len(batch) - answered, reply_bytes)
            except ProtocolError as exc:
                lost = exc
                break
            for reply in replies:
                item = batch[answered]
                answered += 1
                worker.jobs_done += 1
                if reply["status"] == GRADED:
                    graded.append((item, GradeOutcome.from_reply(reply, item.attempts + 1)))
                else:
                    faults.append((item, str(reply.get("reason")), str(reply.get("details"))))
                if reply.get("retire"):
                    retire = True  # the worker exits after this reply; the rest go back
                    break
        if lost is not None:
            self._worker_lost(slot, worker, batch[answered:], stream, lost)
        else:
            if retire or faults:
                self._replace_worker(slot)  # recycle after any fault, so a retry never meets the same worker
            self._queue.put(batch[answered:])
        for item, reason, details in faults:
            self._infrastructure_failure(item, reason, details)
        for item, outcome in graded:
            self._queue.finish(item, outcome)

    def _worker_lost(
        self, slot: int, worker: _WorkerProcess, unanswered: list[_Item], stream: bool, exc: ProtocolError
    ) -> None:
        """The worker died, hung or garbled its channel with ``unanswered`` jobs of its batch left.

        Answered jobs keep their outcomes.  When the culprit is certain -- one job left, or replies
        were streamed one frame each -- that job is charged an attempt and the others go back
        uncharged (as they always did).  Otherwise the worker may have finished some of them without
        sending their replies yet, so none is charged: all go back to be sent again with streamed
        replies, where a second failure pins the job that was running.
        """
        reason = "worker_timeout" if "timed out" in str(exc) else (
            "garbled_reply" if "garbled" in str(exc) or "JSON" in str(exc) else "worker_died")
        tail = worker.stderr_tail()
        self._replace_worker(slot)
        if stream or len(unanswered) == 1:
            self._queue.put(unanswered[1:])
            self._infrastructure_failure(unanswered[0], reason, f"{exc}{said(tail)}")
            return
        log.warning("grading worker lost (%s) with %d jobs unanswered, sending them again one reply per frame: %s",
                    reason, len(unanswered), f"{exc}{said(tail)}"[:300])
        with self._stats_lock:
            self._stats.requeued_unanswered += len(unanswered)
        for item in unanswered:
            item.stream = True
        self._queue.put(unanswered)


def said(stderr_tail: str) -> str:
    """What nsjail (or the worker) last printed, as a suffix; nothing when it printed nothing."""
    return f"; nsjail said: {stderr_tail}" if stderr_tail.strip() else ""


def _encode_job(position: int, job: dict[str, Any]) -> bytes:
    try:
        encoded = encode_json(job)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job {position} cannot be sent to a worker as JSON: {exc}") from exc
    if batch_frame_size(len(encoded), 1) > MAX_FRAME_BYTES:
        raise ValueError(f"job {position} is {len(encoded)} bytes as JSON, more than a frame holds ({MAX_FRAME_BYTES})")
    return encoded
