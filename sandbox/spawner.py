"""Run one completion as its own Python process, cheaply, from inside a worker.

Why a "zygote": starting a fresh interpreter costs ~15-20 ms of CPU per completion, which caps a
2-core machine near 100 programs/s before any grading.  Forking a warm interpreter costs ~1 ms.
But a process forked from the grader would inherit the grader's memory, including the expected
answer of the task it is being graded on (readable with ``gc.get_objects()``).  So each worker forks
one zygote at start-up, *before* it has read any job, and every completion is forked from that
zygote.  The zygote never sees a payload: it receives only file descriptors, and the completion
process reads its own code from one of them.

The completion process has exactly fds 0/1/2 (pipes to the grader); it cannot reach the worker's
protocol channel or the grader's result pipe, so printing something that looks like a reply is just
program output.

Outside a worker (sandbox="none", or direct calls in tests) the same child entry point is started
with ``subprocess`` instead.  Standard library only: this module runs inside the jail.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import io
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, NoReturn

MEMORY_ERROR_MARK = "MemoryError"
# Math and data libraries start a thread per core unless told otherwise; a completion gets one each.
THREAD_POOL_VARIABLES = (
    "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "RAYON_NUM_THREADS", "NUMBA_NUM_THREADS",
)
_MAX_REQUEST_BYTES = 16 * 1024 * 1024

# Set inside a worker by install_zygote(); inherited by forked job children.
_zygote_sock: socket.socket | None = None
_zygote_pid: int | None = None
_next_request_id = 0


class LauncherDied(Exception):
    """The zygote went away while launching or supervising a completion."""


@dataclass(frozen=True)
class ProgramLimits:
    wall_time_s: float = 10.0
    cpu_time_s: float = 10.0
    memory_mb: int = 512
    max_file_size_mb: int = 16
    max_output_bytes: int = 1_000_000
    max_processes: int | None = None  # RLIMIT_NPROC; None where a pids cgroup does the job

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProgramLimits:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class ProgramResult:
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    output_exceeded: bool = False
    launcher_died: bool = False
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def failure_reason(self) -> str | None:
        """Why the program failed in a way that is its own doing, or None if it exited 0."""
        if self.launcher_died:
            return "crash"
        if self.output_exceeded:
            return "output_limit"
        if self.timed_out or self.signal in (signal.SIGXCPU, signal.SIGALRM):
            return "timeout"
        if MEMORY_ERROR_MARK in self.stderr[-2000:]:
            return "memory_limit"
        if self.signal == signal.SIGXFSZ:
            return "file_size_limit"
        if self.exit_code != 0:
            return "crash"
        return None


# --------------------------------------------------------------------------- completion side


def _completion_main(request_fd: int) -> NoReturn:
    """Entry point of the completion process; fds 0/1/2 are already the grader's pipes."""
    code = 1
    try:
        with os.fdopen(request_fd, "rb") as request_file:
            request = json.loads(request_file.read(_MAX_REQUEST_BYTES))
        os.closerange(3, 1 << 16)
        limits = ProgramLimits.from_dict(request["limits"])
        _apply_limits(limits)
        cwd = request.get("cwd") or os.getcwd()
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update({"HOME": cwd, "TMPDIR": cwd, "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
        os.environ["PYTHONHASHSEED"] = "0"
        # One thread per math library: OpenBLAS starts a thread per core when numpy is imported, which the
        # completion's process and memory limits refuse, so a correct solution that imports numpy crashed.
        os.environ.update({name: "1" for name in THREAD_POOL_VARIABLES})
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace")
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
        )
        sys.argv = ["<completion>"]
        code = _exec_program(request["code"], request.get("epilogue"))
    except BaseException:  # noqa: BLE001 - the harness itself failing is reported like a crash
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # e.g. BrokenPipe or a closed fd
            stream.flush()
    os._exit(code)


def _apply_limits(limits: ProgramLimits) -> None:
    mib = 1024 * 1024
    # Address space is counted from what the forked interpreter already maps.
    baseline = _current_vm_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (baseline + limits.memory_mb * mib,) * 2)
    cpu = max(1, int(limits.cpu_time_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_size_mb * mib,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.max_processes is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes,) * 2)
    # SIGXFSZ/SIGXCPU must kill (default action), not be ignored as Python may have set them.
    for sig in (signal.SIGXFSZ, signal.SIGXCPU, signal.SIGPIPE, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def _current_vm_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * resource.getpagesize()
    except OSError:
        return 0


def _exec_program(code: str, epilogue: str | None) -> int:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(code, "<completion>", "exec"), namespace)
        if epilogue:
            exec(compile(epilogue, "<checks>", "exec"), namespace)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - any exception of the program is its crash
        traceback.print_exc()
        return 1
    return 0


