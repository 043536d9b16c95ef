"""The long-lived grading worker that runs as pid 1 inside one nsjail.

Started as ``python -m nodus.sandbox '<json config>'`` (sandbox/__main__.py).  It speaks the frame protocol on
private duplicates of the fds 0/1 it was started with, and points 0/1 at /dev/null, so nothing a
grader or a completion prints can be mistaken for a reply.

Being pid 1 of its pid namespace matters: the kernel drops SIGKILL/SIGSTOP sent to a namespace's
init from inside the namespace, so no completion can kill the worker, and after each job the worker
can SIGKILL every other process of the namespace (except the zygote, see spawner.py).

Per-completion isolation (``isolate`` in the config) -- measured choice, see benchmarks:
  * a fresh inner nsjail per job costs ~30 ms (python start in a new jail): <= ~60 jobs/s on 2 cores;
  * fork a job child per job from this warm worker, in its own fresh /tmp/job-N, then kill every
    process the job left (walking /proc: a double-forked daemon escapes its process group, not the
    pid namespace) and wipe /tmp: ~2-4 ms per job.  SysV IPC is denied by seccomp and there is no
    /dev/shm, so no shared memory survives a job.  We use this.

Standard library only (plus this package's stdlib-only modules): startup speed matters for recycling.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import resource
import select
import shutil
import signal
import stat
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import spawner
from .protocol import (
    FrameTimeout,
    InvalidGraderResult,
    ProtocolError,
    encode_frame,
    read_frame,
    validate_grader_result,
    write_all,
    write_frame,
)

PROBE_OK = "nodus-sandbox-probe-ok"
JOB_CHILD_GRACE_S = 1.0  # the job child gets this much beyond wall_time_s before it is killed
# A worker sends the replies it holds at the latest this long after its previous frame (checked
# after each job), so the host hears at least every REPLY_FLUSH_S + one job's time.
REPLY_FLUSH_S = 0.02
_PR_SET_DUMPABLE = 4
# A grader's preparation (loading its environment, warm_up()) runs before a job's wall time, inside the host's slack
# for a reply (pool.HOST_REPLY_SLACK_S, 15 s): past this it is reported at once as the grader's failure, where the
# host would have waited out its budget, declared the worker hung and tried twice more.
PREPARE_LIMIT_S = 12.0
PREPARE_TOO_SLOW = (
    f"preparing the grader (its environment's warm_up()) took more than {PREPARE_LIMIT_S:g} s, the sandbox's budget "
    "for loading it; load less there (a lazy import, a cached table) or build it when the distribution is installed"
)
# In a jail the worker is pid 1 and the zygote, its first child, pid 2: the pids the seccomp policy protects.
ZYGOTE_PID = 2
_targets: dict[str, Callable[[dict[str, Any]], Any]] = {}


class JobTimeout(BaseException):
    """Raised in an in-process grader by SIGALRM; BaseException so `except Exception` won't eat it."""


def _set_not_dumpable() -> None:
    # Non-dumpable processes cannot be inspected via /proc/<pid>/mem etc. by same-uid processes.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def resolve_target(spec: str) -> Callable[[dict[str, Any]], Any]:
    if spec not in _targets:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"target {spec!r} is not of the form 'module:function'")
        function = getattr(importlib.import_module(module_name), attr)
        if not callable(function):
            raise TypeError(f"target {spec!r} is not callable")
        _targets[spec] = function
    return _targets[spec]


def graded(score: float, passed: bool, reason: str, details: str) -> dict[str, Any]:
    return {"status": "graded", "score": score, "passed": passed, "reason": reason, "details": details}


def infrastructure(reason: str, details: str) -> dict[str, Any]:
    return {"status": "infrastructure_failure", "reason": reason, "details": details[-4000:]}


