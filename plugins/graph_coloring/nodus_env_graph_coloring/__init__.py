"""nodus plugin providing graph-coloring@1."""

from nodus.core import hookimpl

from nodus_env_graph_coloring.environment import GraphColoring

__all__ = ["GraphColoring", "nodus_register_environments"]


@hookimpl
def nodus_register_environments(register):  # type: ignore[no-untyped-def]
    register(GraphColoring)