# --------------------------------------------------------------------------- zygote


def install_zygote() -> int:
    """Fork the zygote (call before any job is read). Returns its pid."""
    global _zygote_sock, _zygote_pid
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        parent_sock.close()
        _serve_zygote(child_sock)
    child_sock.close()
    _zygote_sock, _zygote_pid = parent_sock, pid
    return pid


def _serve_zygote(sock: socket.socket) -> NoReturn:
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 4)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # the worker closed its end
        request_id = json.loads(msg)["id"]
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            sock.close()
            for target, fd in zip((0, 1, 2), fds[1:], strict=True):
                os.dup2(fd, target)
            _completion_main(fds[0])
        for fd in fds:
            os.close(fd)
        try:
            sock.send(json.dumps({"id": request_id, "pid": pid}).encode())
            _, status = os.waitpid(pid, 0)
            sock.send(json.dumps({"id": request_id, "status": status}).encode())
        except OSError:
            os._exit(0)


def zygote_pid() -> int | None:
    return _zygote_pid


def zygote_fd() -> int | None:
    """The worker's end of the zygote socket (it hangs up as soon as the zygote is gone)."""
    return _zygote_sock.fileno() if _zygote_sock is not None else None


_default_limits = ProgramLimits()


def set_default_limits(limits: ProgramLimits) -> None:
    """Limits used by run_program() when the caller passes none (the worker sets its job limits)."""
    global _default_limits
    _default_limits = limits


# --------------------------------------------------------------------------- grader side


class _Launcher(abc.ABC):
    """Starts the completion process and reports its wait status."""

    pid: int

    def status_fd(self) -> int | None:
        return None

    @abc.abstractmethod
    def poll_status(self, block_until: float | None) -> int | None:
        """The wait status once the process has exited (waiting until ``block_until``), else None."""


class _ZygoteLauncher(_Launcher):
    def __init__(self, sock: socket.socket, fds: list[int], deadline: float) -> None:
        global _next_request_id
        _next_request_id += 1
        self._id = _next_request_id
        self._sock = sock
        socket.send_fds(sock, [json.dumps({"id": self._id}).encode()], fds)
        reply = self._receive(deadline + 5.0)
        if reply is None or "pid" not in reply:
            raise LauncherDied("zygote did not report a pid")
        self.pid = int(reply["pid"])

    def _receive(self, until: float) -> dict[str, Any] | None:
        """Next message for this request; None if none arrived by ``until``; raises if the zygote died."""
        while True:
            left = until - time.monotonic()
            if not select.select([self._sock], [], [], max(0.0, left))[0]:
                return None
            data = self._sock.recv(4096)
            if not data:
                raise LauncherDied("zygote closed its socket")
            message: dict[str, Any] = json.loads(data)
            if message.get("id") == self._id:  # stale replies of a killed earlier job are skipped
                return message

    def status_fd(self) -> int | None:
        return self._sock.fileno()

    def poll_status(self, block_until: float | None) -> int | None:
        reply = self._receive(block_until if block_until is not None else time.monotonic())
        return None if reply is None else int(reply["status"])


class _SubprocessLauncher(_Launcher):
    def __init__(self, fds: list[int]) -> None:
        request_fd = fds[0]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", f"from nodus.sandbox.spawner import _completion_main as m; m({request_fd})"],
            stdin=fds[1],
            stdout=fds[2],
            stderr=fds[3],
            pass_fds=(request_fd,),
            env={"PYTHONHASHSEED": "0", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            start_new_session=True,
        )
        self.pid = self._proc.pid

    def poll_status(self, block_until: float | None) -> int | None:
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._proc.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from waiting again
                return status
            if block_until is None or time.monotonic() >= block_until:
                return None
            time.sleep(0.005)


