from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from nodus.core.testing.strategies import completions, hostile_text, near_miss, tasks

from tests.testing import envs

ENV = envs.Parrot()

CONFORMANCE_TEST = """
from tests.testing import envs

def test_conforms(check_environment):
    assert check_environment(envs.Parrot(), examples=2).passed

def test_fails_with_table(check_environment):
    check_environment(envs.WrongReferenceParrot(), examples=2)
"""


def test_the_pytest_plugin_provides_check_environment(tmp_path: Path) -> None:
    # No -p flag: installing nodus registers the plugin through the pytest11 entry point, as authors get it.
    (tmp_path / "test_generated.py").write_text(CONFORMANCE_TEST)
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_generated.py")],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(root)}, timeout=120,
    )
    assert "1 failed, 1 passed" in result.stdout, result.stdout[-2000:]
    assert "FAIL reference_scores_1" in result.stdout


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_completions_strategy_feeds_graders_anything(data: st.DataObject) -> None:
    task = data.draw(tasks(ENV, count=4))
    completion = data.draw(completions(ENV, task))
    grade = ENV.grade(task, completion)
    assert 0.0 <= grade.score <= 1.0
    assert grade.passed == (completion.strip() == ENV.reference(task))


@settings(max_examples=40, deadline=None)
@given(text=hostile_text())
def test_hostile_text_is_a_string_without_lone_surrogates(text: str) -> None:
    text.encode("utf-8")  # raises on a lone surrogate, which no tokenizer emits


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_every_near_miss_differs_from_the_reference(data: st.DataObject) -> None:
    miss = data.draw(near_miss("answer 123456"))
    assert miss != "answer 123456"


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_completions_of_an_environment_without_mutations_leave_them_out(data: st.DataObject) -> None:
    # Environment.mutations only raises, saying to write one: the strategy must not call the inherited one.
    env = envs.PlainParrot()
    task = data.draw(tasks(env, count=2))
    assert isinstance(data.draw(completions(env, task)), str)
