"""A pool of long-lived jailed workers that grade batches of jobs, with retries on fresh workers."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
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
from .outcome import GRADED, GradeOutcome, PoolStats
from .protocol import ProtocolError, read_frame, write_frame
from .worker import JOB_CHILD_GRACE_S, Worker

log = logging.getLogger("nodus.sandbox")

# Beyond the job's own wall time, how long the host waits for a reply before declaring the worker
# hung (first use of a target imports its module inside the worker, which can take seconds).
HOST_REPLY_SLACK_S = 15.0
MAX_ATTEMPTS = 3  # first try + 2 retries, each on a fresh worker


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
            raise WorkerStartError(f"sandbox could not start: {exc}; nsjail said: {self.stderr_tail()}") from exc
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

    def send(self, jobs: Sequence[dict[str, Any]]) -> None:
        write_frame(self._in_fd, {"jobs": list(jobs)})

    def receive(self, deadline: float) -> dict[str, Any]:
        reply = read_frame(self._out_fd, deadline, max_bytes=1024 * 1024)
        if not isinstance(reply, dict) or reply.get("status") not in (GRADED, "infrastructure_failure"):
            raise ProtocolError(f"garbled reply {str(reply)[:200]}")
        return reply

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


@dataclasses.dataclass
class _Item:
    index: int
    job: dict[str, Any]
    attempts: int = 0


class _WorkQueue:
    """Jobs waiting to be graded; retries go to the front.  take() returns [] once all are done."""

    def __init__(self, items: list[_Item]) -> None:
        self._items = collections.deque(items)
        self._unfinished = len(items)
        self._cond = threading.Condition()

    def take(self, at_most: int, slots: int) -> list[_Item]:
        with self._cond:
            while not self._items and self._unfinished:
                self._cond.wait()
            # Split what is left evenly so one slot does not take everything.
            n = max(1, min(at_most, -(-len(self._items) // max(1, slots))))
            return [self._items.popleft() for _ in range(min(n, len(self._items)))]

    def put_back(self, items: Sequence[_Item], front: bool = True) -> None:
        with self._cond:
            if front:
                self._items.extendleft(reversed(items))
            else:
                self._items.extend(items)
            self._cond.notify_all()

    def finished(self) -> None:
        with self._cond:
            self._unfinished -= 1
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
        batch_size: int = 16,
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
        self._run_lock = threading.Lock()
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
        for position, job in enumerate(jobs):
            try:
                json.dumps(job, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"job {position} cannot be sent to a worker as JSON: {exc}") from exc
        results: list[GradeOutcome | None] = [None] * len(jobs)
        if self.mode == "none":
            self._run_unsandboxed(jobs, results)
        else:
            self.start()
            with self._run_lock:
                queue = _WorkQueue([_Item(i, dict(job)) for i, job in enumerate(jobs)])
                threads = [
                    threading.Thread(target=self._slot_loop, args=(slot, queue, results), daemon=True)
                    for slot in range(min(self.workers, max(1, len(jobs))))
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        final = [r if r is not None else GradeOutcome.infrastructure("lost", "no result", 0) for r in results]
        with self._stats_lock:
            self._stats.jobs += len(final)
            self._stats.graded += sum(1 for r in final if not r.is_infrastructure_failure)
            self._stats.infrastructure_failures += sum(1 for r in final if r.is_infrastructure_failure)
        return final

    def _run_unsandboxed(self, jobs: Sequence[dict[str, Any]], results: list[GradeOutcome | None]) -> None:
        message = (
            f"nodus.sandbox: grading {len(jobs)} job(s) with sandbox='none', in this process, without "
            "isolation or limits other than wall time; only for trusted graders"
        )
        log.warning(message)
        warnings.warn(message, UnsandboxedGradingWarning, stacklevel=3)
        worker = Worker({"limits": self.limits.model_dump(), "isolate": False},
                        use_alarm=threading.current_thread() is threading.main_thread())
        for i, job in enumerate(jobs):
            for attempt in range(1, MAX_ATTEMPTS + 1):
                reply = worker.run_job(job)
                if reply["status"] == GRADED or attempt == MAX_ATTEMPTS:
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

    def _infrastructure_failure(
        self, queue: _WorkQueue, results: list[GradeOutcome | None], item: _Item, reason: str, details: str
    ) -> None:
        item.attempts += 1
        if item.attempts < MAX_ATTEMPTS:
            log.warning("grading infrastructure failure (%s), retrying on a fresh worker: %s", reason, details[:300])
            self._count_infra_attempt(retry=True)
            queue.put_back([item])
            return
        log.error("grading infrastructure failure (%s) after %d attempts: %s", reason, item.attempts, details[:300])
        self._count_infra_attempt(retry=False)
        results[item.index] = GradeOutcome.infrastructure(reason, details, item.attempts)
        queue.finished()

    def _slot_loop(self, slot: int, queue: _WorkQueue, results: list[GradeOutcome | None]) -> None:
        batch: list[_Item] = []
        try:
            self._serve_slot(slot, queue, results)
        except BaseException as exc:  # noqa: BLE001 - a bug here must not leave run_many waiting
            log.exception("grading slot %d failed", slot)
            self._replace_worker(slot)
            while batch := queue.take(self.batch_size, 1):
                for item in batch:
                    results[item.index] = GradeOutcome.infrastructure("pool_error", repr(exc), item.attempts + 1)
                    queue.finished()

    def _serve_slot(self, slot: int, queue: _WorkQueue, results: list[GradeOutcome | None]) -> None:
        while batch := queue.take(self.batch_size, self.workers):
            try:
                worker = self._worker_for(slot)
            except WorkerStartError as exc:
                self._replace_worker(slot)
                queue.put_back(batch[1:])
                self._infrastructure_failure(queue, results, batch[0], "sandbox_start_failed", str(exc))
                continue
            room = max(1, self.recycle_after - worker.jobs_done)
            if len(batch) > room:  # never run past recycle_after on one worker
                queue.put_back(batch[room:])
                batch = batch[:room]
            try:
                worker.send([item.job for item in batch])
            except OSError as exc:
                self._replace_worker(slot)
                queue.put_back(batch[1:])
                self._infrastructure_failure(queue, results, batch[0], "worker_died", f"sending failed: {exc}")
                continue
            self._collect(slot, worker, batch, queue, results)

    def _collect(
        self, slot: int, worker: _WorkerProcess, batch: list[_Item], queue: _WorkQueue,
        results: list[GradeOutcome | None],
    ) -> None:
        budget = self.limits.wall_time_s + JOB_CHILD_GRACE_S + HOST_REPLY_SLACK_S
        fault = False
        for position, item in enumerate(batch):
            try:
                reply = worker.receive(time.monotonic() + budget)
            except ProtocolError as exc:
                reason = "worker_timeout" if "timed out" in str(exc) else (
                    "garbled_reply" if "garbled" in str(exc) or "JSON" in str(exc) else "worker_died")
                tail = worker.stderr_tail()
                self._replace_worker(slot)
                queue.put_back(batch[position + 1:])
                self._infrastructure_failure(queue, results, item, reason, f"{exc}; nsjail said: {tail}")
                return
            worker.jobs_done += 1
            if reply["status"] == GRADED:
                results[item.index] = GradeOutcome.from_reply(reply, item.attempts + 1)
                queue.finished()
            else:
                fault = True
                self._infrastructure_failure(queue, results, item, str(reply.get("reason")), str(reply.get("details")))
            if reply.get("retire"):
                queue.put_back(batch[position + 1:])
                self._replace_worker(slot)
                return
        if fault:
            self._replace_worker(slot)  # recycle after any fault, so a retry never meets the same worker
