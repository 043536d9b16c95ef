import hashlib
import json

import pytest
from nodus.core.errors import InvalidParameters
from nodus_env_graph_coloring import GraphColoring

# sha256 of the first 8 tasks of each split for seed 42 with default parameters. If this fails, what
# graph-coloring@1 generates has changed: put the new behaviour in graph-coloring@2 and restore @1.
GOLDEN = {
    "train": "9354b5fad652476c8af1a8ebb13c0373013c743ffa93acd87109c8f1bb2c2bc8",
    "heldout": "1d35515172ea42151da31c56ecd73b70b734d6973ab84498ecffb17970bba87a",
}


def digest(split: str) -> str:
    env = GraphColoring()
    tasks = [[t.id, env.prompt_text(t), t.data] for t in env.tasks(split, 42, 8)]  # type: ignore[arg-type]
    return hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_golden_tasks_for_seed_42(split: str) -> None:
    assert digest(split) == GOLDEN[split]


def test_planted_coloring_is_proper_and_balanced() -> None:
    for task in GraphColoring({"num_vertices": 12, "num_colors": 4}).tasks("train", 1, 50):
        planted = task.data["planted"]
        assert all(planted[u] != planted[v] for u, v in task.data["edges"])
        assert sorted(planted.count(c) for c in range(1, 5)) == [3, 3, 3, 3]


def greedy_colors_in_order(n: int, k: int, edges: list[list[int]]) -> bool:
    neighbours: list[set[int]] = [set() for _ in range(n)]
    for u, v in edges:
        neighbours[u].add(v)
        neighbours[v].add(u)
    colors: dict[int, int] = {}
    for vertex in range(n):
        free = [c for c in range(1, k + 1) if c not in {colors.get(w) for w in neighbours[vertex]}]
        if not free:
            return False
        colors[vertex] = free[0]
    return True


def test_tasks_are_not_biased_towards_greedy_colorable_graphs() -> None:
    # Planting keeps instances a first-fit greedy pass fails on: a generator that filtered by greedy (the
    # usual trap) would give 0 here.
    tasks = GraphColoring().tasks("heldout", 42, 64)
    greedy_fails = sum(not greedy_colors_in_order(10, 3, t.data["edges"]) for t in tasks)
    assert greedy_fails >= 16  # 35 of 64 when this test was written


def test_bounds_are_enforced() -> None:
    with pytest.raises(InvalidParameters, match="num_vertices=2 .* greater than or equal to 3"):
        GraphColoring({"num_vertices": 2})
    with pytest.raises(InvalidParameters, match="num_colors must be at most num_vertices"):
        GraphColoring({"num_vertices": 4, "num_colors": 5})
