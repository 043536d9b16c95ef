"""The hooks a nodus plugin implements. A plugin is a module listed under the entry-point group ``nodus``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from nodus.core.environment import Environment

PROJECT = "nodus"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def nodus_register_environments(register: Callable[[type[Environment]], None]) -> None:
    """Register the environments this plugin provides.

    :param register: call it once per environment class, e.g. ``register(GraphColoring)``. The class
        declares its own id (``namespace``, ``name``, ``version``); registering an id another plugin already
        registered is an error naming both distributions.
    """