class Worker:
    def __init__(self, config: dict[str, Any], use_alarm: bool = True) -> None:
        self.use_alarm = use_alarm
        self.limits: dict[str, Any] = config["limits"]
        self.isolate = bool(config.get("isolate"))
        # In a borrowed process (sandbox="none": the trainer's own), Ctrl-C and SIGTERM (raised as KeyboardInterrupt)
        # are the user stopping the run, not the grader failing: they propagate.
        self.borrowed = bool(config.get("borrowed"))
        self.jobs_run = 0
        self.zygote_pid = 0
        spawner_limits = {k: v for k, v in self.limits.items() if k in spawner.ProgramLimits.__dataclass_fields__}
        if config.get("rlimit_nproc_per_completion"):
            spawner_limits["max_processes"] = self.limits["max_processes"]
        self.program_limits = spawner.ProgramLimits.from_dict(spawner_limits)
        spawner.set_default_limits(self.program_limits)
        self._wall_time_s = float(self.limits["wall_time_s"])
        self._max_details_chars = int(self.limits["max_details_chars"])
        self._alarm_installed = False
        self._in_job = False
        self._timer_armed = False
        self._job_deadline = 0.0
        self._zygote_poll: select.poll | None = None

    # ----------------------------------------------------------------- one job

    def run_job(self, job: Any) -> dict[str, Any]:
        self.jobs_run += 1
        try:
            if not isinstance(job, dict) or not isinstance(job.get("payload"), dict):
                raise ValueError("job must be {'target': 'module:function', 'payload': {...}}")
            target = resolve_target(str(job.get("target")))
        except BaseException as error:  # noqa: BLE001 - an unimportable target is the grader's bug
            self._propagate_a_stop(error)
            return infrastructure("grader_error", traceback.format_exc())
        # A target's `prepare(payload)` loads what it needs (e.g. the environment) before the limit starts: loading
        # is the worker's cost, not the completion's (in a job child, inherited through the fork, loaded once).
        prepare = getattr(target, "prepare", None)
        if prepare is not None:
            try:
                self._bounded(PREPARE_LIMIT_S, prepare, job["payload"])
            except JobTimeout:
                return infrastructure("grader_error", PREPARE_TOO_SLOW)
            except BaseException as error:  # noqa: BLE001 - a grader that cannot load is the grader's bug
                self._propagate_a_stop(error)
                return infrastructure("grader_error", traceback.format_exc())
        if self.isolate:
            return self._run_in_job_child(target, job["payload"])
        try:
            return self._run_in_process(target, job["payload"])
        except JobTimeout:  # the alarm landed between the job's end and its bookkeeping
            return graded(0.0, False, "timeout", f"grading exceeded {self.limits['wall_time_s']}s wall time")

    def _bounded(self, seconds: float, function: Callable[[Any], Any], argument: Any) -> Any:
        """``function(argument)``, raising JobTimeout past ``seconds`` where the worker owns its alarm."""
        if not self._alarm_installed:  # a borrowed process (sandbox "none"): no timer of ours to arm
            return function(argument)
        self._job_deadline = time.monotonic() + seconds
        self._in_job = True
        self._timer_armed = True
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return function(argument)
        finally:
            self._in_job = False

    def _propagate_a_stop(self, error: BaseException) -> None:
        if self.borrowed and isinstance(error, KeyboardInterrupt):
            raise error

    def _finish(self, result: Any) -> dict[str, Any]:
        try:
            checked = validate_grader_result(result, self._max_details_chars)
        except InvalidGraderResult as exc:
            return infrastructure("grader_error", f"invalid grader result: {exc}")
        checked["status"] = "graded"
        return checked

    def install_alarm(self) -> None:
        """Install the SIGALRM handler once, for a worker that owns its process (serve()).

        Each job records its deadline and arms the timer for it (one syscall; it is never disarmed,
        which would be a second, as costly as a cheap grader's work in a VM).  When it fires, the
        handler raises JobTimeout if the running job is past its deadline, re-arms the timer for the
        job's deadline if it is not (a grader's own nested timer may have fired it early), and does
        nothing between jobs.
        """
        signal.signal(signal.SIGALRM, self._on_alarm)
        self._alarm_installed = True

    def _on_alarm(self, _signum: int, _frame: object) -> None:
        self._timer_armed = False
        if not self._in_job:
            return
        left = self._job_deadline - time.monotonic()
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left)
            self._timer_armed = True
            return
        raise JobTimeout()

    def _run_in_process(self, target: Callable[[dict[str, Any]], Any], payload: dict[str, Any]) -> dict[str, Any]:
        if not self.use_alarm:  # signals only reach the main thread (sandbox="none" from a thread)
            try:
                return self._finish(target(payload))
            except BaseException as error:  # noqa: BLE001
                self._propagate_a_stop(error)
                return infrastructure("grader_error", traceback.format_exc())
        previous = None if self._alarm_installed else signal.signal(signal.SIGALRM, self._on_alarm)
        self._job_deadline = time.monotonic() + self._wall_time_s
        self._in_job = True
        # Armed for this job's own deadline, every job: a grader that nests a shorter limit of its own (math-answer's
        # parse limit) reads the time left with getitimer, and a timer still pending for an earlier job's deadline
        # cut a correct answer's parse short, graded 0 as too slow.
        self._timer_armed = True
        signal.setitimer(signal.ITIMER_REAL, self._wall_time_s)
        try:
            return self._finish(target(payload))
        except JobTimeout:
            return graded(0.0, False, "timeout", f"grading exceeded {self.limits['wall_time_s']}s wall time")
        except BaseException as error:  # noqa: BLE001 - the grader raising is infrastructure, never a 0
            self._propagate_a_stop(error)
            return infrastructure("grader_error", traceback.format_exc())
        finally:
            self._in_job = False
            if previous is not None:  # a borrowed process (sandbox="none"): leave no timer, restore
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._timer_armed = False
                signal.signal(signal.SIGALRM, previous)

    def _run_in_job_child(self, target: Callable[[dict[str, Any]], Any], payload: dict[str, Any]) -> dict[str, Any]:
        workdir = f"/tmp/job-{self.jobs_run}"
        os.mkdir(workdir, 0o700)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # job child
            os.close(read_fd)
            self._job_child(target, payload, workdir, write_fd)
        os.close(write_fd)
        wall = float(self.limits["wall_time_s"])
        # A result is details (cut to max_details_chars, <= 4 bytes/char in UTF-8 JSON escapes 6) + small.
        max_result = self.limits["max_details_chars"] * 6 + 4096
        try:
            message = read_frame(read_fd, time.monotonic() + wall + JOB_CHILD_GRACE_S, max_bytes=max_result)
        except FrameTimeout:
            return graded(0.0, False, "timeout", f"job exceeded {wall}s wall time")
        except ProtocolError as exc:
            status = self._kill_and_wait(pid)
            return self._classify_child_death(status, str(exc))
        finally:
            os.close(read_fd)
            self._kill_and_wait(pid)
            self._clean_namespace(workdir)
        if "error" in message:
            return infrastructure("grader_error", str(message["error"]))
        return self._finish(message.get("result"))

    def _job_child(
        self, target: Callable[[dict[str, Any]], Any], payload: dict[str, Any], workdir: str, out_fd: int
    ) -> None:
        try:
            # The completion it grades may signal it: SIGINT would raise KeyboardInterrupt here, which was reported
            # as the grader's error (an infrastructure failure) instead of the completion's doing.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            os.chdir(workdir)
            os.environ["TMPDIR"] = workdir
            os.environ["HOME"] = workdir
            # A grader that runs completion code in-process is bounded like a completion process.
            mib = 1024 * 1024
            statm = open("/proc/self/statm").read().split()  # noqa: SIM115
            vm = int(statm[0]) * resource.getpagesize()
            resource.setrlimit(resource.RLIMIT_AS, (vm + int(self.limits["memory_mb"]) * mib,) * 2)
            cpu = max(1, int(float(self.limits["cpu_time_s"]) + 0.999))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            signal.signal(signal.SIGXCPU, signal.SIG_DFL)
            try:
                message: dict[str, Any] = {"result": target(payload)}
                # Validate and cut here, so a huge details string never crosses the pipe.
                message["result"] = validate_grader_result(message["result"], self._max_details_chars)
            except InvalidGraderResult as exc:
                message = {"error": f"invalid grader result: {exc}"}
            except BaseException:  # noqa: BLE001
                message = {"error": traceback.format_exc()[-4000:]}
            write_all(out_fd, encode_frame(message))
        finally:
            os._exit(0)

    def _kill_and_wait(self, pid: int) -> int | None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None

    def _classify_child_death(self, status: int | None, problem: str) -> dict[str, Any]:
        # The job child runs completion-influenced code: its death without a result is the
        # completion's doing (it crashed the grader, exhausted limits, or exited early).
        if "more than the" in problem:
            return graded(0.0, False, "output_limit", "result exceeded the output limit")
        if status is not None and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU:
                return graded(0.0, False, "timeout", "job exceeded its CPU time")
            return graded(0.0, False, "crash", f"job process killed by {signal.Signals(sig).name}")
        code = os.waitstatus_to_exitcode(status) if status is not None else None
        return graded(0.0, False, "exited_without_result", f"job process exited ({code}) without a result")

    def _clean_namespace(self, workdir: str | None = None) -> None:
        """Kill every process but us and the zygote, reap, and empty /tmp.

        Every process is found by walking /proc (not /proc/*/children, which the kernel documents
        as unreliable while processes fork and exit, as a double-forking completion can keep doing).
        /tmp: when, with every job process gone, its only entry is the job's still-empty workdir, the
        job wrote nothing, and removing that directory leaves /tmp empty; anything else, or any
        doubt (a symlink, a permission changed), takes the full recursive cleanup.
        """
        keep = {os.getpid(), self.zygote_pid}
        for _ in range(200):
            stray = [pid for pid in _live_pids() if pid not in keep]
            if not stray:
                break
            for pid in stray:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self._reap()
            time.sleep(0.001)
        self._reap()
        if TMP_SCAFFOLD or workdir is None or not _remove_if_only_empty_dir("/tmp", workdir):
            _empty_tmp("/tmp", os.lstat("/tmp").st_dev)

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.zygote_pid:
                self.zygote_pid = -1

    def zygote_alive(self) -> bool:
        self._reap()
        if self.zygote_pid <= 0:
            return False
        # A killed zygote closes its socket before its parent can reap it: check the hang-up too,
        # or a job right after the one that killed it could meet a zygote that is dying.
        if self._zygote_poll is not None and any(
            events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, events in self._zygote_poll.poll(0)
        ):
            return False
        try:
            os.kill(self.zygote_pid, 0)
        except OSError:
            return False
        return True

    # ----------------------------------------------------------------- serving

    def serve(self, proto_in: int, proto_out: int) -> None:
        """Grade batches ``{"stream": bool, "jobs": [...]}``; answer with frames ``{"replies": [...]}``.

        The replies of a batch, in job order, go back in as few frames as possible: one when the batch
        is done, or earlier once REPLY_FLUSH_S have passed since the last frame (so the host sees
        progress and can bound the wait for the next frame).  With ``stream`` every reply is its own
        frame: the host asks for that after a worker died with several jobs unanswered, so that a
        second death pins the job that was running.
        """
        self.zygote_pid = spawner.install_zygote()
        if os.getpid() == 1 and self.zygote_pid != ZYGOTE_PID:
            # The jail's seccomp policy keeps completions away from pids 1 and 2 (jail.SECCOMP_POLICY).
            raise RuntimeError(f"the zygote is pid {self.zygote_pid}, not {ZYGOTE_PID}: the jail would not protect it")
        fd = spawner.zygote_fd()
        if fd is not None:
            self._zygote_poll = select.poll()
            self._zygote_poll.register(fd, select.POLLHUP)
        self.install_alarm()
        write_frame(proto_out, {"ready": True})
        while True:
            try:
                batch = read_frame(proto_in)
            except ProtocolError:
                return  # host closed the channel: exit, nsjail tears the namespace down
            jobs = batch.get("jobs", []) if isinstance(batch, dict) else []
            stream = bool(batch.get("stream")) if isinstance(batch, dict) else True
            pending: list[dict[str, Any]] = []
            last_frame = time.monotonic()
            for position, job in enumerate(jobs, 1):
                reply = self.run_job(job)
                retire = not self.zygote_alive()
                if retire:
                    # A completion killed the zygote.  A new one forked from here would carry the
                    # payloads this worker has seen, so retire and let the host start a fresh worker.
                    reply["retire"] = True
                pending.append(reply)
                if stream or retire or position == len(jobs) or time.monotonic() - last_frame >= REPLY_FLUSH_S:
                    write_frame(proto_out, {"replies": pending})
                    pending = []
                    last_frame = time.monotonic()
                if retire:
                    return


