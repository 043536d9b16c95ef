from nodus.core.testing import assert_conforms
from nodus_env_graph_coloring import GraphColoring


def test_graph_coloring_passes_the_conformance_kit() -> None:
    report = assert_conforms(GraphColoring(), examples=8)
    assert report.row("mutations_score_below_1").examples >= 8 * 3


def test_partial_credit_variant_passes_too() -> None:
    assert_conforms(GraphColoring({"partial_credit": True, "num_vertices": 6}), examples=4)
