import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodus_env_graph_coloring import GraphColoring

ENV = GraphColoring()
TASKS = ENV.tasks("heldout", 42, 16)


def independent_check(num_vertices: int, num_colors: int, edges: list[list[int]], answer: dict[str, int]) -> bool:
    """A second, deliberately naive implementation of 'proper k-coloring' to check the grader against."""
    if sorted(answer) != sorted(str(v) for v in range(num_vertices)):
        return False
    colors = [answer[str(v)] for v in range(num_vertices)]
    if any(type(c) is not int or c < 1 or c > num_colors for c in colors):
        return False
    matrix = [[False] * num_vertices for _ in range(num_vertices)]
    for u, v in edges:
        matrix[u][v] = matrix[v][u] = True
    return all(not (matrix[u][v] and colors[u] == colors[v]) for u in range(num_vertices) for v in range(num_vertices))


@settings(max_examples=300, deadline=None)
@given(task_index=st.integers(0, len(TASKS) - 1), data=st.data())
def test_grader_agrees_with_independent_check_on_random_colorings(task_index: int, data: st.DataObject) -> None:
    task = TASKS[task_index]
    n, k = task.data["num_vertices"], task.data["num_colors"]
    # Mostly near-correct colorings (the planted one with a few changes), so both verdicts are common.
    colors = list(task.data["planted"])
    for vertex in data.draw(st.lists(st.integers(0, n - 1), max_size=3)):
        colors[vertex] = data.draw(st.integers(0, k + 1))
    answer = {str(v): c for v, c in enumerate(colors)}
    if data.draw(st.booleans()):
        answer.pop(str(data.draw(st.integers(0, n - 1))))
    grade = ENV.grade(task, f"Let me think.\n<answer>{json.dumps(answer)}</answer>")
    expected = independent_check(n, k, task.data["edges"], answer)
    assert grade.passed == expected
    assert grade.score == (1.0 if expected else 0.0)


@given(st.text())
def test_grader_never_raises_and_scores_in_range(text: str) -> None:
    grade = ENV.grade(TASKS[0], text)
    assert 0.0 <= grade.score <= 1.0
    assert grade.details


def test_reference_passes_on_every_heldout_task() -> None:
    for task in ENV.tasks("heldout", 42, 64):
        assert ENV.grade(task, ENV.reference(task)).score == 1.0


def answer_for(task, **changes: object) -> dict[str, object]:  # type: ignore[no-untyped-def]
    coloring: dict[str, object] = {str(v): c for v, c in enumerate(task.data["planted"])}
    coloring.update(changes)
    return coloring


def test_failure_reasons_are_specific() -> None:
    task = TASKS[0]
    u, v = task.data["edges"][0]
    planted = task.data["planted"]

    def tagged(**changes: object) -> str:
        return f"<answer>{json.dumps(answer_for(task, **changes))}</answer>"

    cases = {
        "no answer here": "unparseable: no <answer>...</answer> or ```json block with a JSON object found",
        "<answer>{0: 1}</answer>": "unparseable: the answer is not valid JSON",
        "<answer>[1, 2]</answer>": "unparseable: the answer must be a JSON object, got list",
        tagged(**{"3": 4}): "color 4 of vertex 3 is not an integer from 1 to 3",
        tagged(**{"3": "1"}): 'color "1" of vertex 3 is not an integer',
        tagged(**{"10": 1}): "unknown vertex '10': vertices are 0 to 9",
        tagged(**{str(v): planted[u]}): f"edge {u}-{v} joins two vertices of color {planted[u]}",
        '<answer>{"0": 1, "0": 2}</answer>': "vertex 0 has more than one color",
    }
    for completion, reason in cases.items():
        grade = ENV.grade(task, completion)
        assert grade.score == 0.0 and not grade.passed
        assert grade.details.startswith(reason), (completion, grade.details)
    missing = answer_for(task)
    del missing["4"]
    assert ENV.grade(task, f"<answer>{json.dumps(missing)}</answer>").details == "missing vertex 4"


def test_last_answer_wins_and_fenced_json_counts() -> None:
    task = TASKS[1]
    good = json.dumps(answer_for(task))
    bad = json.dumps({str(v): 1 for v in range(10)})
    assert ENV.grade(task, f"<answer>{bad}</answer> no wait <answer>{good}</answer>").passed
    assert not ENV.grade(task, f"<answer>{good}</answer> no wait <answer>{bad}</answer>").passed
    assert ENV.grade(task, f"Here:\n```json\n{good}\n```").passed
    assert not ENV.grade(task, f"<answer>{good}</answer>\n```json\n{bad}\n```").passed
    assert ENV.grade(task, good).passed  # a bare JSON object is an answer too


def test_partial_credit_scores_the_fraction_of_satisfied_edges() -> None:
    env = GraphColoring({"partial_credit": True})
    task = env.task("heldout", 42, 0)
    assert task == TASKS[0]  # a grading-only parameter keeps the tasks
    u, v = task.data["edges"][0]
    answer = answer_for(task, **{str(v): task.data["planted"][u]})
    edges = task.data["edges"]
    conflicts = sum(1 for a, b in edges if answer[str(a)] == answer[str(b)])
    grade = env.grade(task, f"<answer>{json.dumps(answer)}</answer>")
    assert not grade.passed
    assert grade.score == pytest.approx((len(edges) - conflicts + 10) / (len(edges) + 10))
    assert env.grade(task, "nothing").score == 0.0
    # A color out of range on a vertex no edge touches still keeps the score below 1.
    isolated = GraphColoring({"partial_credit": True, "num_vertices": 6, "edge_probability": 0.05})
    lonely_task = next(t for t in isolated.tasks("heldout", 1, 16) if len({v for e in t.data["edges"] for v in e}) < 6)
    lonely = next(v for v in range(6) if all(v not in e for e in lonely_task.data["edges"]))
    bad = {str(v): c for v, c in enumerate(lonely_task.data["planted"])} | {str(lonely): 9}
    assert isolated.grade(lonely_task, f"<answer>{json.dumps(bad)}</answer>").score < 1.0


@pytest.mark.parametrize("key", ["²", "①", "٣", "0" * 2, "1" * 5000])
def test_keys_that_only_look_like_vertices_are_unknown_vertices(key: str) -> None:
    # str.isdigit() holds for all of these but int() refuses the first three and the last; they once crashed
    # the grader (an infrastructure failure) instead of grading the answer.
    for env in (ENV, GraphColoring({"partial_credit": True})):
        answer = json.dumps({"0": 1, key: 1})
        grade = env.grade(TASKS[0], f"<answer>{answer}</answer>")
        assert not grade.passed and grade.score < 1.0
        assert grade.details == f"unknown vertex {key[:20]!r}: vertices are 0 to 9"