def _live_pids() -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat_file:
                state = stat_file.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):  # zombies are reaped by their parent (or us), not killable
            pids.append(int(name))
    return pids


def _remove_if_only_empty_dir(parent: str, directory: str) -> bool:
    """Remove ``directory`` and return True if it is the only entry of ``parent`` and is empty."""
    try:
        with os.scandir(parent) as entries:
            only = list(entries)
        if len(only) != 1 or only[0].path != directory or not only[0].is_dir(follow_symlinks=False):
            return False
        with os.scandir(directory) as entries:
            if next(entries, None) is not None:
                return False
        os.rmdir(directory)
    except OSError:
        return False
    return True


def _empty_tmp(path: str, tmpfs_device: int) -> None:
    """Empty the jail's /tmp, keeping only the mount points and the directories that lead to them.

    A mount point (a read-only host path, on another device) is left alone; a scaffolding directory is
    emptied of everything a job put there, recursively; everything else goes.
    """
    for entry in os.scandir(path):
        try:
            if entry.stat(follow_symlinks=False).st_dev != tmpfs_device:
                continue
            if entry.path in TMP_SCAFFOLD and entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
                _empty_tmp(entry.path, tmpfs_device)
                continue
        except OSError:
            pass
        _remove_entry(entry)


def _remove_entry(entry: os.DirEntry[str]) -> None:
    def make_writable_and_retry(function: Callable[..., Any], failed: str, _exc: BaseException) -> None:
        os.chmod(os.path.dirname(failed), stat.S_IRWXU)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, stat.S_IRWXU)
            shutil.rmtree(failed, ignore_errors=True)
        else:
            os.unlink(failed)

    try:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, onexc=make_writable_and_retry)
        else:
            os.unlink(entry.path)
    except OSError:
        pass


