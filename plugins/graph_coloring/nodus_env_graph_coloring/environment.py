"""graph-coloring@1: color an undirected graph with k colors so that no edge joins two equal colors."""

from __future__ import annotations

import json
import random
import re
from typing import Any

from nodus.core import Environment, Grade, Task
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nodus_env_graph_coloring.answer import last_answer

# A vertex key is a plain ASCII decimal without leading zeros. str.isdigit() is not enough: it accepts '²' and
# '①', which int() refuses, and int() refuses digit strings over 4300 characters too; n is at most 40.
_VERTEX_KEY = re.compile(r"0|[1-9][0-9]{0,5}")


class GraphColoringParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    num_vertices: int = Field(10, ge=3, le=40, description="Vertices 0..n-1.")
    num_colors: int = Field(3, ge=2, le=8, description="Colors 1..k.")
    edge_probability: float = Field(
        0.6, ge=0.05, le=1.0, description="Chance of an edge between two vertices of different planted colors."
    )
    partial_credit: bool = Field(False, description="Score a well-formed answer by the fraction of edges it satisfies.")

    @model_validator(mode="after")
    def _colors_fit(self) -> GraphColoringParams:
        if self.num_colors > self.num_vertices:
            raise ValueError("num_colors must be at most num_vertices")
        return self


class GraphColoring(Environment):
    name = "graph-coloring"
    version = 1
    description = "Color a graph's vertices with k colors so that no edge joins two equal colors."
    Params = GraphColoringParams
    grading_params = frozenset({"partial_credit"})

    def generate(self, rng: random.Random) -> dict[str, Any]:
        # Planted coloring: balanced random color classes, then each cross-class pair is an edge with
        # probability p. Every task is solvable, and we never filter graphs by what a greedy pass can color
        # (that would bias the set towards easy instances).
        n, k = self.params.num_vertices, self.params.num_colors
        vertices = list(range(n))
        rng.shuffle(vertices)
        planted = [0] * n
        for position, vertex in enumerate(vertices):
            planted[vertex] = position % k + 1
        edges = [
            [u, v]
            for u in range(n)
            for v in range(u + 1, n)
            if planted[u] != planted[v] and rng.random() < self.params.edge_probability
        ]
        return {"num_vertices": n, "num_colors": k, "edges": edges, "planted": planted}

    def prompt_text(self, task: Task) -> str:
        data = task.data
        n, k = data["num_vertices"], data["num_colors"]
        edges = ", ".join(f"{u}-{v}" for u, v in data["edges"]) or "none"
        example = json.dumps({str(v): v % k + 1 for v in range(min(n, 2))})
        return (
            f"Color the vertices of this undirected graph with colors 1 to {k} so that no edge joins two "
            "vertices of the same color.\n"
            f"Vertices: {', '.join(str(v) for v in range(n))}\n"
            f"Edges: {edges}\n"
            f"Give every vertex exactly one color. Answer with a JSON object mapping each vertex to its color, "
            f"for example {example}, inside <answer></answer> tags."
        )

    def reference(self, task: Task) -> str:
        coloring = {str(v): color for v, color in enumerate(task.data["planted"])}
        return f"<answer>{json.dumps(coloring)}</answer>"

    def mutations(self, task: Task) -> list[str]:
        """Near-misses of the reference that must score below 1 (used by the conformance kit)."""
        planted = task.data["planted"]
        n, k = task.data["num_vertices"], task.data["num_colors"]

        def tagged(coloring: dict[str, Any]) -> str:
            return f"<answer>{json.dumps(coloring)}</answer>"

        base = {str(v): color for v, color in enumerate(planted)}
        wrong: list[str] = []
        if task.data["edges"]:  # give one endpoint of the first edge its neighbour's color
            u, v = task.data["edges"][0]
            wrong.append(tagged({**base, str(v): planted[u]}))
        wrong.append(tagged({**base, "0": k + 1}))  # a color out of range
        wrong.append(tagged({key: color for key, color in base.items() if key != str(n - 1)}))  # a missing vertex
        wrong.append(self.reference(task)[: -len("</answer>")] + ",</answer>")  # broken JSON
        return wrong

    def grade(self, task: Task, completion: str) -> Grade:
        data = task.data
        coloring, problem = parse_coloring(completion, data["num_vertices"], data["num_colors"])
        if coloring is None:
            return Grade(score=0.0, passed=False, details=problem)
        edges = data["edges"]
        unsatisfied = [(u, v) for u, v in edges if u not in coloring or v not in coloring or coloring[u] == coloring[v]]
        conflicts = [(u, v) for u, v in unsatisfied if u in coloring and v in coloring]
        if not problem and not unsatisfied:
            return Grade(score=1.0, passed=True, details="proper coloring: every edge joins two colors")
        if not problem:
            u, v = conflicts[0]
            problem = f"edge {u}-{v} joins two vertices of color {coloring[u]}"
            if len(conflicts) > 1:
                problem += f" ({len(conflicts)} conflicting edges)"
        score = 0.0
        if self.params.partial_credit:
            # Every vertex with a valid color and every edge joining two colors is one unit of credit; counting
            # vertices too keeps an answer with a bad vertex below 1 even when that vertex has no edges.
            n = data["num_vertices"]
            satisfied = len(edges) - len(unsatisfied) + len(coloring)
            score = min(satisfied / (len(edges) + n), 1.0 - 1.0 / (len(edges) + n))
        return Grade(score=score, passed=False, details=problem)


def parse_coloring(completion: str, n: int, k: int) -> tuple[dict[int, int] | None, str]:
    """The vertex->color map of the last answer, and the first problem found ('' if none).

    Returns ``None`` for the map when nothing usable was found; a map with a problem when the answer is
    well-formed JSON but incomplete or out of range (partial credit can still score it).
    """
    answer = last_answer(completion)
    if answer is None:
        return None, "unparseable: no <answer>...</answer> or ```json block with a JSON object found"
    duplicates: list[str] = []

    def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        duplicates.extend(key for key in set(keys) if keys.count(key) > 1)
        return dict(pairs)

    try:
        raw = json.loads(answer, object_pairs_hook=no_duplicate_keys)
    except (ValueError, RecursionError) as error:
        return None, f"unparseable: the answer is not valid JSON ({str(error)[:80]})"
    if not isinstance(raw, dict):
        return None, f"unparseable: the answer must be a JSON object, got {type(raw).__name__}"
    coloring: dict[int, int] = {}
    problems: list[str] = []
    if duplicates:
        problems.append(f"vertex {sorted(duplicates)[0]} has more than one color")
    for key, color in raw.items():
        if not (_VERTEX_KEY.fullmatch(key) and int(key) < n):
            problems.append(f"unknown vertex {key[:20]!r}: vertices are 0 to {n - 1}")
            continue
        if isinstance(color, bool) or not isinstance(color, int) or not 1 <= color <= k:
            problems.append(f"color {json.dumps(color)[:20]} of vertex {key} is not an integer from 1 to {k}")
            continue
        coloring[int(key)] = color
    missing = [v for v in range(n) if str(v) not in raw]
    if missing:
        problems.append(f"missing vertex {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    return coloring, problems[0] if problems else ""
