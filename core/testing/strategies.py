"""Hypothesis strategies for testing graders: tasks, hostile text and near-misses of the reference.

Needs ``hypothesis`` (a test dependency of nodus). Typical use in an environment's tests::

    @given(data=st.data())
    def test_grader_total(data):
        task = data.draw(tasks(ENV))
        grade = ENV.grade(task, data.draw(completions(ENV, task)))
        assert 0.0 <= grade.score <= 1.0
"""

from __future__ import annotations

import random

from hypothesis import strategies as st
from nodus.core.environment import Environment, Split, Task
from nodus.core.testing.completions import HOSTILE, change_one_char, near_misses
from nodus.core.testing.probes import has_mutations


def tasks(env: Environment, split: Split = "heldout", seed: int = 42, count: int = 16) -> st.SearchStrategy[Task]:
    """One of the first ``count`` tasks of ``split`` (generated once, when the strategy is built)."""
    return st.sampled_from(env.tasks(split, seed, count))


def hostile_text() -> st.SearchStrategy[str]:
    """Arbitrary text, the fixed hostile corpus, text with NUL bytes, and decoded random bytes."""
    return st.one_of(
        st.text(),
        st.sampled_from([text for _, text in HOSTILE]),
        st.text(alphabet=st.sampled_from("\x00\n{}[]<>0123456789 .-/\\#")),
        st.binary(max_size=200).map(lambda raw: raw.decode("utf-8", errors="replace")),
    )


def near_miss(reference: str) -> st.SearchStrategy[str]:
    """The reference with one seeded small break (a changed digit, a cut, a NUL...)."""

    def broken(seed: int) -> str:
        rng = random.Random(seed)
        options = [text for _, text in near_misses(reference, rng)]
        if reference:
            options.append(change_one_char(reference, rng))
        return rng.choice(options)

    return st.integers(0, 2**32 - 1).map(broken)


def completions(env: Environment, task: Task) -> st.SearchStrategy[str]:
    """Anything a model might answer to ``task``: the reference, its mutations, near-misses, hostile text."""
    reference = env.reference(task)
    choices: list[st.SearchStrategy[str]] = [st.just(reference), near_miss(reference), hostile_text()]
    if has_mutations(env):
        mutations = env.mutations(task)
        if mutations:
            choices.append(st.sampled_from(mutations))
    return st.one_of(choices)