# The directories /tmp holds before any job runs: the parents nsjail made for mount points when the checkout
# or venv lives under the host's /tmp. Cleanup keeps them (and the mounts) and empties them of anything else.
TMP_SCAFFOLD: frozenset[str] = frozenset()


def _scaffold_directories(root: str) -> frozenset[str]:
    device = os.lstat(root).st_dev
    found: set[str] = set()
    for directory, subdirectories, _ in os.walk(root):
        on_tmpfs = [name for name in subdirectories if os.lstat(os.path.join(directory, name)).st_dev == device]
        found.update(os.path.join(directory, name) for name in on_tmpfs)
        subdirectories[:] = on_tmpfs  # never walk into a mounted host path
    return frozenset(found)


def main(argv: list[str]) -> int:
    global TMP_SCAFFOLD
    TMP_SCAFFOLD = _scaffold_directories("/tmp")
    config = __import__("json").loads(argv[1])
    if config.get("probe"):
        print(PROBE_OK)
        return 0
    proto_in, proto_out = os.dup(0), os.dup(1)  # os.dup makes them non-inheritable
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    _set_not_dumpable()
    if os.getpid() == 1:
        # As the namespace's init, the kernel drops a signal from inside that finds no handler: with Python's SIGINT
        # handler gone, no completion can raise KeyboardInterrupt in the worker by any route the policy missed.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    Worker(config).serve(proto_in, proto_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
