"""The plugin manager: finds installed environment plugins through the ``nodus`` entry-point group."""

from __future__ import annotations

import importlib.metadata
import os

import pluggy
from nodus.core import hookspecs
from nodus.core.errors import PluginLoadError

ENTRY_POINT_GROUP = "nodus"
DISABLE_AUTOLOAD_ENV = "NODUS_DISABLE_PLUGIN_AUTOLOAD"


def get_plugin_manager(
    autoload: bool | None = None, load_errors: list[PluginLoadError] | None = None
) -> pluggy.PluginManager:
    """A plugin manager with every installed plugin loaded.

    Autoloading is on unless ``NODUS_DISABLE_PLUGIN_AUTOLOAD`` is set to a non-empty value (or
    ``autoload=False``), so tests can register plugins in-process with ``pm.register(module)``.
    A plugin that fails to import raises :class:`PluginLoadError`, or is skipped and appended to
    ``load_errors`` when a list is given (so one broken plugin does not take the others down).
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if autoload is None:
        autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    if autoload:
        load_entry_points(pm, load_errors)
    pm.check_pending()
    return pm


def load_entry_points(pm: pluggy.PluginManager, load_errors: list[PluginLoadError] | None = None) -> None:
    """Import each plugin of the group; an import error names the distribution that caused it."""
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if pm.get_plugin(entry_point.name) is not None or pm.is_blocked(entry_point.name):
            continue
        dist = entry_point.dist.name if entry_point.dist is not None else entry_point.value
        try:
            plugin = entry_point.load()
        except Exception as error:
            wrapped = PluginLoadError(
                f"plugin {entry_point.name!r} from distribution {dist} failed to import "
                f"({type(error).__name__}: {error}); reinstall it or remove it with 'pip uninstall {dist}'"
            )
            if load_errors is None:
                raise wrapped from error
            load_errors.append(wrapped)
            continue
        pm.register(plugin, name=entry_point.name)


def distribution_of(plugin_name: str) -> str:
    """``name version`` of the distribution whose entry point registered ``plugin_name``."""
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=plugin_name):
        if entry_point.dist is not None:
            return f"{entry_point.dist.name} {entry_point.dist.version}"
    return f"{plugin_name} (registered in-process)"
