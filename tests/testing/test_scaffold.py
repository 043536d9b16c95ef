from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from nodus.core.errors import NodusError
from nodus.core.plugins import get_plugin_manager
from nodus.core.registry import Registry
from nodus.core.scaffold import ScaffoldError, class_name, scaffold_environment
from nodus.core.testing import run_checks


def test_a_scaffolded_environment_installs_registers_and_passes_the_kit_and_its_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = scaffold_environment("word-sum", tmp_path)
    assert project == tmp_path / "word_sum"
    site = tmp_path / "site"
    # Install into a throwaway target, not the shared venv: a stray entry point pointing at a deleted tmp
    # directory would break every later plugin load.
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile",
         "--disable-pip-version-check", "--target", str(site),
         str(project)],
        check=True, capture_output=True, timeout=300,
    )
    (entry_point,) = [
        ep for dist in importlib.metadata.distributions(path=[str(site)]) for ep in dist.entry_points
        if ep.group == "nodus"
    ]
    assert (entry_point.name, entry_point.value) == ("word_sum", "nodus_env_word_sum")
    monkeypatch.syspath_prepend(str(site))
    try:
        pm = get_plugin_manager(autoload=False)
        pm.register(entry_point.load(), name=entry_point.name)
        env = Registry.from_plugin_manager(pm).resolve("word-sum@1").spec.make({"count": 3})
        report = run_checks(env, examples=4)
        assert report.passed, report.summary()
    finally:
        for module in [m for m in sys.modules if m.startswith("nodus_env_word_sum")]:
            del sys.modules[module]
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "tests")],
        capture_output=True, text=True, cwd=project, env={**os.environ, "PYTHONPATH": str(site)}, timeout=300,
    )
    assert "4 passed" in tests.stdout, tests.stdout[-2000:]


@pytest.mark.parametrize("name", ["Word_Sum", "a--b", "acme/word-sum", "word-sum@2", "", "-x"])
def test_names_outside_the_id_grammar_are_refused_in_one_line(tmp_path: Path, name: str) -> None:
    with pytest.raises(NodusError) as raised:
        scaffold_environment(name, tmp_path)
    assert "\n" not in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "word_sum").mkdir()
    (tmp_path / "word_sum" / "mine.txt").write_text("keep")
    with pytest.raises(ScaffoldError, match=r"word_sum already exists; choose another name or remove"):
        scaffold_environment("word-sum", tmp_path)
    assert (tmp_path / "word_sum" / "mine.txt").read_text() == "keep"


def test_class_names_are_identifiers() -> None:
    assert class_name("word-sum") == "WordSum"
    assert class_name("2048-game") == "Env2048Game"


def test_the_generated_tests_have_their_dependencies_and_reproduce(tmp_path: Path) -> None:
    project = scaffold_environment("word-sum", tmp_path)
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["test"] == ["pytest>=8", "hypothesis>=6.100"]
    assert "pip install -e '.[test]'" in (project / "README.md").read_text()
    test = (project / "tests" / "test_word_sum.py").read_text()
    assert test.startswith("# Needs the test extra of this distribution: pip install -e '.[test]'\n")
    assert "@settings(max_examples=25, derandomize=True, deadline=timedelta(seconds=wall_time_limit(ENV)))" in test


def test_the_generated_mutations_catch_a_grader_that_compares_absolute_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = scaffold_environment("abs-sum", tmp_path)
    environment = project / "nodus_env_abs_sum" / "environment.py"
    source = environment.read_text()
    exact = "if int(answers[-1]) != expected:"
    assert exact in source
    environment.write_text(source.replace(exact, "if abs(int(answers[-1])) != abs(expected):"))
    monkeypatch.syspath_prepend(str(project))  # importable here and in the kit's subprocesses
    try:
        from nodus_env_abs_sum import AbsSum  # type: ignore[import-not-found]

        report = run_checks(AbsSum(), examples=2)
    finally:
        for module in [m for m in sys.modules if m.startswith("nodus_env_abs_sum")]:
            del sys.modules[module]
    assert [row.name for row in report.failures] == ["mutations_score_below_1"]
    counterexample = report.row("mutations_score_below_1").counterexample or ""
    assert ", mutation 3 '<answer>" in counterexample and counterexample.endswith(": scored 1.0: the sum is right")
