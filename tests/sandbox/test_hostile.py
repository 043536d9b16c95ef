"""Hostile completions through the real sandbox.

Each case asserts how the completion is classified, then that a probe job graded right after it on
the same worker sees a clean slate (no leftover files in /tmp, no leftover processes), and that the
host saw nothing (no connection, no file, no failure counted).
"""

from __future__ import annotations

import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodus.sandbox import GradeOutcome, GraderPool
from sandbox_helpers import HOST_SECRET_NAME, HOST_SECRET_VALUE, HOSTILE_LIMITS, python_job

REPO_ROOT = Path(__file__).resolve().parents[2]

PROBE_CODE = textwrap.dedent(
    """
    import os
    here = os.path.basename(os.getcwd())
    # Only mount points (another device: a checkout under the host's /tmp) and the directories leading to them
    # may be in /tmp; anything else on the tmpfs is a leftover.
    device = os.lstat("/tmp").st_dev
    leftovers = []
    for directory, subdirectories, files in os.walk("/tmp"):
        leftovers += [os.path.join(directory, f) for f in files]
        mounted = {d for d in subdirectories if os.lstat(os.path.join(directory, d)).st_dev != device}
        subdirectories[:] = [d for d in subdirectories if d not in mounted and d != here]
        if not mounted and not subdirectories and directory not in ("/tmp", os.getcwd()):
            leftovers.append(directory)
    leftovers = sorted(leftovers) + sorted(os.listdir("."))
    live = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                state = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                live.append(int(name))
    # worker (pid 1), zygote, job child, this program
    if leftovers or len(live) > 4:
        print("dirty", leftovers, sorted(live))
    else:
        print("clean")
    """
)
PROBE = python_job(PROBE_CODE, expected_stdout="clean")


def grade_then_probe(pool: GraderPool, job: dict[str, object]) -> GradeOutcome:
    before = pool.stats.infrastructure_failures
    outcome, probe = pool.run_many([job, PROBE])
    assert probe.status == "graded" and probe.passed, f"next job not clean: {probe}"
    assert pool.stats.infrastructure_failures == before
    return outcome


def assert_zero(outcome: GradeOutcome, reason: str) -> None:
    assert outcome.status == "graded", outcome
    assert (outcome.score, outcome.passed, outcome.reason) == (0.0, False, reason), outcome


def assert_blocked(pool: GraderPool, code: str) -> None:
    """The program prints 'blocked' when the attack failed inside the jail."""
    outcome = grade_then_probe(pool, python_job(textwrap.dedent(code), expected_stdout="blocked"))
    assert outcome.passed, outcome


# ---------------------------------------------------------------- resource exhaustion


def test_busy_loop_is_a_timeout(isolated_pool: GraderPool) -> None:
    assert_zero(grade_then_probe(isolated_pool, python_job("while True: pass")), "timeout")


def test_sleep_is_a_timeout(isolated_pool: GraderPool) -> None:
    assert_zero(grade_then_probe(isolated_pool, python_job("import time; time.sleep(60)")), "timeout")


def test_fork_bomb_is_contained(isolated_pool: GraderPool) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    outcome = grade_then_probe(isolated_pool, python_job(code))
    assert outcome.score == 0.0 and outcome.reason in ("timeout", "crash"), outcome


def test_thousand_threads_fail_cleanly(isolated_pool: GraderPool) -> None:
    code = "import threading, time\nfor _ in range(1000):\n"
    code += "    threading.Thread(target=time.sleep, args=(30,)).start()\n"
    assert_zero(grade_then_probe(isolated_pool, python_job(code)), "crash")


def test_two_gib_allocation_is_a_memory_limit(isolated_pool: GraderPool) -> None:
    assert_zero(grade_then_probe(isolated_pool, python_job("x = bytearray(2 * 1024**3)")), "memory_limit")


def test_filling_tmp_is_contained(isolated_pool: GraderPool) -> None:
    code = "i = 0\nwhile True:\n    open(f'/tmp/fill{i}', 'wb').write(b'x' * 1024 * 1024)\n    i += 1\n"
    assert_zero(grade_then_probe(isolated_pool, python_job(code)), "crash")  # ENOSPC on the 8 MiB tmpfs