def run_program(
    code: str,
    stdin: str = "",
    limits: ProgramLimits | None = None,
    epilogue: str | None = None,
    cwd: str | None = None,
) -> ProgramResult:
    """Run ``code`` (then ``epilogue`` in the same namespace) as a separate process; bounded output."""
    limits = limits or _default_limits
    started = time.monotonic()
    deadline = started + limits.wall_time_s
    request = json.dumps(
        {"code": code, "epilogue": epilogue, "cwd": cwd or os.getcwd(), "limits": limits.__dict__}
    ).encode()
    req_r, req_w = os.pipe()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    child_fds = [req_r, in_r, out_w, err_w]
    launcher: _Launcher
    try:
        if _zygote_sock is not None:
            launcher = _ZygoteLauncher(_zygote_sock, child_fds, deadline)
        else:
            launcher = _SubprocessLauncher(child_fds)
    except (LauncherDied, OSError) as exc:
        for fd in (*child_fds, req_w, in_w, out_r, err_r):
            os.close(fd)
        return ProgramResult(None, None, "", "", launcher_died=True, notes=[f"launch failed: {exc}"])
    finally:
        if "launcher" in locals():
            for fd in child_fds:
                os.close(fd)
    return _supervise(launcher, request, stdin.encode(), req_w, in_w, out_r, err_r, limits, started)


def _supervise(
    launcher: _Launcher,
    request: bytes,
    stdin_data: bytes,
    req_w: int,
    in_w: int,
    out_r: int,
    err_r: int,
    limits: ProgramLimits,
    started: float,
) -> ProgramResult:
    deadline = started + limits.wall_time_s
    pending = {req_w: memoryview(request), in_w: memoryview(stdin_data)}
    for fd in pending:
        os.set_blocking(fd, False)
    captured = {out_r: bytearray(), err_r: bytearray()}
    open_readers = {out_r, err_r}
    timed_out = output_exceeded = launcher_died = False
    status: int | None = None
    notes: list[str] = []

    def kill() -> None:
        with contextlib.suppress(OSError):
            os.kill(launcher.pid, signal.SIGKILL)

    try:
        while status is None:
            now = time.monotonic()
            if now >= deadline and not timed_out:
                timed_out = True
                kill()
            status_fd = launcher.status_fd()
            readers = list(open_readers) + ([status_fd] if status_fd is not None else [])
            writers = [fd for fd, data in pending.items() if data]
            wait = max(0.0, deadline - now) if not timed_out else 1.0
            if status_fd is None:
                wait = min(wait, 0.01)  # subprocess launcher: poll waitpid
            ready_r, ready_w, _ = select.select(readers, writers, [], wait)
            for fd in ready_w:
                try:
                    sent = os.write(fd, pending[fd][:65536])
                    pending[fd] = pending[fd][sent:]
                except BrokenPipeError:
                    pending[fd] = memoryview(b"")
                if not pending[fd]:
                    os.close(fd)
                    del pending[fd]
            for fd in ready_r:
                if fd == status_fd:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_readers.discard(fd)
                    continue
                captured[fd] += chunk
                if len(captured[out_r]) + len(captured[err_r]) > limits.max_output_bytes and not output_exceeded:
                    output_exceeded = True
                    kill()
            if status_fd is None or status_fd in ready_r or timed_out:
                try:
                    status = launcher.poll_status(time.monotonic() + 5.0 if timed_out else None)
                except LauncherDied as exc:
                    launcher_died = True
                    notes.append(str(exc))
                    kill()
                    break
                if status is None and timed_out and status_fd is not None:
                    break
    finally:
        # The process is gone (or was killed); grandchildren may still hold the pipes open, so take
        # what is buffered without waiting for EOF.
        for fd in list(open_readers):
            os.set_blocking(fd, False)
            try:
                while len(captured[fd]) <= limits.max_output_bytes and (chunk := os.read(fd, 65536)):
                    captured[fd] += chunk
            except BlockingIOError:
                pass
        for fd in (*pending, out_r, err_r):
            os.close(fd)
    budget = limits.max_output_bytes
    stdout = bytes(captured[out_r][:budget]).decode("utf-8", errors="replace")
    stderr = bytes(captured[err_r][: max(0, budget - len(captured[out_r]))]).decode("utf-8", errors="replace")
    exit_code = sig = None
    if status is not None:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
        else:
            exit_code = os.waitstatus_to_exitcode(status)
    return ProgramResult(
        exit_code=exit_code,
        signal=sig,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        output_exceeded=output_exceeded,
        launcher_died=launcher_died,
        wall_s=time.monotonic() - started,
        notes=notes,
    )