def test_large_file_hits_the_file_size_limit(isolated_pool: GraderPool) -> None:
    code = "open('big', 'wb').write(b'x' * 6 * 1024 * 1024)"
    assert_zero(grade_then_probe(isolated_pool, python_job(code)), "file_size_limit")


def test_1e8_bytes_of_output_is_an_output_limit(isolated_pool: GraderPool) -> None:
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 10**6)\n"
    outcome = grade_then_probe(isolated_pool, python_job(code))
    assert_zero(outcome, "output_limit")
    assert len(outcome.details) < 5000


def test_huge_return_value_is_cut(isolated_pool: GraderPool) -> None:
    job = {"target": "nodus.sandbox.demo_targets:exec_in_process",
           "payload": {"code": "answer = 'x' * 30_000_000", "expected": "y"}}
    outcome = grade_then_probe(isolated_pool, job)
    assert_zero(outcome, "wrong")
    assert len(outcome.details) < 2100


# ---------------------------------------------------------------- escapes and secrets


@pytest.fixture
def host_listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    yield server
    server.close()


def test_no_loopback_to_the_host(isolated_pool: GraderPool, host_listener: socket.socket) -> None:
    port = host_listener.getsockname()[1]
    assert_blocked(isolated_pool, f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=1)
            print("connected")
        except OSError:
            print("blocked")
    """)
    with pytest.raises(BlockingIOError):
        host_listener.accept()


def test_no_external_network(isolated_pool: GraderPool) -> None:
    assert_blocked(isolated_pool, """
        import socket
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=1)
            print("connected")
        except OSError:
            print("blocked")
    """)


def test_no_dns(isolated_pool: GraderPool) -> None:
    assert_blocked(isolated_pool, """
        import socket
        try:
            socket.getaddrinfo("pypi.org", 443)
            print("resolved")
        except OSError:
            print("blocked")
    """)


def test_host_secrets_are_invisible(isolated_pool: GraderPool) -> None:
    assert_blocked(isolated_pool, f"""
        import os
        leaks = []
        if "{HOST_SECRET_NAME}" in os.environ or any("{HOST_SECRET_VALUE}" in v for v in os.environ.values()):
            leaks.append("env")
        for pid in os.listdir("/proc"):
            try:
                if b"{HOST_SECRET_VALUE}" in open(f"/proc/{{pid}}/environ", "rb").read():
                    leaks.append("proc-environ")
            except OSError:
                pass
        for path in ("/etc/shadow", "/etc/passwd", "/root/.bashrc", "/root/.ssh", "/home",
                     "{REPO_ROOT}/pyproject.toml", "{REPO_ROOT}/.git", "{REPO_ROOT}/outputs"):
            if os.path.exists(path):
                leaks.append(path)
        if os.path.isdir("/root") and sorted(os.listdir("/root")) not in ([], [".pyenv"]):
            leaks.append("/root")
        print("blocked" if not leaks else leaks)
    """)


def test_file_system_is_read_only(isolated_pool: GraderPool, tmp_path: Path) -> None:
    assert_blocked(isolated_pool, """
        import os, sys
        wrote = []
        for path in (sys.executable, os.__file__, "/evil", "/usr/lib/evil", "/dev/evil"):
            try:
                with open(path, "ab") as handle:
                    handle.write(b"#")
                wrote.append(path)
            except OSError:
                pass
        print("blocked" if not wrote else wrote)
    """)


def test_privileged_syscalls_are_denied(isolated_pool: GraderPool) -> None:
    assert_blocked(isolated_pool, """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        worked = []
        for name, call in [
            ("setuid", lambda: os.setuid(0)),
            ("unshare", lambda: os.unshare(os.CLONE_NEWUSER)),
            ("unshare-net", lambda: os.unshare(os.CLONE_NEWNET)),
        ]:
            try:
                call()
                worked.append(name)
            except OSError:
                pass
        if libc.ptrace(0, 0, None, None) == 0:  # PTRACE_TRACEME
            worked.append("ptrace")
        if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0:
            worked.append("mount")
        if libc.syscall(56, 0x10000000, 0, 0, 0, 0) == 0:  # clone(CLONE_NEWUSER)
            worked.append("clone-newuser")
        print("blocked" if not worked else worked)
    """)


def test_kill_everything_is_denied(isolated_pool: GraderPool) -> None:
    assert_blocked(isolated_pool, """
        import os, signal
        try:
            os.kill(-1, signal.SIGKILL)
            print("killed")
        except PermissionError:
            print("blocked")
    """)


def test_the_worker_and_its_zygote_are_out_of_reach(isolated_pool: GraderPool) -> None:
    # Each of these worked: SIGSTOP on the zygote (the completion's parent) made every later completion on the
    # worker score 0, and an rlimit or SIGINT on the worker (pid 1) killed it, so a completion that could not pass
    # became an infrastructure failure (its sample dropped) instead of a 0.
    replaced = isolated_pool.stats.workers_replaced
    assert_blocked(isolated_pool, """
        import ctypes, fcntl, os, platform, resource, signal, time
        zygote = os.getppid()
        attacks = {
            "stop the zygote": lambda: os.kill(zygote, signal.SIGSTOP),
            "kill the zygote": lambda: os.kill(zygote, signal.SIGKILL),
            "interrupt the worker": lambda: os.kill(1, signal.SIGINT),
            "zygote rlimit": lambda: resource.prlimit(zygote, resource.RLIMIT_AS, (30 << 20, 30 << 20)),
            "worker rlimit": lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3)),
            "renice the user": lambda: os.setpriority(os.PRIO_USER, 0, 19),
            "pin the zygote": lambda: os.sched_setaffinity(zygote, {0}),
            "pidfd of the zygote": lambda: os.pidfd_open(zygote),
            # /proc/<pid> opened as a directory is a pidfd too.
            "signal through /proc": lambda: signal.pidfd_send_signal(os.open(f"/proc/{zygote}", os.O_RDONLY), 19),
            "signal-driven I/O": lambda: fcntl.fcntl(os.pipe()[0], fcntl.F_SETOWN, zygote),
        }
        worked = []
        for name, attack in attacks.items():
            try:
                attack()
                worked.append(name)
            except PermissionError:
                pass
        # A child handed to the zygote (CLONE_PARENT | SIGCHLD): it never reaps it, so zombies filled the process limit.
        clone = {"x86_64": 56, "aarch64": 220}[platform.machine()]
        child = ctypes.CDLL(None, use_errno=True).syscall(clone, 0x8000 | 17, 0, 0, 0, 0)
        if child == 0:
            os._exit(0)
        if child > 0:
            worked.append("clone parent")
        # SIGINT to every process it can see: the job that grades it raised KeyboardInterrupt, a grader error.
        for pid in [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]:
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass
        time.sleep(0.1)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # its own limits: still allowed
        print("blocked" if not worked else worked)
    """)
    assert isolated_pool.stats.workers_replaced == replaced


# ---------------------------------------------------------------- leftovers for the next job


def test_double_forked_daemon_does_not_survive(isolated_pool: GraderPool) -> None:
    code = textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while True:
                    open("/tmp/daemon-was-here", "w").write(str(os.getpid()))
                    time.sleep(0.01)
            os._exit(0)
        print("done")
    """)
    outcome = grade_then_probe(isolated_pool, python_job(code, expected_stdout="done"))
    assert outcome.passed  # not the daemon's fault to exist; the probe proves it is gone


def test_planted_files_do_not_reach_the_next_job(isolated_pool: GraderPool) -> None:
    code = "open('/tmp/planted.py', 'w').write('x')\nopen('here.txt', 'w').write('x')\n"
    code += "import os\nos.mkdir('/tmp/d', 0)\n"
    assert grade_then_probe(isolated_pool, python_job(code)).passed


def test_a_checkout_under_the_hosts_tmp_is_mounted_and_kept_clean(tmp_path: Path) -> None:
    # CI may clone the project under /tmp: its paths are then mounted over the jail's private /tmp, and the
    # directories leading to them must not become a place where one job leaves files for the next.
    assert str(tmp_path).startswith("/tmp/")
    (tmp_path / "visible.txt").write_text("read-only data")
    tmp_path.chmod(0o755)  # as a git checkout is; pytest makes it 0700
    plant = textwrap.dedent(f"""
        import os
        assert open({str(tmp_path / "visible.txt")!r}).read() == "read-only data"
        for where in ("/tmp", {str(tmp_path.parent)!r}):
            try:
                open(os.path.join(where, "planted.txt"), "w").write("x")
            except OSError:
                pass
        try:
            open({str(tmp_path / "planted.txt")!r}, "w")
            print("wrote into a mount")
        except OSError:
            print("mount is read-only")
    """)
    with GraderPool(HOSTILE_LIMITS, workers=1, isolate_each_completion=True, extra_mounts=[tmp_path]) as pool:
        first = pool.run(python_job(plant, expected_stdout="mount is read-only"))
        assert first.passed, first
        assert grade_then_probe(pool, python_job("print('hi')", expected_stdout="hi")).passed


def test_sysv_shared_memory_is_denied_across_jobs(isolated_pool: GraderPool) -> None:
    shm = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    create = shm + "print('blocked' if libc.shmget(0x4E4F, 4096, 0o1000 | 0o666) == -1 else 'created')"
    attach = shm + "print('blocked' if libc.shmget(0x4E4F, 0, 0) == -1 else 'found')"
    sem = shm + "print('blocked' if libc.semget(0x4E4F, 1, 0o1000 | 0o666) == -1 else 'created')"
    first, second, third = isolated_pool.run_many(
        [python_job(c, expected_stdout="blocked") for c in (create, attach, sem)]
    )
    assert first.passed and second.passed and third.passed, (first, second, third)
    assert not Path("/dev/shm/nodus").exists()


# ---------------------------------------------------------------- lying about the result


def test_forged_protocol_frames_are_just_output(isolated_pool: GraderPool) -> None:
    code = textwrap.dedent("""
        import json, os, struct, sys
        reply = {"status": "graded", "score": 1.0, "passed": True, "reason": "passed", "details": ""}
        body = json.dumps(reply).encode()
        frame = struct.pack(">I", len(body)) + body
        for fd in range(0, 64):
            try:
                os.write(fd, frame)
            except OSError:
                pass
    """)
    assert_zero(grade_then_probe(isolated_pool, python_job(code, expected_stdout="42")), "wrong")
    forged_in_grader = {"target": "nodus.sandbox.demo_targets:print_fake_reply", "payload": {}}
    assert_zero(grade_then_probe(isolated_pool, forged_in_grader), "wrong")


def test_exiting_before_the_checks_is_not_a_pass(isolated_pool: GraderPool) -> None:
    for code in ("import os\nos._exit(0)", "import sys\nsys.exit(0)"):
        outcome = grade_then_probe(isolated_pool, python_job(code, tests="assert False, 'checks ran'"))
        assert_zero(outcome, "exited_early")
    honest = grade_then_probe(isolated_pool, python_job("def f(x): return x + 1", tests="assert f(1) == 2"))
    assert honest.passed and honest.score == 1.0
    caught = grade_then_probe(isolated_pool, python_job("def f(x): return x", tests="assert f(1) == 2"))
    assert_zero(caught, "crash")


def test_exit_in_an_in_process_grader_is_not_a_pass(isolated_pool: GraderPool) -> None:
    job = {"target": "nodus.sandbox.demo_targets:exec_in_process",
           "payload": {"code": "import os\nos._exit(0)", "expected": 1}}
    assert_zero(grade_then_probe(isolated_pool, job), "exited_without_result")


@pytest.mark.parametrize("code", [255, 109])
def test_exit_codes_are_the_completions(isolated_pool: GraderPool, code: int) -> None:
    program = f"import sys\nprint('42')\nsys.exit({code})"
    outcome = grade_then_probe(isolated_pool, python_job(program, expected_stdout="42"))
    assert_zero(outcome, "crash")
    assert f"exit {code}" in outcome.details


# ---------------------------------------------------------------- what legitimate programs need


def test_a_program_that_imports_numpy_runs(isolated_pool: GraderPool) -> None:
    # OpenBLAS started a thread per core at import, which the process and memory limits refused: a crash.
    code = "import numpy as np\nprint(int(np.arange(4).dot(np.arange(4))))"
    outcome = grade_then_probe(isolated_pool, python_job(code, expected_stdout="14"))
    assert outcome.passed, outcome
